import Foundation
import Testing
import VigilHost
import VigilKit

/// The host's log sink on real descriptors: a pipe, /dev/full, a pipe with
/// no reader.
@Suite struct StderrLogSinkTests {
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
        deinit { close(read); close(write) }
    }

    @Test func plainAndJournalFormats() throws {
        let p = try PipePair()
        StderrLogSink(minimum: .debug, fd: p.write, journal: false).log(.warning, source: "mail", "late")
        StderrLogSink(minimum: .debug, fd: p.write, journal: true).log(.warning, source: "mail", "late")
        StderrLogSink(minimum: .debug, fd: p.write, journal: true).log(.error, source: "mail", "failed")
        StderrLogSink(minimum: .info, fd: p.write, journal: true).log(.debug, source: "mail", "hidden")
        #expect(p.lines() == ["warning mail: late", "<4>mail: late", "<3>mail: failed"])
    }

    @Test func journalStreamMustNameTheDescriptor() throws {
        let p = try PipePair()
        var st = stat()
        #expect(fstat(p.write, &st) == 0)
        let own = "\(st.st_dev):\(st.st_ino)"
        #expect(JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": own]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": "\(st.st_dev):\(st.st_ino + 1)"]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: ["JOURNAL_STREAM": "garbage"]))
        #expect(!JournalStream.isJournal(fd: p.write, environment: [:]))
    }

    @Test func controlCharactersAreEscaped() throws {
        let p = try PipePair()
        StderrLogSink(fd: p.write, journal: false).log(.info, source: "x", "a\nb\u{1B}[31mc\td")
        #expect(p.lines() == ["info x: a\\nb\\e[31mc\\td"])
    }

    /// swift-log metadata (the logger's, the provider's and the call's own)
    /// follows the message as sorted key=value fields, escaped and quoted,
    /// in both formats.
    @Test func metadataFollowsTheMessage() throws {
        let p = try PipePair()
        let plain = StderrLogSink(minimum: .debug, fd: p.write, journal: false)
        var log = StrategyLogger(source: "mail", sink: MetadataLogSink(plain, metadata: ["run": "r1"]), metadata: ["strategy": "mail"])
        log.with(lease: LeaseID(7)).warning("late")
        log[metadataKey: "peer"] = "a b\n\u{1B}[2J=\"x\""
        log.info("odd")
        log.logger.error("direct", metadata: ["strategy": "override", "attempt": "3"])
        StrategyLogger(source: "mail", sink: StderrLogSink(fd: p.write, journal: true), metadata: ["strategy": "mail"]).error("failed")
        #expect(p.lines() == [
            "warning mail: late lease=7 run=r1 strategy=mail",
            #"info mail: odd peer="a b\n\e[2J=\"x\"" run=r1 strategy=mail"#,
            #"error mail: direct attempt=3 peer="a b\n\e[2J=\"x\"" run=r1 strategy=override"#,
            "<3>mail: failed strategy=mail",
        ])
    }

    /// The sink's level is the handler's: a line below it is never built.
    @Test func linesBelowTheMinimumAreNotBuilt() throws {
        let p = try PipePair()
        let log = StrategyLogger(source: "x", sink: StderrLogSink(minimum: .warning, fd: p.write, journal: false))
        #expect(log.logger.logLevel == .warning)
        var built = false
        log.info({ built = true; return "hidden" }())
        #expect(!built)
        #expect(p.lines().isEmpty)
    }

    /// Identical messages with different metadata (two leases) are two lines.
    @Test func repeatsWithOtherMetadataAreWritten() throws {
        let p = try PipePair()
        let log = StrategyLogger(source: "x", sink: StderrLogSink(fd: p.write, journal: false))
        log.with(lease: LeaseID(1)).info("expired")
        log.with(lease: LeaseID(2)).info("expired")
        log.with(lease: LeaseID(2)).info("expired")
        #expect(p.lines() == ["info x: expired lease=1", "info x: expired lease=2"])
    }

    @Test func identicalLinesAreSuppressedAndSummarised() throws {
        let p = try PipePair()
        let sink = StderrLogSink(fd: p.write, journal: false)
        for _ in 0..<5 { sink.log(.error, source: "x", "boom") }
        sink.log(.error, source: "x", "other")
        sink.log(.error, source: "x", "other")
        sink.flush()
        #expect(p.lines() == ["error x: boom", "error x: suppressed 4 identical lines", "error x: other", "error x: suppressed 1 identical line"])
    }

    @Test func repeatsAfterTheWindowAreWrittenAgain() throws {
        let p = try PipePair()
        let sink = StderrLogSink(fd: p.write, journal: false, repeatWindow: .zero)
        for _ in 0..<3 { sink.log(.info, source: "x", "tick") }
        #expect(p.lines() == ["info x: tick", "info x: tick", "info x: tick"])
    }

    @Test func writeErrorsAreCountedNotFatal() throws {
        let full = open("/dev/full", O_WRONLY)
        try #require(full >= 0)
        defer { close(full) }
        let sink = StderrLogSink(fd: full, journal: false)
        sink.log(.info, source: "x", "one")
        sink.log(.info, source: "x", "two")
        #expect(sink.droppedLines == 2)
        #expect(sink.writtenLines == 0)

        // A pipe whose reader is gone: EPIPE, with SIGPIPE ignored as vigild
        // does (left ignored: restoring the default could kill this test
        // process if another test writes to a closed pipe meanwhile).
        signal(SIGPIPE, SIG_IGN)
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        close(fds[0])
        defer { close(fds[1]) }
        let orphan = StderrLogSink(fd: fds[1], journal: false)
        orphan.log(.error, source: "x", "nobody reads this")
        #expect(orphan.droppedLines == 1)
    }
}
