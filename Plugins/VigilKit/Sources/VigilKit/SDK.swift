// The API contract (VigilAPI: interfaces, rows, BusValue, LeaseID) is part
// of what a plugin sees: `import VigilKit` brings it.
@_exported import VigilAPI

/// The VigilKit SDK: what a keep-alive strategy plugin sees of the Vigil host.
///
/// A plugin is a dynamic library named `libvigil-<kind>.so` that exports the C
/// symbol `vigil_plugin_v1`. The host calls it, checks the SDK version in the
/// returned header *before* touching any Swift type, and then registers the
/// ``StrategyKind``s the plugin provides:
///
/// ```swift
/// @_cdecl("vigil_plugin_v1")
/// public func vigilPluginV1() -> UnsafeMutableRawPointer {
///     VigilPlugin.export([HelloKind()])
/// }
/// ```
public enum VigilSDK {
    /// The SDK version a plugin was compiled against.
    ///
    /// Emitted into the client, so a plugin carries the version of the SDK it
    /// was *built* with, not the version of the `libVigilKit.so` it happens to
    /// be loaded next to. Bump it on every change to a public type's layout or
    /// a protocol's requirements.
    @_alwaysEmitIntoClient
    public static var version: UInt32 { 5 }

    /// First four bytes of a plugin header: "VIGL" little-endian.
    @_alwaysEmitIntoClient
    public static var headerMagic: UInt32 { 0x4C47_4956 }
}

/// The list of strategy kinds a plugin provides.
public final class PluginManifest: Sendable {
    public let kinds: [any StrategyKind]

    public init(kinds: [any StrategyKind]) {
        self.kinds = kinds
    }
}

/// Builds the value a plugin's `vigil_plugin_v1` entry point returns.
///
/// The header has a C layout so that the host can check it without Swift
/// types: `struct { uint32_t magic; uint32_t sdk_version; void *manifest; }`,
/// where `manifest` is a retained `PluginManifest`. The host takes ownership.
public enum VigilPlugin {
    @_alwaysEmitIntoClient
    public static func export(_ kinds: [any StrategyKind]) -> UnsafeMutableRawPointer {
        let header = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
        header.storeBytes(of: VigilSDK.headerMagic, as: UInt32.self)
        header.storeBytes(of: VigilSDK.version, toByteOffset: 4, as: UInt32.self)
        let manifest = Unmanaged.passRetained(PluginManifest(kinds: kinds)).toOpaque()
        header.storeBytes(of: manifest, toByteOffset: 8, as: UnsafeMutableRawPointer.self)
        return header
    }
}
