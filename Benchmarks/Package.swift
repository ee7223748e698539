// swift-tools-version: 6.0
// vigil-bench and what only it needs (the C lease floor): a package of its
// own, built on demand (Scripts/bench, or `swift build --package-path
// Benchmarks`), never by a plain `swift build` of the product. It measures
// the root package's vigild and plugins, built with the same configuration
// (Scripts/bench builds both; Benchmarks/README.md).
import Foundation
import PackageDescription

// A path dependency is known by its folder's name, which is the clone's.
let vigil = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "VigilBenchmarks",
    products: [
        .executable(name: "vigil-bench", targets: ["vigil-bench"]),
    ],
    dependencies: [
        .package(path: ".."),
        .package(path: "../Plugins/VigilKit"),
    ],
    targets: [
        // background-task's floor for BeginBackgroundTask+End: the API's
        // messages from a minimal C server on libdbus (its headers and
        // library come with the host's modules, through CDBus).
        .target(name: "CLeaseFloor", dependencies: [.product(name: "VigilHostModules", package: vigil)], path: "Sources/CLeaseFloor"),
        .executableTarget(
            name: "vigil-bench",
            dependencies: [
                .product(name: "VigilHostModules", package: vigil),
                .product(name: "VigilBenchmarkModules", package: vigil),
                .product(name: "VigilKit", package: "VigilKit"),
                "CLeaseFloor",
            ],
            path: "Sources/vigil-bench",
            swiftSettings: [.enableUpcomingFeature("ExistentialAny")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
