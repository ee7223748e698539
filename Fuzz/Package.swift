// swift-tools-version: 6.0
// libFuzzer targets for Vigil's parsers of outside input. A package of its
// own: built only by Scripts/fuzz with `--sanitize fuzzer --sanitize address`
// (each target defines LLVMFuzzerTestOneInput and libFuzzer supplies main),
// never by a plain `swift build` of the product. docs/sanitizers-and-fuzzing.md.
import Foundation
import PackageDescription

// A path dependency is known by its folder's name, which is the clone's.
let vigil = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

func fuzzer(_ name: String, _ dependencies: [Target.Dependency]) -> Target {
    .executableTarget(
        name: name,
        dependencies: dependencies,
        path: "Sources/\(name)",
        swiftSettings: [
            .enableUpcomingFeature("ExistentialAny"),
            // No top-level code: libFuzzer's main calls LLVMFuzzerTestOneInput.
            .unsafeFlags(["-parse-as-library"]),
        ])
}

let host = Target.Dependency.product(name: "VigilHostModules", package: vigil)
let kit = Target.Dependency.product(name: "VigilKit", package: "VigilKit")

let package = Package(
    name: "VigilFuzz",
    dependencies: [
        .package(path: ".."),
        .package(path: "../Plugins/VigilKit"),
    ],
    targets: [
        fuzzer("fuzz-config", [host, kit,
                               .product(name: "vigil-background-task", package: vigil),
                               .product(name: "vigil-periodic-wake", package: vigil),
                               .product(name: "vigil-voip-socket", package: vigil),
                               .product(name: "vigil-download-session", package: vigil)]),
        fuzzer("fuzz-dbus-message", [host]),
        // The object server's routing, with vigild's API behind it on a private bus.
        fuzzer("fuzz-object-server", [host, kit,
                                      .product(name: "vigil-background-task", package: vigil),
                                      .product(name: "vigil-periodic-wake", package: vigil)]),
        // Feeds a byte stream to voip-socket's framers in reads (fuzz-mqtt, fuzz-sip).
        .target(name: "VoipFeed", dependencies: [.product(name: "vigil-voip-socket", package: vigil)], path: "Sources/VoipFeed"),
        fuzzer("fuzz-mqtt", [.product(name: "vigil-voip-socket", package: vigil), "VoipFeed"]),
        fuzzer("fuzz-sip", [.product(name: "vigil-voip-socket", package: vigil), "VoipFeed"]),
        // raw framing, checked byte-exact: data plus the pong give back the stream.
        fuzzer("fuzz-raw", [.product(name: "vigil-voip-socket", package: vigil)]),
        fuzzer("fuzz-http", [.product(name: "vigil-download-session", package: vigil)]),
        fuzzer("fuzz-survival", [host, kit]),
    ],
    swiftLanguageModes: [.v6]
)
