import CVigilLoop
import CTestExecutor
import Glibc
import Testing
import VigilKit

/// vigild's global executor and timer threads (Plugins/VigilKit/Sources/CVigilLoop), driven
/// from many tasks at once: Scripts/sanitize runs these under
/// ThreadSanitizer, with the test bundle itself on the executor.
@Suite struct ExecutorTests {
    @Test func theBundleRunsOnVigildsExecutorWhenAsked() async throws {
        guard vigil_test_executor_installed() == 1 else { return }  // VIGIL_TEST_EXECUTOR=1 only
        let before = vigil_executor_statistics()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<50 { group.addTask { await Task.yield() } }
        }
        let after = vigil_executor_statistics()
        #expect(after.jobs_run > before.jobs_run)
    }

    @Test func timersScheduledAndCancelledFromManyTasksRunExactlyOnce() async throws {
        let box = Unmanaged.passRetained(FiredBox())
        defer { box.release() }
        let callbacks: [(id: UInt64, cancelled: Bool)] = await withTaskGroup(of: [(UInt64, Bool)].self) { group in
            for task in 0..<8 {
                group.addTask {
                    var mine: [(UInt64, Bool)] = []
                    for i in 0..<100 {
                        var now = timespec()
                        clock_gettime(CLOCK_MONOTONIC, &now)
                        let deadline = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec) + Int64((task * 7 + i) % 20) * 100_000
                        let id = vigil_timer_schedule(1, deadline, { context in
                            guard let context else { return }
                            Unmanaged<FiredBox>.fromOpaque(context).takeUnretainedValue().record()
                        }, box.toOpaque())
                        #expect(id != 0)
                        let cancelled = i % 2 == 0 && vigil_timer_cancel(1, id) == 1
                        mine.append((id, cancelled))
                        if i % 10 == 0 { await Task.yield() }
                    }
                    return mine
                }
            }
            var all: [(UInt64, Bool)] = []
            for await part in group { all += part }
            return all
        }
        let expected = callbacks.filter { !$0.cancelled }.count
        // Every deadline is at most 2 ms away.
        let deadline = ContinuousClock.now + .seconds(10)
        while box.takeUnretainedValue().count < expected, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        try await Task.sleep(for: .milliseconds(20))
        #expect(box.takeUnretainedValue().count == expected)
    }

    /// A watched pipe: its handler runs on the loop for each write, reads
    /// what is there, and stops being called once cancelled; the release
    /// runs after, on the loop, where the fd is closed.
    @Test func aWatchReportsEachWriteUntilCancelledThenReleasesOnTheLoop() async throws {
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        _ = fcntl(readEnd, F_SETFL, O_NONBLOCK)
        let (reads, readsIn) = AsyncStream.makeStream(of: (bytes: Int, onLoop: Bool).self)
        let (released, releasedIn) = AsyncStream.makeStream(of: Bool.self)
        let watch = try EventLoop.watch(readEnd, for: .readable) { events in
            var buffer = [UInt8](repeating: 0, count: 64)
            let n = read(readEnd, &buffer, buffer.count)
            readsIn.yield((n, EventLoop.isCurrent && events.contains(.readable)))
        } released: {
            close(readEnd)
            releasedIn.yield(EventLoop.isCurrent)
            releasedIn.finish()
        }
        var iterator = reads.makeAsyncIterator()
        for round in 1...3 {
            let bytes = [UInt8](repeating: UInt8(round), count: round)
            #expect(write(writeEnd, bytes, bytes.count) == round)
            let read = await iterator.next()
            #expect(read?.bytes == round)
            #expect(read?.onLoop == true)
        }
        watch.cancel()
        watch.cancel()  // a second cancel does nothing
        var releases = 0
        for await onLoop in released {
            #expect(onLoop)
            releases += 1
        }
        #expect(releases == 1)
        // No read came after the three. (Whether the release closed the read
        // end cannot be checked by its number: other suites reuse it.)
        readsIn.finish()
        #expect(await iterator.next() == nil)
        close(writeEnd)
    }

    /// Watches made, fired and cancelled from many tasks at once, with
    /// cancels racing the handlers: every handler's read and every release
    /// happen exactly once per watch, on the loop (Scripts/sanitize runs
    /// this under ThreadSanitizer).
    @Test func watchesMadeAndCancelledFromManyTasksReleaseExactlyOnce() async throws {
        let released = FiredBox()
        let total = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var made = 0
                    for i in 0..<50 {
                        var fds: [Int32] = [-1, -1]
                        guard pipe(&fds) == 0 else { continue }
                        let (readEnd, writeEnd) = (fds[0], fds[1])
                        _ = fcntl(readEnd, F_SETFL, O_NONBLOCK)
                        let (reads, readsIn) = AsyncStream.makeStream(of: Int.self)
                        guard let watch = try? EventLoop.watch(readEnd, for: .readable, handler: { _ in
                            var byte: UInt8 = 0
                            if read(readEnd, &byte, 1) == 1 { readsIn.yield(Int(byte)) }
                        }, released: {
                            close(readEnd)
                            released.record()
                        }) else { continue }
                        made += 1
                        var byte = UInt8(i)
                        _ = write(writeEnd, &byte, 1)
                        if i % 2 == 0 {
                            // Wait for the handler, then cancel.
                            var iterator = reads.makeAsyncIterator()
                            #expect(await iterator.next() == i)
                        }
                        // Odd rounds cancel while the handler may be running.
                        watch.cancel()
                        readsIn.finish()
                        close(writeEnd)
                    }
                    return made
                }
            }
            var all = 0
            for await made in group { all += made }
            return all
        }
        #expect(total == 400)
        let deadline = ContinuousClock.now + .seconds(10)
        while released.count < total, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(released.count == total)
    }

    @Test func postedWorkRunsOnTheLoopInOrder() async throws {
        let (order, orderIn) = AsyncStream.makeStream(of: Int.self)
        for i in 0..<100 {
            EventLoop.post {
                orderIn.yield(EventLoop.isCurrent ? i : -1)
                if i == 99 { orderIn.finish() }
            }
        }
        var seen: [Int] = []
        for await i in order { seen.append(i) }
        #expect(seen == Array(0..<100))
    }

    /// `EventLoop.Timer`: its body runs once, on the loop; a timer cancelled
    /// in time never runs, and only the first cancel of it says so. While
    /// an earlier timer is pending, the cancelled one stays in the loop's
    /// heap, and a second cancel used to find it there and release its body
    /// twice. Every timer here is due before the witness on the same clock,
    /// so the loop would have run them first: waiting for the witness is
    /// enough.
    @Test func aLoopTimerRunsOnceOnTheLoopAndACancelledOneNever() async throws {
        let ran = FiredBox()
        let cancelledRan = FiredBox()
        for clock in [EventLoop.TimerClock.boottime, .monotonic] {
            _ = try EventLoop.Timer.after(.milliseconds(40), on: clock) { ran.record() }
            let cancelled = try EventLoop.Timer.after(.milliseconds(50), on: clock) { cancelledRan.record() }
            #expect(cancelled.cancel())
            #expect(!cancelled.cancel())
            let onLoop: Bool = await withCheckedContinuation { c in
                do {
                    _ = try EventLoop.Timer.after(.milliseconds(100), on: clock) {
                        ran.record()
                        c.resume(returning: EventLoop.isCurrent)
                    }
                } catch {
                    c.resume(returning: false)
                }
            }
            #expect(onLoop)
        }
        #expect(ran.count == 4)
        #expect(cancelledRan.count == 0)
    }
}

/// Counts callbacks; called on the timer thread.
final class FiredBox: Sendable {
    let calls = Lock(0)
    func record() { calls.withLock { $0 += 1 } }
    var count: Int { calls.withLock { $0 } }
}

