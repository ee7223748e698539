/// Log levels, syslog-style.
public enum LogLevel: Int, Sendable, Comparable, CaseIterable {
    case debug, info, notice, warning, error
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var name: String { String(describing: self) }
}

/// Where log lines go; the host provides it (stderr, the journal, a test buffer).
public protocol LogSink: Sendable {
    func log(_ level: LogLevel, source: String, _ message: String)
}

/// A strategy's logger: a small value over the host's sink.
public struct StrategyLogger: Sendable {
    public let source: String
    public let sink: any LogSink

    public init(source: String, sink: any LogSink) {
        self.source = source
        self.sink = sink
    }

    public func debug(_ message: @autoclosure () -> String) { sink.log(.debug, source: source, message()) }
    public func info(_ message: @autoclosure () -> String) { sink.log(.info, source: source, message()) }
    public func notice(_ message: @autoclosure () -> String) { sink.log(.notice, source: source, message()) }
    public func warning(_ message: @autoclosure () -> String) { sink.log(.warning, source: source, message()) }
    public func error(_ message: @autoclosure () -> String) { sink.log(.error, source: source, message()) }
}
