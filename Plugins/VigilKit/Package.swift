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
//
// swift-service-lifecycle (vigild is a ServiceGroup of services) depends on
// swift-log, so it is linked here too, for the same reason: a host target
// that depended on it directly would link a second copy of Logging into
// vigild. VigilKit itself does not import it (a plugin built against the
// installed SDK needs no ServiceLifecycle module); the host imports the
// module and finds its code in libVigilKit.so.
import PackageDescription

let package = Package(
    name: "VigilKit",
    products: [
        // VigilAPI (the org.vigil.Vigil1 contract, its rows and BusValue; no
        // D-Bus library) is in the same shared library: VigilKit re-exports
        // it, and VigilDBus and vigilctl import it alone.
        // CVigilLoop is the host's event loop and global executor: in this one
        // shared library so that the host and every plugin wait on the same
        // loop (VigilKit's EventLoop wraps it).
        .library(name: "VigilKit", type: .dynamic, targets: ["VigilKit", "VigilAPI", "CVigilLoop"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .target(name: "VigilAPI", path: "Sources/VigilAPI"),
        .target(
            name: "VigilKit",
            dependencies: [
                "VigilAPI",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                "CVigilKitSanitizer",
                "CVigilLoop",
            ],
            path: "Sources/VigilKit"
        ),
        // ThreadSanitizer's annotations for Lock (Sources/VigilKit/Lock.swift).
        .target(name: "CVigilKitSanitizer", path: "Sources/CVigilKitSanitizer"),
        // One epoll for descriptors, timers and jobs (EventLoop.swift).
        .target(name: "CVigilLoop", path: "Sources/CVigilLoop"),
        .testTarget(name: "VigilKitTests", dependencies: ["VigilKit"], path: "Tests/VigilKitTests"),
    ],
    swiftLanguageModes: [.v6]
)
