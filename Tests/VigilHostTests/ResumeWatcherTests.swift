import Foundation
import Testing
@testable import VigilHost
import VigilKit
import VigilSurvival
import CTestExecutor
import VigilTestSupport

/// The resume watcher's kernel side: a `CLOCK_REALTIME` timerfd armed with
/// `TFD_TIMER_CANCEL_ON_SET`, watched on the loop. The kernel makes it ready
/// on a resume or when anyone sets the wall clock; neither is done here (a
/// suspend needs the machine, and setting the clock would change it for
/// every process on it: the guest test in Tests/Guest suspends for real and
/// checks each wake's attribution, which starts here). The tests wake the
/// same descriptor with `TFD_IOC_SET_TICKS`, which makes it readable as the
/// kernel's cancellation does and touches nothing else (its read then
/// returns a count, not ECANCELED: the watcher looks at neither), and give
/// the watcher clock readings in which the suspend happened.
@Suite struct ResumeWatcherTests {
    @Test func armsACancelOnSetRealtimeTimerAndStaysIdle() async throws {
        let clocks = ResumeClocks()
        let resumes = Resumes()
        let watcher = try ResumeWatcher(readings: clocks.read, handler: resumes.record)
        let fd = watcher.fd
        defer { watcher.invalidate() }

        let info = try #require(ResumeTimerFD.info(fd))
        #expect(info.clockID == 0, "not CLOCK_REALTIME: \(info)")
        #expect(info.settimeFlags == 0o3, "not TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET: \(info)")
        // Armed for a date far off (it never simply expires: only a resume
        // or a clock change makes it ready).
        #expect(info.secondsLeft > 100 * 365 * 86_400, "\(info)")

        // Idle: nothing is ready, so the loop never calls it.
        await loopTurns()
        #expect(!ResumeTimerFD.readable(fd))
        #expect(clocks.reads == 1, "read the clocks \(clocks.reads - 1) times with nothing changed")
        #expect(resumes.all.isEmpty)
    }

    @Test func aWakeReadsTheClocksOnTheLoopAndReportsTheTimeSuspended() async throws {
        let clocks = ResumeClocks()
        let resumes = Resumes()
        let watcher = try ResumeWatcher(readings: clocks.read, handler: resumes.record)
        let fd = watcher.fd
        defer { watcher.invalidate() }

        // A resume after 42 s asleep: CLOCK_BOOTTIME ran on, CLOCK_MONOTONIC did not.
        clocks.suspend(micros: 42_000_000)
        #expect(ResumeTimerFD.wake(fd) == 0, "TFD_IOC_SET_TICKS: \(String(cString: strerror(errno)))")
        let first = try #require(await resumes.wait(count: 1))
        #expect(first.map(\.suspendedMicros) == [42_000_000])
        #expect(first.first?.readings == clocks.now)
        #expect(clocks.reads == 2)
        #expect(clocks.readsOffLoop == 0, "the clocks were read off the loop")

        // The wake was consumed, not left ready (the loop would call it on
        // every turn: reading the timerfd and arming it again each clear
        // it), and the timerfd is armed again for the next resume.
        await loopTurns()
        #expect(clocks.reads == 2, "woke \(clocks.reads - 2) more times with nothing new")
        #expect(!ResumeTimerFD.readable(fd))
        let info = try #require(ResumeTimerFD.info(fd))
        #expect(info.settimeFlags == 0o3 && info.secondsLeft > 100 * 365 * 86_400, "not armed again: \(info)")

        // A wake with the clocks' offset as it was, or grown by less than
        // the gap rule's threshold, is a clock set: read, not reported.
        #expect(ResumeTimerFD.wake(fd) == 0)
        #expect(await clocks.wait(reads: 3), "a second wake was not seen")
        clocks.suspend(micros: 500_000)
        #expect(ResumeTimerFD.wake(fd) == 0)
        #expect(await clocks.wait(reads: 4), "a third wake was not seen")
        await loopTurns()
        #expect(clocks.reads == 4)
        #expect(resumes.all.count == 1)

        // The next resume counts from the last wake, not from the start.
        clocks.suspend(micros: 7_000_000)
        #expect(ResumeTimerFD.wake(fd) == 0)
        let both = try #require(await resumes.wait(count: 2))
        #expect(both.map(\.suspendedMicros) == [42_000_000, 7_000_000])
    }

    @Test func invalidateAndDeinitStopTheWatchAndCloseTheTimerfd() async throws {
        let clocks = ResumeClocks()
        let resumes = Resumes()
        let watcher = try ResumeWatcher(readings: clocks.read, handler: resumes.record)
        let fd = watcher.fd
        let probe = try ResumeTimerFD.Probe(fd)
        #expect(probe.stillOpen, "the probe does not see the timerfd")

        watcher.invalidate()
        await loopTurns()
        #expect(!probe.stillOpen, "the timerfd is still open after invalidate()")
        watcher.invalidate()  // a second call does nothing
        #expect(clocks.reads == 1)
        #expect(resumes.all.isEmpty)

        // Dropped without invalidate(): deinit does it.
        let droppedProbe: ResumeTimerFD.Probe
        do {
            let dropped = try ResumeWatcher(readings: clocks.read, handler: resumes.record)
            droppedProbe = try ResumeTimerFD.Probe(dropped.fd)
            #expect(droppedProbe.stillOpen)
        }
        await loopTurns()
        #expect(!droppedProbe.stillOpen, "the timerfd is still open after the watcher went away")
    }
}

