import Foundation
import VigilKit

/// vigild's log output: the one writer of log lines, behind the one
/// swift-log handler (``VigilLogHandler``) that vigild installs with
/// `LoggingSystem.bootstrap`. Lines go to a file descriptor (stderr by
/// default) as `<level> label: message key=value...`, or as
/// `<N>label: message key=value...` with sd-daemon's priority prefix when
/// that descriptor is the journal (see `JournalStream`). The key=value
/// fields are the swift-log metadata of the logger that wrote the line
/// (`run`, `strategy`, `lease`, ...), sorted by key.
///
/// Logging never stops the host: a line that cannot be written (EPIPE from
/// a reader that went away, ENOSPC, EIO, a non-blocking descriptor that is
/// full) is dropped and counted in `droppedLines`, and a run of identical
/// lines is written once, then summarised as "suppressed N identical lines".
/// Control characters in the label, the message and the metadata are
/// escaped (`ClientText.escaped`, the one escaping of outside text), so one
/// log call is one line (and one journal entry) and nothing from outside
/// reaches a terminal raw.
public final class LogLineWriter: Sendable {
    /// The writes to `fd` happen only inside `state.withLock`, so lines never
    /// interleave and the counters are exact.
    private let state: Lock<State>
    private let fd: Int32
    private let journal: Bool
    private let repeatWindow: Duration

    private struct State {
        var level: Logger.Level
        var dropped = 0
        var written = 0
        var last: (level: Logger.Level, label: String, message: String, metadata: Logger.Metadata)?
        var lastShownAt = ContinuousClock.Instant.now
        var suppressed = 0
    }

    /// - Parameters:
    ///   - level: the level handlers made from now on start at (the
    ///     config's `log_level`); see ``level``.
    ///   - fd: where lines go; stderr unless a test says otherwise.
    ///   - journal: whether to write priority prefixes; by default, whether
    ///     `fd` is the stream named by `JOURNAL_STREAM` in `environment`.
    ///   - repeatWindow: identical consecutive lines within this time of the
    ///     last one written are counted, not written.
    public init(level: Logger.Level = .info, fd: Int32 = STDERR_FILENO, journal: Bool? = nil,
                environment: [String: String] = ProcessInfo.processInfo.environment,
                repeatWindow: Duration = .seconds(10)) {
        self.state = Lock(State(level: level))
        self.fd = fd
        self.journal = journal ?? JournalStream.isJournal(fd: fd, environment: environment)
        self.repeatWindow = repeatWindow
    }

    /// The level of the handlers made from now on: vigild bootstraps
    /// swift-log before it has read its config, and sets this to the
    /// config's `log_level` before it makes the host's loggers.
    public var level: Logger.Level {
        get { state.withLock { $0.level } }
        set { state.withLock { $0.level = newValue } }
    }

    /// Whether lines carry sd-daemon priority prefixes (the descriptor is the journal).
    public var writesJournalPriorities: Bool { journal }

    /// Lines that could not be written (and were dropped) since start.
    public var droppedLines: Int { state.withLock { $0.dropped } }
    /// Lines written since start (summary lines included).
    public var writtenLines: Int { state.withLock { $0.written } }

    /// The handler `LoggingSystem.bootstrap` installs: one per logger, all
    /// writing here.
    public func handler(label: String, metadataProvider: Logger.MetadataProvider? = nil) -> VigilLogHandler {
        VigilLogHandler(label: label, writer: self, metadataProvider: metadataProvider)
    }

    /// Writes one line (the handler has checked its level).
    public func write(_ level: Logger.Level, label: String, _ message: String, metadata: Logger.Metadata) {
        let now = ContinuousClock.Instant.now
        state.withLock { state in
            if let last = state.last, last.level == level, last.label == label, last.message == message,
               last.metadata == metadata, now - state.lastShownAt < repeatWindow {
                state.suppressed += 1
                return
            }
            flushSuppressedLocked(&state)
            state.last = (level, label, message, metadata)
            state.lastShownAt = now
            writeLocked(format(level, label: label, message, metadata: metadata), &state)
        }
    }

    /// Writes the pending "suppressed N" summary, if any (at shutdown).
    public func flush() {
        state.withLock { flushSuppressedLocked(&$0) }
    }

    private func flushSuppressedLocked(_ state: inout State) {
        guard let last = state.last, state.suppressed > 0 else { return }
        let n = state.suppressed
        state.suppressed = 0
        writeLocked(format(last.level, label: last.label, "suppressed \(n) identical line\(n == 1 ? "" : "s")", metadata: last.metadata), &state)
    }

    private func format(_ level: Logger.Level, label: String, _ message: String, metadata: Logger.Metadata) -> [UInt8] {
        var line = journal ? "<\(Self.syslogPriority(level))>" : "\(level.rawValue) "
        line += ClientText.escaped(label)
        line += ": "
        line += ClientText.escaped(message)
        LogMetadataText.append(metadata, to: &line)
        line += "\n"
        return Array(line.utf8)
    }

