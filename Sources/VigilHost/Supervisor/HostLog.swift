import Foundation
import VigilKit

/// Log lines to a file descriptor (stderr by default), `<level> source:
/// message key=value...`, or `<N>source: message key=value...` with
/// sd-daemon's priority prefix when that descriptor is the journal (see
/// `JournalStream`). The key=value fields are the swift-log metadata of the
/// logger that wrote the line (`strategy`, `lease`, `run`, ...), sorted by key.
///
/// Logging never stops the host: a line that cannot be written (EPIPE from
/// a reader that went away, ENOSPC, EIO, a non-blocking descriptor that is
/// full) is dropped and counted in `droppedLines`, and a run of identical
/// lines is written once, then summarised as "suppressed N identical lines".
/// Control characters in messages and metadata are escaped (`TerminalText`),
/// so one log call is one line (and one journal entry) and nothing from
/// outside reaches a terminal raw.
public final class StderrLogSink: LogSink, @unchecked Sendable {
    // Invariant: `state` and the writes to `fd` are only touched while
    // holding `lock`, so lines never interleave and the counters are exact.
    private let lock = NSLock()
    public let minimum: LogLevel
    private let fd: Int32
    private let journal: Bool
    private let repeatWindow: Duration
    private var state = State()

    private struct State {
        var dropped = 0
        var written = 0
        var last: (level: LogLevel, source: String, message: String, metadata: Logger.Metadata)?
        var lastShownAt = ContinuousClock.Instant.now
        var suppressed = 0
    }

    /// - Parameters:
    ///   - fd: where lines go; stderr unless a test says otherwise.
    ///   - journal: whether to write priority prefixes; by default, whether
    ///     `fd` is the stream named by `JOURNAL_STREAM`.
    ///   - repeatWindow: identical consecutive lines within this time of the
    ///     last one written are counted, not written.
    public init(minimum: LogLevel = .info, fd: Int32 = STDERR_FILENO, journal: Bool? = nil,
                repeatWindow: Duration = .seconds(10)) {
        self.minimum = minimum
        self.fd = fd
        self.journal = journal ?? JournalStream.isJournal(fd: fd, environment: ProcessInfo.processInfo.environment)
        self.repeatWindow = repeatWindow
    }

    /// Lines that could not be written (and were dropped) since start.
    public var droppedLines: Int { lock.withLock { state.dropped } }
    /// Lines written since start (summary lines included).
    public var writtenLines: Int { lock.withLock { state.written } }

    public func log(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata) {
        guard level >= minimum else { return }
        let now = ContinuousClock.Instant.now
        lock.withLock {
            if let last = state.last, last.level == level, last.source == source, last.message == message,
               last.metadata == metadata, now - state.lastShownAt < repeatWindow {
                state.suppressed += 1
                return
            }
            flushSuppressedLocked()
            state.last = (level, source, message, metadata)
            state.lastShownAt = now
            writeLocked(format(level, source: source, message, metadata: metadata))
        }
    }

    /// Writes the pending "suppressed N" summary, if any (at shutdown).
    public func flush() {
        lock.withLock { flushSuppressedLocked() }
    }

    private func flushSuppressedLocked() {
        guard let last = state.last, state.suppressed > 0 else { return }
        let n = state.suppressed
        state.suppressed = 0
        writeLocked(format(last.level, source: last.source, "suppressed \(n) identical line\(n == 1 ? "" : "s")", metadata: last.metadata))
    }

    private func format(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata) -> [UInt8] {
        var line = journal ? "<\(level.syslogPriority)>" : "\(level.name) "
        line += TerminalText.escaped(source)
        line += ": "
        line += TerminalText.escaped(message)
        LogMetadataText.append(metadata, to: &line)
        line += "\n"
        return Array(line.utf8)
    }

    /// Writes all of `bytes` or counts the line as dropped; never traps,
    /// never blocks on a retry loop beyond EINTR.
    private func writeLocked(_ bytes: [UInt8]) {
        let complete = bytes.withUnsafeBytes { buffer -> Bool in
            guard let base = buffer.baseAddress else { return true }
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(fd, base + offset, buffer.count - offset)
                if n > 0 {
                    offset += n
                } else if n < 0 && errno == EINTR {
                    continue
                } else {
                    return false
                }
            }
            return true
        }
        if complete { state.written += 1 } else { state.dropped += 1 }
    }
}

extension LogLevel {
    /// sd-daemon(3) / syslog priority: debug 7, info 6, notice 5, warning 4, error 3.
    public var syslogPriority: Int { [7, 6, 5, 4, 3][rawValue] }
}

/// Whether a descriptor is the journal: systemd sets `JOURNAL_STREAM` to
/// `<device>:<inode>` of the stream it connected to stdout/stderr. The
/// variable alone is not enough (it is inherited by children whose stderr
/// was redirected), so the descriptor's own device and inode must match.
public enum JournalStream {
    public static func isJournal(fd: Int32, environment: [String: String]) -> Bool {
        guard let value = environment["JOURNAL_STREAM"] else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return false }
        return UInt64(st.st_dev) == dev && UInt64(st.st_ino) == ino
    }
}

/// swift-log metadata as ` key=value` fields after a log line's message,
/// sorted by key. Keys and values are escaped (`TerminalText`); a value that
/// is empty or holds a space, a quote or `=` is quoted, with `"` as `\"`.
public enum LogMetadataText {
    public static func append(_ metadata: Logger.Metadata, to line: inout String) {
        for key in metadata.keys.sorted() {
            guard let value = metadata[key] else { continue }
            line += " "
            line += TerminalText.escaped(key)
            line += "="
            line += quoted(TerminalText.escaped(value.description))
        }
    }

    private static func quoted(_ value: String) -> String {
        guard value.isEmpty || value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" }) else { return value }
        var out = "\""
        for c in value {
            if c == "\"" { out.append("\\") }
            out.append(c)
        }
        return out + "\""
    }
}

/// Another sink with fields added to every line: the host's run id on every
/// line of a run (`run=...`). A logger's own fields win over these.
public struct MetadataLogSink: LogSink {
    public let inner: any LogSink
    public let metadata: Logger.Metadata

    public init(_ inner: any LogSink, metadata: Logger.Metadata) {
        self.inner = inner
        self.metadata = metadata
    }

    public var minimum: LogLevel { inner.minimum }

    /// The sink that writes the lines, under any number of these.
    public var base: any LogSink { (inner as? MetadataLogSink)?.base ?? inner }

    public func log(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata) {
        inner.log(level, source: source, message, metadata: self.metadata.merging(metadata) { _, own in own })
    }
}

/// Keeps log lines in memory; for tests.
public final class MemoryLogSink: LogSink, @unchecked Sendable {
    // Invariant: `lines` is only touched while holding `lock`.
    private let lock = NSLock()
    private var lines: [String] = []

    public init() {}

    public func log(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata) {
        var line = "\(level.name) \(source): \(message)"
        LogMetadataText.append(metadata, to: &line)
        lock.withLock { lines.append(line) }
    }

    public var entries: [String] { lock.withLock { lines } }
}
