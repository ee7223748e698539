import Foundation
import VigilKit

/// Log lines to stderr, `<level> source: message`, with systemd's `<N>`
/// priority prefix when stderr is the journal (JOURNAL_STREAM is set).
public final class StderrLogSink: LogSink, @unchecked Sendable {
    // Invariant: writes are serialized by `lock` so lines never interleave.
    private let lock = NSLock()
    public let minimum: LogLevel
    private let journal: Bool

    public init(minimum: LogLevel = .info) {
        self.minimum = minimum
        self.journal = ProcessInfo.processInfo.environment["JOURNAL_STREAM"] != nil
    }

    public func log(_ level: LogLevel, source: String, _ message: String) {
        guard level >= minimum else { return }
        let priority = [7, 6, 5, 4, 3][level.rawValue]
        let line = journal ? "<\(priority)>\(source): \(message)\n" : "\(level.name) \(source): \(message)\n"
        lock.withLock { FileHandle.standardError.write(Data(line.utf8)) }
    }
}

/// Keeps log lines in memory; for tests.
public final class MemoryLogSink: LogSink, @unchecked Sendable {
    // Invariant: `lines` is only touched while holding `lock`.
    private let lock = NSLock()
    private var lines: [String] = []

    public init() {}

    public func log(_ level: LogLevel, source: String, _ message: String) {
        lock.withLock { lines.append("\(level.name) \(source): \(message)") }
    }

    public var entries: [String] { lock.withLock { lines } }
}
