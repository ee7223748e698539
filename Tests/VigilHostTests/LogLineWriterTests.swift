import Foundation
import Testing
import VigilHost
import VigilKit

/// vigild's one log handler (`VigilLogHandler` over a `LogLineWriter`) on
/// real descriptors: a pipe, /dev/full, a pipe with no reader. Every logger
/// here names its handler (`Logger(label:factory:)`): nothing depends on
/// LoggingSystem being bootstrapped in the test process.
@Suite struct LogLineWriterTests {
    /// A pipe whose read end is drained after the writes.
    final class PipePair {
        let read: Int32, write: Int32
        init() throws {
            var fds: [Int32] = [0, 0]
            guard pipe(&fds) == 0 else { throw POSIXError(.EIO) }
            self.read = fds[0]
            self.write = fds[1]
            _ = fcntl(read, F_SETFL, fcntl(read, F_GETFL) | O_NONBLOCK)
        }
        func lines() -> [String] {
            var data = [UInt8](repeating: 0, count: 65536)
            let n = Glibc.read(read, &data, data.count)
            return String(decoding: data.prefix(max(0, n)), as: UTF8.self).split(separator: "\n").map(String.init)
        }
        /// `JOURNAL_STREAM` naming the write end (`inodeOffset` 0) or another stream.
        func journalStream(inodeOffset: UInt64 = 0) -> String {
            var st = stat()
            guard fstat(write, &st) == 0 else { return "" }
            return "\(st.st_dev):\(UInt64(st.st_ino) + inodeOffset)"
        }
        deinit { close(read); close(write) }
    }

    /// A logger whose handler writes to `writer`.
    static func logger(_ label: String, _ writer: LogLineWriter, metadata: Logger.Metadata = [:]) -> Logger {
        var logger = Logger(label: label) { writer.handler(label: $0) }
        for (key, value) in metadata { logger[metadataKey: key] = value }
        return logger
    }

