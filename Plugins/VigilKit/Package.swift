// swift-tools-version: 6.0
// The VigilKit SDK is its own package so that it is linked exactly once, as a
// shared library, into the host and every plugin. A plain target of the root
// package would be linked statically into each image, and `as?` casts across
// the dlopen boundary would fail (two copies of every type's metadata).
//
// swift-log's Logging module is linked into libVigilKit.so and nowhere else:
// VigilKit re-exports it (`@_exported import Logging`), and neither the host
// nor any plugin depends on swift-log directly, so there is one copy of
// Logger's type metadata and of LoggingSystem's globals in a process
// (Scripts/check-single-logging checks the built images).
import PackageDescription

let package = Package(
    name: "VigilKit",
    products: [
        .library(name: "VigilKit", type: .dynamic, targets: ["VigilKit"]),
        // The test kit for strategy authors (and the host's own tests): a
        // manual clock, a clock-driven wake timer, one process runner and
        // one waitable log (docs/writing-a-strategy.md, "Test it"). Static:
        // it links into each test binary, over the one libVigilKit.so.
        .library(name: "VigilKitTesting", targets: ["VigilKitTesting"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
    ],
    targets: [
        .target(name: "VigilKit", dependencies: [.product(name: "Logging", package: "swift-log"), "CVigilKitSanitizer"], path: "Sources/VigilKit"),
        // ThreadSanitizer's annotations for Lock (Sources/VigilKit/Lock.swift).
        .target(name: "CVigilKitSanitizer", path: "Sources/CVigilKitSanitizer"),
        .target(name: "VigilKitTesting", dependencies: ["VigilKit"], path: "Sources/VigilKitTesting"),
        .testTarget(name: "VigilKitTests", dependencies: ["VigilKit", "VigilKitTesting"], path: "Tests/VigilKitTests"),
    ],
    swiftLanguageModes: [.v6]
)
