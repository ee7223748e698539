// swift-tools-version: 6.0
// The VigilKit SDK is its own package so that it is linked exactly once, as a
// shared library, into the host and every plugin. A plain target of the root
// package would be linked statically into each image, and `as?` casts across
// the dlopen boundary would fail (two copies of every type's metadata).
import PackageDescription

let package = Package(
    name: "VigilKit",
    products: [
        .library(name: "VigilKit", type: .dynamic, targets: ["VigilKit"]),
    ],
    targets: [
        .target(name: "VigilKit", path: "Sources/VigilKit"),
        .testTarget(name: "VigilKitTests", dependencies: ["VigilKit"], path: "Tests/VigilKitTests"),
    ],
    swiftLanguageModes: [.v6]
)
