import Foundation
import Testing
@testable import VigilHost
import VigilKit
import VigilTestSupport

/// A client lease's pipe: its last writer closing is reported once, on the
/// loop; a forgotten or stopped watch is not reported and its read end is
/// closed (the loop holds no descriptor for a lease that ended).
@Suite struct HangupWatcherTests {
    @Test func theLastWriterClosingIsReportedOnceOnTheLoopAndItsReadEndIsClosed() async throws {
        let hangups = Hangups()
        let watcher = try HangupWatcher { hangups.record($0) }
        defer { watcher.stop() }
        let (token, writeEnd) = try watcher.makeWatchedPipe()
        let pipe = try PipeIdentity(writeEnd)
        #expect(pipe.openEnds().count == 2, "the read end is open, watched")
        #expect(watcher.watchedCount == 1)

        // What a client writes into its pipe is drained, not a hang-up: fill
        // it, and the loop makes room again.
        _ = fcntl(writeEnd, F_SETFL, fcntl(writeEnd, F_GETFL) | O_NONBLOCK)
        let bytes = [UInt8](repeating: 7, count: 4096)
        var written = 0
        while write(writeEnd, bytes, bytes.count) > 0 { written += bytes.count }
        #expect(errno == EAGAIN && written > 0, "filled after \(written) bytes: \(String(cString: strerror(errno)))")
        #expect(roomAgain(writeEnd), "the loop did not read what the client wrote")
        await loopTurns()
        #expect(hangups.total == 0, "a client's writes were reported as a hang-up")
        #expect(watcher.watchedCount == 1)

        close(writeEnd)
        #expect(await hangups.wait(total: 1), "no hang-up reported")
        await loopTurns()
        #expect(hangups.counts == [token: 1])
        #expect(hangups.offLoop == 0, "reported off the loop")
        #expect(watcher.watchedCount == 0)
        #expect(pipe.openEnds().isEmpty, "the read end is still open after the hang-up")
    }

    @Test func aForgottenWatchIsNotReportedAndItsReadEndIsClosed() async throws {
        let hangups = Hangups()
        let watcher = try HangupWatcher { hangups.record($0) }
        defer { watcher.stop() }
        let (token, writeEnd) = try watcher.makeWatchedPipe()
        let other = try watcher.makeWatchedPipe()
        watcher.forget(token)
        #expect(watcher.watchedCount == 1)
        // The loop closes the read end once it let the watch go: the
        // write end then has no reader (POLLERR).
        #expect(lostItsReader(writeEnd), "the forgotten pipe's read end is still open")
        close(writeEnd)
        await loopTurns()
        #expect(hangups.total == 0, "a forgotten watch was reported")
        watcher.forget(token)  // unknown by now: ignored

        // The other watch is untouched by it.
        close(other.writeEnd)
        #expect(await hangups.wait(total: 1))
        await loopTurns()
        #expect(hangups.counts == [other.token: 1])
    }

    @Test func stopClosesEveryReadEndUnreportedAndMakesNoMorePipes() async throws {
        let hangups = Hangups()
        let watcher = try HangupWatcher { hangups.record($0) }
        defer { watcher.stop() }
        let pipes = try (0..<8).map { _ in try watcher.makeWatchedPipe() }
        watcher.stop()
        #expect(watcher.watchedCount == 0)
        #expect(lostTheirReaders(pipes.map(\.writeEnd)), "a read end is still open after stop()")
        for pipe in pipes { close(pipe.writeEnd) }
        await loopTurns()
        #expect(hangups.total == 0, "stop() reported hang-ups")
        #expect(throws: (any Error).self) { try watcher.makeWatchedPipe() }
    }

