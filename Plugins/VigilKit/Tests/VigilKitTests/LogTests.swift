import Testing
import VigilKit

/// A handler that keeps what it was given, fields apart from the message
/// (no LoggingSystem.bootstrap: the test's loggers name it explicitly).
private final class Recorder: Sendable {
    struct Line: Equatable { var level: Logger.Level, label: String, message: String, metadata: Logger.Metadata }
    let lines = Lock<[Line]>([])
    var all: [Line] { lines.withLock { $0 } }

    func logger(_ label: String, level: Logger.Level = .trace) -> Logger {
        var logger = Logger(label: label) { Handler(label: $0, recorder: self) }
        logger.logLevel = level
        return logger
    }

    struct Handler: LogHandler {
        let label: String
        let recorder: Recorder
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { _, own in own }
            recorder.lines.withLock { $0.append(Line(level: event.level, label: label, message: "\(event.message)", metadata: merged)) }
        }
    }
}

/// `with(lease:)` adds `lease=<id>` to a copy: the original's lines do not
/// carry it, the copy's carry it with the strategy's own fields.
@Test func withLeaseAddsTheLeaseToACopy() {
    let recorder = Recorder()
    var log = recorder.logger("nightly")
    log[metadataKey: "strategy"] = "nightly"
    var copy = log.with(lease: LeaseID(42))
    copy[metadataKey: "peer"] = "a"
    log.info("plain")
    copy.warning("about a lease")
    copy.critical("with its own field", metadata: ["peer": "b"])
    #expect(recorder.all == [
        .init(level: .info, label: "nightly", message: "plain", metadata: ["strategy": "nightly"]),
        .init(level: .warning, label: "nightly", message: "about a lease", metadata: ["strategy": "nightly", "lease": "42", "peer": "a"]),
        .init(level: .critical, label: "nightly", message: "with its own field", metadata: ["strategy": "nightly", "lease": "42", "peer": "b"]),
    ])
}
