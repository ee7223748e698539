// swift-log is the logging API of the host and of every plugin. It is
// re-exported from here so that a plugin (or the host) that imports VigilKit
// gets `Logger` from the one copy of Logging linked into libVigilKit.so; a
// second copy linked into another image would have its own type metadata and
// its own LoggingSystem globals.
@_exported import Logging

/// Log levels, syslog-style: the levels the host's config names
/// (`log-level`) and its sink writes. swift-log's `trace` maps to `debug`
/// and its `critical` to `error`.
public enum LogLevel: Int, Sendable, Comparable, CaseIterable {
    case debug, info, notice, warning, error
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var name: String { String(describing: self) }

    public init(_ level: Logger.Level) {
        switch level {
        case .trace, .debug: self = .debug
        case .info: self = .info
        case .notice: self = .notice
        case .warning: self = .warning
        case .error, .critical: self = .error
        }
    }

    /// The swift-log level a handler is set to so that it passes this level
    /// and above (`debug` passes `trace` too).
    public var loggerLevel: Logger.Level {
        switch self {
        case .debug: .trace
        case .info: .info
        case .notice: .notice
        case .warning: .warning
        case .error: .error
        }
    }
}

/// Where log lines go; the host provides it (stderr, the journal, a test
/// buffer). Loggers reach it through `SinkLogHandler`, never through
/// `LoggingSystem.bootstrap`'s process-wide global.
public protocol LogSink: Sendable {
    /// Lines below this level are not built at all (the handler's level).
    var minimum: LogLevel { get }
    /// One line: `metadata` holds the logger's structured fields
    /// (`strategy`, `lease`, `run`, ...), merged with the call's own.
    func log(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata)
}

extension LogSink {
    public var minimum: LogLevel { .debug }

    public func log(_ level: LogLevel, source: String, _ message: String) {
        log(level, source: source, message, metadata: [:])
    }

    /// A swift-log `Logger` whose handler writes to this sink, labelled
    /// `source` (the name at the start of each line).
    public func logger(source: String, metadata: Logger.Metadata = [:]) -> Logger {
        var logger = Logger(label: source, factory: { SinkLogHandler(label: $0, sink: self) })
        for (key, value) in metadata { logger[metadataKey: key] = value }
        return logger
    }
}

/// The swift-log handler over a `LogSink`: the logger's label is the line's
/// source, and its metadata (a value, as swift-log requires) goes with every
/// line, merged with the metadata provider's and the call's own.
public struct SinkLogHandler: LogHandler {
    public let label: String
    public let sink: any LogSink
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var logLevel: Logger.Level

    public init(label: String, sink: any LogSink, metadataProvider: Logger.MetadataProvider? = nil) {
        self.label = label
        self.sink = sink
        self.metadataProvider = metadataProvider
        self.logLevel = sink.minimum.loggerLevel
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let own = event.metadata { merged.merge(own) { _, new in new } }
        sink.log(LogLevel(event.level), source: label, event.message.description, metadata: merged)
    }
}

/// A strategy's logger, as the host hands it to plugins (`context.log`): a
/// value over a swift-log `Logger` that writes to the host's sink. Its
/// metadata names the strategy and the host's run; add a lease id for the
/// lines about one lease with `with(lease:)`. Use `.logger` wherever a
/// swift-log `Logger` is wanted (a library that logs through swift-log).
public struct StrategyLogger: Sendable {
    public var logger: Logger

    /// The name at the start of each line (the logger's label).
    public var source: String { logger.label }

    /// The structured fields written with every line.
    public var metadata: Logger.Metadata {
        get { logger.handler.metadata }
        set { logger.handler.metadata = newValue }
    }

    public init(source: String, sink: any LogSink, metadata: Logger.Metadata = [:]) {
        self.logger = sink.logger(source: source, metadata: metadata)
    }

    public init(logger: Logger) {
        self.logger = logger
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { logger[metadataKey: key] }
        set { logger[metadataKey: key] = newValue }
    }

    /// This logger with one more field.
    public func with(_ key: String, _ value: String) -> StrategyLogger {
        var copy = self
        copy.logger[metadataKey: key] = .string(value)
        return copy
    }

    /// This logger for the lines about one lease: `lease=<id>`.
    public func with(lease id: LeaseID) -> StrategyLogger { with("lease", "\(id)") }

    public func debug(_ message: @autoclosure () -> String) { logger.debug("\(message())") }
    public func info(_ message: @autoclosure () -> String) { logger.info("\(message())") }
    public func notice(_ message: @autoclosure () -> String) { logger.notice("\(message())") }
    public func warning(_ message: @autoclosure () -> String) { logger.warning("\(message())") }
    public func error(_ message: @autoclosure () -> String) { logger.error("\(message())") }
}
