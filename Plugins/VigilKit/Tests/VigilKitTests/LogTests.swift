import Synchronization
import Testing
import VigilKit

/// A sink that keeps what it was given, fields apart from the message.
private final class RecordingSink: LogSink {
    struct Line: Equatable { var level: LogLevel, source: String, message: String, metadata: Logger.Metadata }
    let minimum: LogLevel
    let lines = Mutex<[Line]>([])
    init(minimum: LogLevel = .debug) { self.minimum = minimum }
    func log(_ level: LogLevel, source: String, _ message: String, metadata: Logger.Metadata) {
        lines.withLock { $0.append(Line(level: level, source: source, message: message, metadata: metadata)) }
    }
    var all: [Line] { lines.withLock { $0 } }
}

/// StrategyLogger is a value over a swift-log Logger bound to the sink it
/// was made with (no LoggingSystem.bootstrap): its metadata and lease
/// fields reach the sink, copies do not share changes, and swift-log's
/// seven levels map onto the host's five.
@Test func strategyLoggerCarriesItsFieldsToTheSink() {
    let sink = RecordingSink()
    let log = StrategyLogger(source: "nightly", sink: sink, metadata: ["strategy": "nightly"])
    var copy = log.with(lease: LeaseID(42))
    copy[metadataKey: "peer"] = "a"
    log.info("plain")
    copy.warning("about a lease")
    copy.logger.critical("via swift-log", metadata: ["peer": "b"])
    copy.logger.trace("traced")
    #expect(log.source == "nightly")
    #expect(log.metadata == ["strategy": "nightly"])
    #expect(sink.all == [
        .init(level: .info, source: "nightly", message: "plain", metadata: ["strategy": "nightly"]),
        .init(level: .warning, source: "nightly", message: "about a lease", metadata: ["strategy": "nightly", "lease": "42", "peer": "a"]),
        .init(level: .error, source: "nightly", message: "via swift-log", metadata: ["strategy": "nightly", "lease": "42", "peer": "b"]),
        .init(level: .debug, source: "nightly", message: "traced", metadata: ["strategy": "nightly", "lease": "42", "peer": "a"]),
    ])
}

/// The handler takes the sink's minimum as its level, so lines below it are
/// not even built.
@Test func handlerLevelFollowsTheSinkMinimum() {
    let sink = RecordingSink(minimum: .notice)
    let log = StrategyLogger(source: "x", sink: sink)
    #expect(log.logger.logLevel == .notice)
    log.info("dropped")
    log.notice("kept")
    #expect(sink.all.map(\.message) == ["kept"])
}