    /// With JOURNAL_STREAM naming the descriptor, lines carry sd-daemon
    /// priorities; naming another stream, or absent, they are plain.
    @Test func journalPrioritiesOnlyWhenJournalStreamMatches() throws {
        let p = try PipePair()
        let journal = LogLineWriter(level: .trace, fd: p.write, environment: ["JOURNAL_STREAM": p.journalStream()])
        let elsewhere = LogLineWriter(level: .trace, fd: p.write, environment: ["JOURNAL_STREAM": p.journalStream(inodeOffset: 1)])
        let unset = LogLineWriter(level: .trace, fd: p.write, environment: [:])
        #expect(journal.writesJournalPriorities)
        #expect(!elsewhere.writesJournalPriorities)
        #expect(!unset.writesJournalPriorities)
        let log = Self.logger("mail", journal)
        for level in Logger.Level.allCases { log.log(level: level, "at \(level)") }
        Self.logger("mail", elsewhere).warning("late")
        Self.logger("mail", unset).error("failed")
        #expect(p.lines() == [
            "<7>mail: at trace", "<7>mail: at debug", "<6>mail: at info", "<5>mail: at notice",
            "<4>mail: at warning", "<3>mail: at error", "<2>mail: at critical",
            "warning mail: late", "error mail: failed",
        ])
    }

    @Test func journalStreamMustNameTheDescriptor() throws {
        let p = try PipePair()
        #expect(JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": p.journalStream()]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": p.journalStream(inodeOffset: 1)]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": "garbage"]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: [:]))
    }

    /// Text from outside, in the message, the label or a metadata value,
    /// cannot forge a line or drive a terminal: control characters are
    /// escaped, in both formats.
    /// The private dbus-daemon's lines, relayed by vigild, lose the
    /// daemon's own prefix and fit a terminal line (Scripts/run showed one
    /// of 201 characters with vigild's fields).
    @Test func privateBusLinesAreShort() {
        let line = "dbus-daemon[15382]: [session uid=0 pid=15382] org.freedesktop.DBus.Error.AccessDenied: Failed to set fd limit to 65536: Operation not permitted"
        #expect(PrivateBus.shortLine(line) == "org.freedesktop.DBus.Error.AccessDenied: Failed to set fd limit to 65536: Operation not permitted")
        #expect(PrivateBus.shortLine("plain \u{1B}[31m") == "plain \\e[31m")
        let long = PrivateBus.shortLine(String(repeating: "x", count: 5_000))
        #expect(long.count == 161 && long.hasSuffix("…"))
    }

    @Test func hostileTextIsEscaped() throws {
        let p = try PipePair()
        let hostile = "a\nerror vigild: forged\r\u{1B}[31mc\td\u{7}\u{200B}"
        let plain = LogLineWriter(fd: p.write, journal: false)
        Self.logger("x", plain).info("client said \(hostile)")
        Self.logger("x\n<0>", plain, metadata: ["client": "\(hostile)"]).warning("hi")
        Self.logger("x", LogLineWriter(fd: p.write, journal: true)).error("\(hostile)")
        #expect(p.lines() == [
            #"info x: client said a\nerror vigild: forged\r\e[31mc\td\u{7}\u{200B}"#,
            #"warning x\n<0>: hi client="a\nerror vigild: forged\r\e[31mc\td\u{7}\u{200B}""#,
            #"<3>x: a\nerror vigild: forged\r\e[31mc\td\u{7}\u{200B}"#,
        ])
    }

    /// swift-log metadata (the logger's, the provider's and the call's own)
    /// follows the message as sorted key=value fields, quoted when needed;
    /// HostLogging adds the host's fields (`run=`) to every logger it makes.
    @Test func metadataFollowsTheMessage() throws {
        let p = try PipePair()
        let writer = LogLineWriter(level: .debug, fd: p.write, journal: false)
        let logging = HostLogging(handlers: { writer.handler(label: $0) }).adding(["run": "r1"])
        var log = logging.logger("mail", metadata: ["strategy": "mail"])
        log.with(lease: LeaseID(7)).warning("late")
        log[metadataKey: "peer"] = "a b=\"x\""
        log.info("odd")
        log.error("direct", metadata: ["strategy": "override", "attempt": "3"])
        let provided = Logger(label: "mail", factory: { label, _ in
            writer.handler(label: label, metadataProvider: Logger.MetadataProvider { ["trace": "t1"] })
        })
        provided.notice("provided")
        #expect(p.lines() == [
            "warning mail: late lease=7 run=r1 strategy=mail",
            #"info mail: odd peer="a b=\"x\"" run=r1 strategy=mail"#,
            #"error mail: direct attempt=3 peer="a b=\"x\"" run=r1 strategy=override"#,
            "notice mail: provided trace=t1",
        ])
    }

    /// The handler's level is the writer's when the handler is made (the
    /// config's log_level, set before the host's loggers exist): a line
    /// below it is never built.
    @Test func handlersTakeTheWritersLevel() throws {
        let p = try PipePair()
        let writer = LogLineWriter(fd: p.write, journal: false)
        let before = Self.logger("x", writer)
        writer.level = .warning
        let log = Self.logger("x", writer)
        #expect(before.logLevel == .info)
        #expect(log.logLevel == .warning)
        var built = false
        log.info("\({ built = true; return "hidden" }())")
        #expect(!built)
        log.warning("shown")
        #expect(p.lines() == ["warning x: shown"])
    }

    /// Identical messages with different metadata (two leases) are two lines.
    @Test func repeatsWithOtherMetadataAreWritten() throws {
        let p = try PipePair()
        let log = Self.logger("x", LogLineWriter(fd: p.write, journal: false))
        log.with(lease: LeaseID(1)).info("expired")
        log.with(lease: LeaseID(2)).info("expired")
        log.with(lease: LeaseID(2)).info("expired")
        #expect(p.lines() == ["info x: expired lease=1", "info x: expired lease=2"])
    }

    @Test func identicalLinesAreSuppressedAndSummarised() throws {
        let p = try PipePair()
        let writer = LogLineWriter(fd: p.write, journal: false)
        let log = Self.logger("x", writer)
        for _ in 0..<5 { log.error("boom") }
        log.error("other")
        log.error("other")
        writer.flush()
        #expect(p.lines() == ["error x: boom", "error x: suppressed 4 identical lines", "error x: other", "error x: suppressed 1 identical line"])
    }

    @Test func repeatsAfterTheWindowAreWrittenAgain() throws {
        let p = try PipePair()
        let log = Self.logger("x", LogLineWriter(fd: p.write, journal: false, repeatWindow: .zero))
        for _ in 0..<3 { log.info("tick") }
        #expect(p.lines() == ["info x: tick", "info x: tick", "info x: tick"])
    }

    @Test func writeErrorsAreCountedNotFatal() throws {
        let full = open("/dev/full", O_WRONLY)
        try #require(full >= 0)
        defer { close(full) }
        let writer = LogLineWriter(fd: full, journal: false)
        Self.logger("x", writer).info("one")
        Self.logger("x", writer).info("two")
        #expect(writer.droppedLines == 2)
        #expect(writer.writtenLines == 0)
        #expect(HostLogging.bootstrapped(writer: writer).droppedLines == 2)

        // A pipe whose reader is gone: EPIPE, with SIGPIPE ignored as vigild
        // does (left ignored: restoring the default could kill this test
        // process if another test writes to a closed pipe meanwhile).
        signal(SIGPIPE, SIG_IGN)
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        close(fds[0])
        defer { close(fds[1]) }
        let orphan = LogLineWriter(fd: fds[1], journal: false)
        Self.logger("x", orphan).error("nobody reads this")
        #expect(orphan.droppedLines == 1)
    }
}
