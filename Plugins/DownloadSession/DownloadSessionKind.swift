import Foundation
import VigilKit

/// `download-session`: background downloads that continue across host
/// restarts, crashes and network faults, resume with Range + If-Range,
/// verify their SHA-256 and publish atomically (docs/download-session.md).
public struct DownloadSessionKind: StrategyKind {
    public init() {}
    public var name: String { "download-session" }
    public var summary: String { "background downloads that resume after restarts, verify sha256 and publish atomically" }

    public func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let dir = config.requireString("dir")
        if !dir.isEmpty, !dir.hasPrefix("/") {
            config.problem("dir", "expected an absolute directory path, found \"\(dir)\"")
        }
        let downloads = Self.downloads(config)
        let maxParallel = config.integer("max_parallel", default: 2, range: 1...64)
        let maxTries = config.integer("max_tries", default: 5, range: 1...1000)
        let initial = config.positiveDuration("backoff_initial", default: .seconds(1))
        let maximum = config.positiveDuration("backoff_max", default: .seconds(300))
        if maximum < initial {
            config.problem("backoff_max", "must be at least backoff_initial (\(initial.vigilDescription))")
        }
        let jitter = config.bool("backoff_jitter", default: true)
        let maxRetryAfter = config.positiveDuration("max_retry_after", default: .seconds(3600))
        let connectTimeout = config.positiveDuration("connect_timeout", default: .seconds(30))
        let stallTimeout = config.positiveDuration("stall_timeout", default: .seconds(60))
        if stallTimeout < .seconds(1) {
            config.problem("stall_timeout", "expected at least 1s (libcurl counts whole seconds), found \(stallTimeout.vigilDescription)")
        }
        let onComplete = config.argv("on_complete")
        let onFail = config.argv("on_fail")
        let hookTimeout = config.positiveDuration("hook_timeout", default: .seconds(30))
        let writeChunk = config.byteSize("write_chunk", default: 512 * 1024)
        if writeChunk < 16 * 1024 || writeChunk > 10 * 1024 * 1024 {
            config.problem("write_chunk", "expected a size between 16KiB and 10MiB (libcurl's buffer limits), found \(writeChunk)")
        }
        let progressInterval = config.positiveDuration("progress_interval", default: .seconds(1))
        let caFile = config.string("ca_file")
        if let caFile {
            if !caFile.hasPrefix("/") {
                config.problem("ca_file", "expected an absolute path to a PEM file of CA certificates, found \"\(caFile)\"")
            } else if access(caFile, R_OK) != 0 {
                config.problem("ca_file", "cannot read the CA file \"\(caFile)\": \(String(cString: strerror(errno)))")
            }
        }
        return DownloadSession(settings: DownloadSettings(
            dir: dir, downloads: downloads, maxParallel: Int(maxParallel), maxTries: Int(maxTries),
            backoff: Backoff(initial: initial, maximum: maximum, jitter: jitter), maxRetryAfter: maxRetryAfter,
            connectTimeout: connectTimeout, stallTimeout: stallTimeout, onComplete: onComplete, onFail: onFail,
            hookTimeout: hookTimeout, writeChunk: Int(writeChunk), progressInterval: progressInterval, caFile: caFile))
    }

    /// `downloads = [{ url = "...", dest = "...", sha256 = "...", size = 123 }, ...]`.
    static func downloads(_ config: ConfigReader) -> [ConfiguredDownload] {
        config.declare("downloads")
        guard let value = config.values["downloads"] else { return [] }
        guard case .array(let items) = value else {
            config.problem("downloads", "expected an array of tables such as [{ url = \"https://...\", dest = \"file.iso\" }], found \(value.typeName)")
            return []
        }
        var out: [ConfiguredDownload] = []
        var dests: [String: Int] = [:]
        for (i, item) in items.enumerated() {
            let at = "element \(i)"
            guard case .table(let table) = item else {
                config.problem("downloads", "\(at): expected a table { url = ..., dest = ... }, found \(item.typeName)")
                continue
            }
            for key in table.keys where !["url", "dest", "sha256", "size"].contains(key) {
                let hint = Spelling.suggestion(for: key, among: ["url", "dest", "sha256", "size"]).map { " (did you mean \"\($0)\"?)" } ?? ""
                config.problem("downloads", "\(at): unknown key \"\(key)\"\(hint); expected url, dest, sha256, size")
            }
            guard case .string(let url)? = table["url"] else {
                config.problem("downloads", "\(at): missing url; expected a string such as \"https://example.org/file.iso\"")
                continue
            }
            let path: String
            switch URLCheck.validate(url) {
            case .failure(let message): config.problem("downloads", "\(at): \(message)"); continue
            case .success(let p): path = p
            }
            var dest: String
            switch table["dest"] {
            case nil:
                guard let name = DestinationPath.defaultName(urlPath: path) else {
                    config.problem("downloads", "\(at): cannot take a file name from \"\(url)\"; give dest")
                    continue
                }
                dest = name
            case .string(let d)?:
                dest = d
            case let other?:
                config.problem("downloads", "\(at): dest: expected a string, found \(other.typeName)")
                continue
            }
            if dest.hasPrefix("/") || dest.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0 == ".." || $0.isEmpty || $0 == "." }) {
                config.problem("downloads", "\(at): dest \"\(dest)\" must be a relative path of plain names below dir (no \"..\", no leading \"/\")")
                continue
            }
            var sha256: String?
            switch table["sha256"] {
            case nil: break
            case .string(let s)? where Hex.isSHA256(s): sha256 = s.lowercased()
            case let other?:
                config.problem("downloads", "\(at): sha256: expected 64 hexadecimal digits, found \(other)")
            }
            var size: Int64?
            switch table["size"] {
            case nil: break
            case .integer(let n)? where n >= 0: size = n
            case let other?:
                config.problem("downloads", "\(at): size: expected a non-negative integer number of bytes, found \(other)")
            }
            if let first = dests[dest] {
                config.problem("downloads", "\(at): dest \"\(dest)\" is also the destination of element \(first)")
                continue
            }
            dests[dest] = i
            out.append(ConfiguredDownload(url: url, dest: dest, sha256: sha256, size: size))
        }
        return out
    }
}
