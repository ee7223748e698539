import Foundation
import VigilKit

/// Where a download is in its life.
public enum DownloadState: String, Sendable, Codable, CaseIterable {
    /// Waiting for a free slot (max_parallel).
    case queued
    /// Transferring (holds a lease).
    case active
    /// Waiting before the next attempt (backoff or Retry-After).
    case retrying
    /// Stopped by Pause; resumes from the part file on Resume.
    case paused
    /// Verified and published at the destination.
    case completed
    /// Gave up: out of tries, checksum mismatch, or a permanent error.
    case failed

    /// Work remains: started again after a restart.
    var isUnfinished: Bool { self == .queued || self == .active || self == .retrying }
}

/// One download as kept in the host's store (JSON under `download/<id>`).
struct DownloadRecord: Sendable, Codable, Hashable {
    var id: UInt64
    var url: String
    /// Relative to `dir`.
    var dest: String
    /// Expected SHA-256 (lowercase hex), if given.
    var sha256: String?
    /// Expected size in bytes, if given.
    var size: Int64?
    /// "config" or "bus".
    var origin: String
    var state: DownloadState
    /// Validators of the response that wrote the part file.
    var validators: ResponseValidators?
    var attempts: Int = 0
    var lastError: String = ""
    /// SHA-256 of the published file.
    var digest: String = ""
    /// Bytes in the part file (or the published file) when last saved.
    var bytesDone: Int64 = 0

    var storeKey: String { "download/\(id)" }

    /// The If-Range value for a resume (``ResponseValidators/ifRange``).
    var ifRange: String? { validators?.ifRange }
}

/// A download as written in the config (`downloads = [{url, dest?, sha256?, size?}]`).
struct ConfiguredDownload: Sendable, Hashable {
    var url: String
    var dest: String
    var sha256: String?
    var size: Int64?
}

/// The strategy's settings.
struct DownloadSettings: Sendable {
    var dir: String
    var downloads: [ConfiguredDownload]
    var maxParallel: Int
    var maxTries: Int
    var backoff: Backoff
    /// Longest Retry-After honoured; longer ones are capped.
    var maxRetryAfter: Duration
    var connectTimeout: Duration
    var stallTimeout: Duration
    var onComplete: [String]?
    var onFail: [String]?
    var hookTimeout: Duration
    var writeChunk: Int
    /// How often the live figures (lease status, D-Bus properties) refresh.
    var progressInterval: Duration
    /// A PEM file of CA certificates trusted for https instead of the
    /// system store (libcurl's `CURLOPT_CAINFO`); nil: the system store.
    var caFile: String? = nil
}

enum Hex {
    static func isSHA256(_ s: String) -> Bool {
        s.utf8.count == 64 && s.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) || (65...70).contains($0) }
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP date
/// (``HTTPDate``); nil for anything else.
enum RetryAfter {
    static func parse(_ value: String, nowWallMicros: Int64) -> Duration? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if !trimmed.isEmpty, trimmed.utf8.allSatisfy({ (48...57).contains($0) }) {
            // Digits past Int64 are a very long wait; the caller caps it.
            return .seconds(Int64(trimmed) ?? Int64.max)
        }
        guard let seconds = HTTPDate.secondsSinceEpoch(trimmed) else { return nil }
        // A four-digit year keeps seconds * 1e6 far inside Int64.
        let micros = seconds * 1_000_000 - nowWallMicros
        return .microseconds(max(0, micros))
    }
}
