// The config loader and validator (Sources/VigilHost/Config): TOML text to
// settings, through the built-in strategies' own validation. Any text must
// end in a config or in problems, never in a crash or a hang.
import BackgroundTask
import DownloadSession
import PeriodicWake
import VigilHost
import VigilKit
import VoipSocket

/// The built-in kinds (silent-audio aside: it would load libpulse), from memory.
struct BuiltInKinds: KindResolver {
    let kinds: [any StrategyKind] = [BackgroundTaskKind(), PeriodicWakeKind(), VoipSocketKind(), DownloadSessionKind()]

    func availableKinds() -> [String] { kinds.map(\.name) }

    func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError> {
        guard let found = kinds.first(where: { $0.name == kind }) else { return .failure(KindResolutionError("no such kind")) }
        return .success(found)
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfig(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    let text = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    let document: ConfigDocument
    do {
        document = try ConfigLoader.parseDocument(text: text, path: "/etc/vigil/vigil.toml")
    } catch {
        _ = error.description
        return 0
    }
    switch ConfigLoader.validate(document, resolver: BuiltInKinds()) {
    case let .success(config): _ = config.strategies.count
    case let .failure(error): _ = error.description
    }
    return 0
}
