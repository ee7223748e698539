// swift-tools-version: 6.0
// A strategy that binds the contract's DownloadSession.Cancel with a handler
// whose argument is a String, not the declared object path: with
// -DWRONG_HANDLER it must not compile (PluginEndToEndTests); without, the
// same file with the declared type builds, so the failure is the type's.
import PackageDescription

let package = Package(
    name: "WrongHandler",
    dependencies: [.package(path: "../../../Plugins/VigilKit")],
    targets: [.target(name: "WrongHandler", dependencies: [.product(name: "VigilKit", package: "VigilKit")])],
    swiftLanguageModes: [.v6]
)
