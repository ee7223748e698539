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
//
// The SDK's test kit, VigilKitTesting, is the package in VigilKitTesting/
// beside this file: it depends on this package's VigilKit product.
import PackageDescription

let package = Package(
    name: "VigilKit",
    products: [
        // VigilAPI (the org.vigil.Vigil1 contract, its rows and BusValue; no
        // D-Bus library) is in the same shared library: VigilKit re-exports
        // it, and VigilDBus and vigilctl import it alone.
        .library(name: "VigilKit", type: .dynamic, targets: ["VigilKit", "VigilAPI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
    ],
    targets: [
        .target(name: "VigilAPI", path: "Sources/VigilAPI"),
        .target(name: "VigilKit", dependencies: ["VigilAPI", .product(name: "Logging", package: "swift-log"), "CVigilKitSanitizer"], path: "Sources/VigilKit"),
        // ThreadSanitizer's annotations for Lock (Sources/VigilKit/Lock.swift).
        .target(name: "CVigilKitSanitizer", path: "Sources/CVigilKitSanitizer"),
        .testTarget(name: "VigilKitTests", dependencies: ["VigilKit"], path: "Tests/VigilKitTests"),
    ],
    swiftLanguageModes: [.v6]
)
