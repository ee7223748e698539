import Foundation
import VigilKit

/// Why a strategy kind could not be loaded. The message names the file.
public struct PluginLoadError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Hashable, Sendable {
        case invalidKindName, notFound, dlopenFailed, symbolMissing, badHeader, sdkMismatch, kindMissing, kindConflict
    }
    public var code: Code
    public var message: String
    public var description: String { message }
}

/// Finds, loads and registers strategy plugins.
///
/// A kind `foo-bar` lives in `libvigil-foo-bar.so`, found on the search path.
/// Only kinds the config names are ever loaded. Loading checks, in order and
/// before touching any Swift type: the library opens (`RTLD_NOW |
/// RTLD_LOCAL`), exports `vigil_plugin_v1`, returns a header with Vigil's
/// magic, and was built against this host's SDK version. Libraries are never
/// unloaded: their types stay in use for the life of the process.
public final class PluginLoader: Sendable {
    // dlopen/dlsym are thread-safe.
    private struct Registered {
        var loaded: [String: (kind: any StrategyKind, file: String)] = [:]
        var libraries: Set<String> = []

        mutating func register(_ kinds: [any StrategyKind], file: String) throws(PluginLoadError) {
            for k in kinds {
                if let other = loaded[k.name], other.file != file {
                    throw PluginLoadError(code: .kindConflict, message: "two plugins claim kind \"\(k.name)\": \(other.file) and \(file)")
                }
            }
            for k in kinds { loaded[k.name] = (k, file) }
        }
    }
    private let registered = Lock(Registered())

    /// Directories searched, first match wins.
    public let searchPath: [String]

    public init(searchPath: [String]) {
        var seen = Set<String>()
        self.searchPath = searchPath.filter { !$0.isEmpty && seen.insert($0).inserted }
    }

    /// The search path: `$VIGIL_PLUGIN_PATH` (colon-separated), then the
    /// config's `plugin_path`, then the directory of the running executable
    /// (the build directory during development), then the install
    /// directories `/usr/local/lib/vigil/plugins` and `/usr/lib/vigil/plugins`.
    public static func defaultSearchPath(
        configured: [String], environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> [String] {
        var path: [String] = []
        if let env = environment["VIGIL_PLUGIN_PATH"] {
            path += env.split(separator: ":").map(String.init)
        }
        path += configured
        if let exe = executableDirectory() { path.append(exe) }
        path += ["/usr/local/lib/vigil/plugins", "/usr/lib/vigil/plugins"]
        return path
    }

    /// The directory of the running executable (the build directory during
    /// development), from `/proc/self/exe`.
    public static func executableDirectory() -> String? {
        guard let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") else { return nil }
        return (exe as NSString).deletingLastPathComponent
    }

    /// The library file name for a kind.
    public static func libraryName(for kind: String) -> String { "libvigil-\(kind).so" }

    /// Kinds whose libraries are on the search path, without loading any.
    public func availableKinds() -> [String] {
        var kinds = Set<String>()
        for dir in searchPath {
            guard let files = try? FileManager.default.contentsOfDirectory(atPath: dir) else { continue }
            for f in files where f.hasPrefix("libvigil-") && f.hasSuffix(".so") {
                kinds.insert(String(f.dropFirst("libvigil-".count).dropLast(".so".count)))
            }
        }
        registered.withLock { kinds.formUnion($0.loaded.keys) }
        return kinds.sorted()
    }

    /// Kinds registered so far, with the file that provided each.
    public var registeredKinds: [String: String] {
        registered.withLock { $0.loaded.mapValues(\.file) }
    }

    /// Registers kinds without a library (built into the host, or tests).
    public func register(_ kinds: [any StrategyKind], from source: String) throws(PluginLoadError) {
        try registered.withLock { (registered: inout sending Registered) throws(PluginLoadError) in
            try registered.register(kinds, file: source)
        }
    }

    /// The kind, loading its plugin if needed.
    public func loadKind(_ kind: String) -> Result<any StrategyKind, PluginLoadError> {
        if let hit = registered.withLock({ $0.loaded[kind]?.kind }) { return .success(hit) }
        guard !kind.isEmpty, kind.allSatisfy({ $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "-") }) else {
            return .failure(PluginLoadError(code: .invalidKindName, message: "kind \"\(kind)\" is not a valid kind name (lowercase letters, digits and '-')"))
        }
        let name = Self.libraryName(for: kind)
        guard let file = searchPath.map({ ($0 as NSString).appendingPathComponent(name) })
            .first(where: { FileManager.default.fileExists(atPath: $0) })
        else {
            return .failure(PluginLoadError(code: .notFound, message: "no plugin for kind \"\(kind)\": \(name) is not in any of \(searchPath.joined(separator: ", "))"))
        }
        do {
            try load(file: file, expecting: kind)
        } catch {
            return .failure(error)
        }
        if let hit = registered.withLock({ $0.loaded[kind]?.kind }) { return .success(hit) }
        return .failure(PluginLoadError(code: .kindMissing, message: "\(file) loaded, but it does not provide kind \"\(kind)\""))
    }

    /// Loads one library and registers every kind it provides.
    public func load(file: String, expecting kind: String? = nil) throws(PluginLoadError) {
        if registered.withLock({ $0.libraries.contains(file) }) { return }
        guard let handle = dlopen(file, RTLD_NOW | RTLD_LOCAL) else {
            let why = dlerror().map { String(cString: $0) } ?? "unknown error"
            throw PluginLoadError(code: .dlopenFailed, message: "cannot load plugin \(file): \(why)")
        }
        guard let symbol = dlsym(handle, "vigil_plugin_v1") else {
            throw PluginLoadError(code: .symbolMissing, message: "\(file) is not a Vigil plugin: it does not export the entry point vigil_plugin_v1")
        }
        typealias Entry = @convention(c) () -> UnsafeMutableRawPointer?
        let entry = unsafeBitCast(symbol, to: Entry.self)
        guard let header = entry() else {
            throw PluginLoadError(code: .badHeader, message: "\(file): vigil_plugin_v1 returned NULL")
        }
        // Check the C-layout header before touching any Swift type.
        let magic = header.load(as: UInt32.self)
        let version = header.load(fromByteOffset: 4, as: UInt32.self)
        guard magic == VigilSDK.headerMagic else {
            throw PluginLoadError(code: .badHeader, message: "\(file): vigil_plugin_v1 returned a header without Vigil's magic number (0x\(String(magic, radix: 16)))")
        }
        guard version == VigilSDK.version else {
            throw PluginLoadError(code: .sdkMismatch, message: "\(file) was built against VigilKit SDK version \(version), but this host uses version \(VigilSDK.version); rebuild the plugin against this host's VigilKit with the same Swift toolchain")
        }
        let manifestPointer = header.load(fromByteOffset: 8, as: UnsafeMutableRawPointer.self)
        header.deallocate()
        let manifest = Unmanaged<PluginManifest>.fromOpaque(manifestPointer).takeRetainedValue()
        let kinds = manifest.kinds
        try registered.withLock { (registered: inout sending Registered) throws(PluginLoadError) in
            try registered.register(kinds, file: file)
            registered.libraries.insert(file)
        }
    }
}