    /// sd-daemon(3) / syslog priority: trace and debug 7, info 6, notice 5,
    /// warning 4, error 3, critical 2. (Not an extension of `Logger.Level`:
    /// its symbols would be named after Logging and look like a second copy
    /// of it to Scripts/check-single-logging.)
    static func syslogPriority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    /// Writes all of `bytes` or counts the line as dropped; never traps,
    /// never blocks on a retry loop beyond EINTR.
    private func writeLocked(_ bytes: [UInt8], _ state: inout State) {
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

/// The swift-log handler of vigild (installed by `LoggingSystem.bootstrap`
/// in vigild's startup): the logger's label starts the line, and its
/// metadata (a value, as swift-log requires) goes with every line, merged
/// with the metadata provider's and the call's own; ``LogLineWriter`` writes
/// it. Its level starts at the writer's ``LogLineWriter/level``.
public struct VigilLogHandler: LogHandler {
    public let label: String
    public let writer: LogLineWriter
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var logLevel: Logger.Level

    public init(label: String, writer: LogLineWriter, metadataProvider: Logger.MetadataProvider? = nil) {
        self.label = label
        self.writer = writer
        self.metadataProvider = metadataProvider
        self.logLevel = writer.level
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let own = event.metadata { merged.merge(own) { _, new in new } }
        writer.write(event.level, label: label, event.message.description, metadata: merged)
    }
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
/// sorted by key. Keys and values are escaped (`ClientText.escaped`); a value that
/// is empty or holds a space, a quote or `=` is quoted, with `"` as `\"`.
public enum LogMetadataText {
    public static func append(_ metadata: Logger.Metadata, to line: inout String) {
        for key in metadata.keys.sorted() {
            guard let value = metadata[key] else { continue }
            line += " "
            line += ClientText.escaped(key)
            line += "="
            line += quoted(ClientText.escaped(value.description))
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

/// How the host's parts make their `Logger`s, each labelled for what it is
/// (`vigild`, `dbus`, `conditions`, a strategy's name) and carrying the
/// host's fields (`run=`). In vigild they come from swift-log's
/// `LoggingSystem`, bootstrapped once with ``VigilLogHandler``
/// (``bootstrapped(writer:)``); a test names its handler explicitly
/// (``init(metadata:handlers:)``), so no test depends on the process-wide
/// bootstrap. This is not a second way to write lines: it only chooses the
/// factory swift-log's `Logger(label:)` would use.
public struct HostLogging: Sendable {
    /// Nil: `LoggingSystem`'s factory.
    private let handlers: (@Sendable (_ label: String) -> any LogHandler)?
    /// Fields every logger made here starts with; a logger's own win.
    public var metadata: Logger.Metadata
    /// The writer the bootstrapped handler writes to, for its counters
    /// (HostHealth's dropped lines); nil when lines go elsewhere.
    public let writer: LogLineWriter?

    /// Loggers from `LoggingSystem`, which vigild bootstrapped with
    /// `writer`'s handler.
    public static func bootstrapped(writer: LogLineWriter, metadata: Logger.Metadata = [:]) -> HostLogging {
        HostLogging(handlers: nil, metadata: metadata, writer: writer)
    }

    /// Loggers whose handler is `handlers(label)` (tests, tools).
    public init(metadata: Logger.Metadata = [:], handlers: @escaping @Sendable (_ label: String) -> any LogHandler) {
        self.init(handlers: handlers, metadata: metadata, writer: nil)
    }

    /// Loggers that write nothing (benchmarks, fuzzers).
    public static var discarding: HostLogging {
        HostLogging { _ in SwiftLogNoOpLogHandler() }
    }

    private init(handlers: (@Sendable (String) -> any LogHandler)?, metadata: Logger.Metadata, writer: LogLineWriter?) {
        self.handlers = handlers
        self.metadata = metadata
        self.writer = writer
    }

    /// A logger labelled `label` with the host's fields and `metadata`.
    public func logger(_ label: String, metadata: Logger.Metadata = [:]) -> Logger {
        var logger = handlers.map { Logger(label: label, factory: $0) } ?? Logger(label: label)
        for (key, value) in self.metadata.merging(metadata, uniquingKeysWith: { _, own in own }) {
            logger[metadataKey: key] = value
        }
        return logger
    }

    /// These loggers with more fields (the run's id on every line of a run).
    public func adding(_ metadata: Logger.Metadata) -> HostLogging {
        HostLogging(handlers: handlers, metadata: self.metadata.merging(metadata) { _, new in new }, writer: writer)
    }

    /// Lines the writer could not write since start (0 without a writer).
    public var droppedLines: Int { writer?.droppedLines ?? 0 }
}
