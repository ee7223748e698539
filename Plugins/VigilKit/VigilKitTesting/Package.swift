// swift-tools-version: 6.0
// VigilKitTesting: the SDK's test kit for strategy authors and the host's
// own tests (docs/writing-a-strategy.md, "Test it"): a manual clock, a
// clock-driven wake timer and scheduler, recording leases and hooks, one
// process runner and one waitable log. It ships with the SDK (beside it in
// this folder; in the Debian package as a module and a static archive).
//
// A package of its own, nested in the SDK's folder, for the same reason the
// SDK is one: it depends on VigilKit's *product*, so everything that links
// the test kit gets VigilKit (and swift-log's Logging) from the one
// libVigilKit.so. A target of the VigilKit package would depend on the
// VigilKit target instead, and each image linking it would carry a second,
// static copy of VigilKit's types (Scripts/check-single-logging sees it).
import PackageDescription

let package = Package(
    name: "VigilKitTesting",
    products: [
        .library(name: "VigilKitTesting", targets: ["VigilKitTesting"]),
    ],
    dependencies: [
        .package(path: ".."),
    ],
    targets: [
        .target(
            name: "VigilKitTesting",
            dependencies: [.product(name: "VigilKit", package: "VigilKit")],
            path: "Sources/VigilKitTesting",
            swiftSettings: [.enableUpcomingFeature("ExistentialAny")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
