// swift-tools-version: 6.0
// A third-party Vigil strategy, built out of tree against the VigilKit SDK.
// In your own project, depend on VigilKit from where you have it, e.g.
//   .package(path: "/usr/src/vigil/Plugins/VigilKit")
// It must be the same VigilKit and Swift toolchain the host was built with.
import PackageDescription

let package = Package(
    name: "HelloStrategy",
    products: [
        // The product name gives the file name: libvigil-hello.so provides kind "hello".
        .library(name: "vigil-hello", type: .dynamic, targets: ["HelloStrategy"]),
    ],
    dependencies: [
        .package(path: "../../../Plugins/VigilKit"),
        // The SDK's test kit, for the tests only.
        .package(path: "../../../Plugins/VigilKit/VigilKitTesting"),
    ],
    targets: [
        .target(name: "HelloStrategy", dependencies: [.product(name: "VigilKit", package: "VigilKit")]),
        // The strategy run without a host, on the SDK's test kit: a manual
        // clock, a clock-driven scheduler, waitable logs (`swift test`).
        .testTarget(name: "HelloStrategyTests", dependencies: [
            "HelloStrategy",
            .product(name: "VigilKit", package: "VigilKit"),
            .product(name: "VigilKitTesting", package: "VigilKitTesting"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)
