// swift-tools-version: 6.0
// A plugin that claims a different VigilKit SDK version: the host must refuse
// it before touching any Swift type. It writes the C-layout header by hand,
// as a plugin built against a future SDK would.
import PackageDescription

let package = Package(
    name: "MismatchPlugin",
    products: [.library(name: "vigil-mismatch", type: .dynamic, targets: ["MismatchPlugin"])],
    targets: [.target(name: "MismatchPlugin")],
    swiftLanguageModes: [.v6]
)