/// Clock readings the test moves: each `suspend` adds to CLOCK_BOOTTIME
/// only, as a resume does. Counts its reads, and those off the loop (the
/// watcher reads them at init, then only on the loop).
final class ResumeClocks: Sendable {
    private struct State {
        var now = ClockReadings(wallMicros: 1_800_000_000_000_000, monotonicMicros: 5_000_000_000, boottimeMicros: 5_000_000_000)
        var readsOffLoop = 0
    }
    private let state = Lock(State())
    private let counted = WaitableCount()

    var now: ClockReadings { state.withLock { $0.now } }
    var reads: Int { counted.value }
    /// Reads after the first (made by init, on the test's thread) that were not on the loop.
    var readsOffLoop: Int { state.withLock { $0.readsOffLoop } }

    var read: @Sendable () -> ClockReadings {
        { [self] in
            let onLoop = EventLoop.isCurrent
            let first = counted.value == 0
            let now = state.withLock { state in
                if !first && !onLoop { state.readsOffLoop += 1 }
                return state.now
            }
            counted.add()
            return now
        }
    }

    /// Waits until the clocks were read `reads` times; false after `timeout`.
    func wait(reads: Int, timeout: Duration = .seconds(30)) async -> Bool {
        await counted.wait(for: reads, timeout: timeout)
    }

    func suspend(micros: Int64) {
        state.withLock { state in
            state.now.boottimeMicros += micros
            state.now.wallMicros += micros
        }
    }
}

/// The resumes a watcher reported, in order.
final class Resumes: Sendable {
    struct Resume: Sendable, Equatable {
        var readings: ClockReadings
        var suspendedMicros: Int64
    }
    private let state = Lock<[Resume]>([])
    private let counted = WaitableCount()

    var all: [Resume] { state.withLock { $0 } }

    var record: @Sendable (ClockReadings, Int64) async -> Void {
        { [self] readings, slept in
            state.withLock { $0.append(Resume(readings: readings, suspendedMicros: slept)) }
            counted.add()
        }
    }

    /// The resumes once there are `count`; nil after `timeout` (a bound for
    /// a broken run, not a measure).
    func wait(count: Int, timeout: Duration = .seconds(30)) async -> [Resume]? {
        await counted.wait(for: count, timeout: timeout) ? all : nil
    }
}

/// Looking at and poking a resume watcher's timerfd.
enum ResumeTimerFD {
    struct Info: CustomStringConvertible {
        var clockID: Int
        var settimeFlags: Int
        var secondsLeft: Int64
        var description: String { "clockid \(clockID), settime flags 0\(String(settimeFlags, radix: 8)), \(secondsLeft) s left" }
    }

    /// What /proc/self/fdinfo says of a timerfd (fs/timerfd.c,
    /// timerfd_show); nil for another kind of descriptor.
    static func info(_ fd: Int32) -> Info? {
        guard (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")) == "anon_inode:[timerfd]",
              let text = try? String(contentsOfFile: "/proc/self/fdinfo/\(fd)", encoding: .utf8) else { return nil }
        var fields: [String: String] = [:]
        for line in text.split(separator: "\n") {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields[String(line[..<colon])] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        // "it_value: (seconds, nanoseconds)", the time left.
        let left = fields["it_value"]?.trimmingCharacters(in: CharacterSet(charactersIn: "()")).split(separator: ",").first
        guard let clock = fields["clockid"].flatMap({ Int($0) }), let flags = fields["settime flags"].flatMap({ Int($0, radix: 8) }),
              let seconds = left.flatMap({ Int64($0.trimmingCharacters(in: .whitespaces)) }) else { return nil }
        return Info(clockID: clock, settimeFlags: flags, secondsLeft: seconds)
    }

    /// Makes the timerfd readable, as a resume or a clock set does, and
    /// nothing else: `TFD_IOC_SET_TICKS` (Linux, CONFIG_CHECKPOINT_RESTORE).
    /// Returns 0, or -1 with errno set.
    static func wake(_ fd: Int32) -> Int32 {
        var ticks: UInt64 = 1
        // _IOW('T', 0, __u64)
        return ioctl(fd, UInt(0x4008_5400), &ticks)
    }

    static func readable(_ fd: Int32) -> Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 1
    }

    /// Tells whether descriptor number `fd` still names the file it named
    /// when the probe was made: the probe's own epoll set holds that file
    /// (without keeping it open), and `EPOLL_CTL_MOD` on the number succeeds
    /// only while the number names that same file (EBADF once closed, ENOENT
    /// if the number was reused for another).
    final class Probe {
        private let epoll: Int32
        private let fd: Int32

        init(_ fd: Int32) throws {
            epoll = vigil_test_epoll_probe(fd)
            self.fd = fd
            guard epoll >= 0 else { throw DescribedError("epoll probe for \(fd): \(String(cString: strerror(errno)))") }
        }

        deinit { close(epoll) }

        var stillOpen: Bool { vigil_test_epoll_probe_holds(epoll, fd) == 1 }
    }
}
