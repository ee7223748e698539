import Foundation
import VigilKit

/// Log lines to a file descriptor (stderr by default), `<level> source:
/// message`, or `<N>source: message` with sd-daemon's priority prefix when
/// that descriptor is the journal (see `JournalStream`).
///
/// Logging never stops the host: a line that cannot be written (EPIPE from
/// a reader that went away, ENOSPC, EIO, a non-blocking descriptor that is
/// full) is dropped and counted in `droppedLines`, and a run of identical
/// lines is written once, then summarised as "suppressed N identical lines".
/// Control characters in messages are escaped, so one log call is one line
/// (and one journal entry) and nothing from outside reaches a terminal raw.
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
        var last: (level: LogLevel, source: String, message: String)?
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

    public func log(_ level: LogLevel, source: String, _ message: String) {
        guard level >= minimum else { return }
        let now = ContinuousClock.Instant.now
        lock.withLock {
            if let last = state.last, last.level == level, last.source == source, last.message == message,
               now - state.lastShownAt < repeatWindow {
                state.suppressed += 1
                return
            }
            flushSuppressedLocked()
            state.last = (level, source, message)
            state.lastShownAt = now
            writeLocked(format(level, source: source, message))
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
        writeLocked(format(last.level, source: last.source, "suppressed \(n) identical line\(n == 1 ? "" : "s")"))
    }

    private func format(_ level: LogLevel, source: String, _ message: String) -> [UInt8] {
        let text = LogEscaping.escape(message)
        let line = journal
            ? "<\(level.syslogPriority)>\(LogEscaping.escape(source)): \(text)\n"
            : "\(level.name) \(LogEscaping.escape(source)): \(text)\n"
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

/// Escapes control characters so that a message is one line and safe for a
/// terminal: newline as `\n`, tab kept, other C0/C1 controls and DEL as `\u{XX}`.
public enum LogEscaping {
    public static func escape(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsEscape) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case _ where needsEscape(scalar): out += "\\u{\(String(scalar.value, radix: 16))}"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        let v = scalar.value
        return (v < 0x20 && v != 0x09) || (0x7F...0x9F).contains(v)
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