    /// A host with many clients: every pipe's end is reported exactly once,
    /// whatever the order the loop sees them in, and no read end is left.
    @Test func aThousandWatchesEachReportTheirHangupOnce() async throws {
        let hangups = Hangups()
        let watcher = try HangupWatcher { hangups.record($0) }
        defer { watcher.stop() }
        let count = 1_000
        let pipes = try (0..<count).map { _ in try watcher.makeWatchedPipe() }
        let identities = try pipes.map { try PipeIdentity($0.writeEnd) }
        #expect(watcher.watchedCount == count)
        #expect(Set(pipes.map(\.token)).count == count, "tokens are not distinct")

        for pipe in pipes { close(pipe.writeEnd) }
        #expect(await hangups.wait(total: count, timeout: .seconds(60)), "\(hangups.total) of \(count) hang-ups reported")
        // Enough turns for every descriptor still ready (epoll hands
        // out 64 a turn) to have been handed to its handler again.
        await loopTurns(count / 64 + 4)
        let counts = hangups.counts
        #expect(Set(counts.keys) == Set(pipes.map(\.token)))
        #expect(counts.values.allSatisfy { $0 == 1 }, "reported more than once: \(counts.filter { $0.value != 1 })")
        #expect(hangups.offLoop == 0, "reported off the loop")
        #expect(watcher.watchedCount == 0)
        let open = PipeIdentity.openEnds(of: Set(identities.map(\.inode)))
        #expect(open.isEmpty, "\(open.count) read ends still open")
    }
}

/// The hang-ups a watcher reported, by token, and whether each came on the loop.
final class Hangups: Sendable {
    private struct State {
        var counts: [UInt64: Int] = [:]
        var offLoop = 0
    }
    private let state = Lock(State())
    private let reported = WaitableCount()

    var counts: [UInt64: Int] { state.withLock { $0.counts } }
    var total: Int { reported.value }
    var offLoop: Int { state.withLock { $0.offLoop } }

    func record(_ token: UInt64) {
        let onLoop = EventLoop.isCurrent
        state.withLock { state in
            state.counts[token, default: 0] += 1
            if !onLoop { state.offLoop += 1 }
        }
        reported.add()
    }

    /// Waits for `total` hang-ups in all; false if `timeout` passes first.
    func wait(total: Int, timeout: Duration = .seconds(30)) async -> Bool {
        await reported.wait(for: total, timeout: timeout)
    }
}

/// Whether the pipes whose write ends are `writeEnds` lost their readers:
/// poll reports POLLERR on a write end once every read end is closed. Waits
/// up to `timeout` for it (the loop closes read ends on its own thread).
func lostTheirReaders(_ writeEnds: [Int32], timeout: Duration = .seconds(10)) -> Bool {
    var waiting = writeEnds
    let deadline = ContinuousClock.now + timeout
    while !waiting.isEmpty {
        var entries = waiting.map { pollfd(fd: $0, events: 0, revents: 0) }
        let left = deadline - ContinuousClock.now
        let ms = max(0, Int32(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
        let n = poll(&entries, nfds_t(entries.count), ms)
        if n == 0 || (n < 0 && errno != EINTR) { return false }
        waiting = entries.filter { $0.revents & Int16(POLLERR) == 0 }.map(\.fd)
    }
    return true
}

func lostItsReader(_ writeEnd: Int32) -> Bool { lostTheirReaders([writeEnd]) }

/// Whether the full pipe whose write end is `writeEnd` gets room again (its
/// reader read): waits up to `timeout` for POLLOUT.
func roomAgain(_ writeEnd: Int32, timeout: Duration = .seconds(10)) -> Bool {
    var entry = pollfd(fd: writeEnd, events: Int16(POLLOUT), revents: 0)
    let ms = Int32(timeout.components.seconds * 1000)
    while true {
        let n = poll(&entry, 1, ms)
        if n > 0 { return entry.revents & Int16(POLLOUT) != 0 }
        if n == 0 || errno != EINTR { return false }
    }
}

/// A pipe named by its inode: /proc/self/fd shows each of its ends as
/// `pipe:[inode]`, so its read end can be found, and seen closed, without
/// knowing its number (and without mistaking another file that reused it).
struct PipeIdentity {
    let inode: UInt

    init(_ fd: Int32) throws {
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw DescribedError("fstat \(fd): \(String(cString: strerror(errno)))") }
        inode = UInt(info.st_ino)
    }

    /// This process's descriptors that are an end of this pipe.
    func openEnds() -> [Int32] { Self.openEnds(of: [inode]) }

    /// This process's descriptors that are an end of a pipe in `inodes`.
    static func openEnds(of inodes: Set<UInt>) -> [Int32] {
        let names = Set(inodes.map { "pipe:[\($0)]" })
        return ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap { entry in
            guard let fd = Int32(entry), let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + entry),
                  names.contains(target) else { return nil }
            return fd
        }
    }
}
