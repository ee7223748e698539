import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// Helpers for wake tests on a ManualClock (a namespace, so that names do
/// not collide with other test files of this target).
enum WakeTesting {
    /// Waits until `condition` holds, yielding between checks (never sleeping);
    /// records an issue if it does not hold within 120 s of real time. The
    /// bound only guards against a hang: in the whole suite other tests keep
    /// the two cooperative threads busy for seconds at a time (a 100,000-part
    /// config parse, 10,000 strategies), and the condition's work waits for them.
    static func waitUntil(_ what: String, _ condition: () async -> Bool) async {
        let giveUp = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < giveUp {
            if await condition() { return }
            await Task.yield()
        }
        Issue.record("timed out waiting until \(what)")
    }

    /// True when no test timer is delivering an expiry (the delivery re-arms)
    /// and every armed one has its sleeper registered with `clock`.
    private static func timersSettled(_ clock: ManualClock, _ timers: [ClockDrivenWakeTimer]) -> Bool {
        let armed = timers.compactMap(\.armedDeadline)
        return !timers.contains(where: \.isDeliveringExpiry)
            && clock.sleeperCount == armed.count
            && clock.nextDeadline == armed.min()
    }

    /// Waits until `scheduler` holds `pending` requests and its test timers are
    /// settled, so that advancing the clock cannot overtake work in flight.
    static func quiesce(_ scheduler: WakeScheduler, _ clock: ManualClock, timers: [ClockDrivenWakeTimer], pending: @autoclosure () -> Int) async {
        await WakeTesting.waitUntil("the scheduler holds \(pending()) requests and its timers are settled") {
            let count = await scheduler.pendingCount
            return count == pending() && timersSettled(clock, timers)
        }
    }

    /// Moves `clock` to `target` one armed deadline at a time, letting each
    /// expiry's re-arming land before time moves on.
    static func advance(_ clock: ManualClock, to target: VigilInstant, timers: [ClockDrivenWakeTimer]) async {
        while true {
            await WakeTesting.waitUntil("the timers are settled") { timersSettled(clock, timers) }
            guard let next = timers.compactMap(\.armedDeadline).min(), next <= target else { break }
            await clock.advance(to: next)
        }
        await clock.advance(to: target)
    }
}

/// A counter shared between test tasks.
final class WakeTestCounter: Sendable {
    private let count: Lock<Int>
    init(_ initial: Int) { count = Lock(initial) }
    var value: Int { count.withLock { $0 } }
    func decrement() { count.withLock { $0 -= 1 } }
}

/// The scheduler on a ManualClock: hours of scheduling in milliseconds.
@Suite struct WakeSchedulerTests {
    private func manualScheduler() -> (ManualClock, ClockDrivenWakeTimer, WakeScheduler) {
        let clock = ManualClock()
        let timer = ClockDrivenWakeTimer(clock: clock)
        return (clock, timer, WakeScheduler(clock: clock, timer: timer))
    }

    /// Wall time minus boottime on `clock`, in nanoseconds.
    private func wallOffset(_ clock: ManualClock) -> Int64 {
        clock.wallMicroseconds * 1_000 - clock.now.nanoseconds
    }

    @Test func periodicRequestersCoalesceAndStayInTheirWindows() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let start = clock.now
        let end = start + .seconds(2 * 3600)
        let period = Duration.seconds(600)
        let window = Duration.seconds(60)
        // Five periodic-wake-like loops with different phases: three within a
        // minute of each other, two others three minutes later.
        let phases: [Duration] = [.seconds(0), .seconds(20), .seconds(40), .seconds(180), .seconds(210)]
        let runningLoops = WakeTestCounter(phases.count)
        let fired = try await withThrowingTaskGroup(of: Int.self) { group in
            for (index, phase) in phases.enumerated() {
                group.addTask {
                    var count = 0
                    var next = start + phase
                    while next < end {
                        let request = WakeRequest(earliest: next, latest: next + window, label: "loop \(index)")
                        let firing = try await scheduler.wake(request)
                        #expect(firing.firedAt >= request.earliest, "loop \(index) fired before its earliest")
                        #expect(firing.firedAt <= request.latest, "loop \(index) fired after its latest")
                        #expect(firing.target >= request.earliest && firing.target <= request.latest)
                        count += 1
                        next = next + period
                    }
                    runningLoops.decrement()
                    return count
                }
            }
            // Step from one armed deadline to the next, each time after every
            // running loop has registered its next request.
            while true {
                await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: runningLoops.value)
                guard let deadline = timer.armedDeadline else { break }
                await clock.advance(to: deadline)
            }
            var total = 0
            for try await count in group { total += count }
            return total
        }
        let instancesTimesPeriods = phases.count * 12
        #expect(fired == instancesTimesPeriods)
        let stats = await scheduler.statistics
        #expect(stats.requestsFired == instancesTimesPeriods)
        #expect(stats.timerExpirations < instancesTimesPeriods)
        // Per period: {0s, 20s, 40s} fire together at 60s, {180s, 210s} at 240s.
        #expect(stats.batchesFired == 2 * 12)
        #expect(stats.timerExpirations == 2 * 12)
        #expect(stats.wakeupsSaved == instancesTimesPeriods - 24)
        #expect(stats.coalescedRequests == instancesTimesPeriods)
        #expect(stats.maxLateness == .zero)
        #expect(await scheduler.pendingCount == 0)
        #expect(timer.armedDeadline == nil)
    }

    @Test func alignedRequestsFireTogetherAtASlotBoundaryAcrossSchedulers() async throws {
        // Two schedulers stand for two processes on the same host.
        let clock = ManualClock()
        let firstTimer = ClockDrivenWakeTimer(clock: clock)
        let secondTimer = ClockDrivenWakeTimer(clock: clock)
        let first = WakeScheduler(clock: clock, timer: firstTimer)
        let second = WakeScheduler(clock: clock, timer: secondTimer)
        let slot = Duration.seconds(300)
        let offset = wallOffset(clock)
        let soonWall = (clock.now + .seconds(240)).nanoseconds + offset
        let boundary = VigilInstant(nanoseconds: (soonWall / slot.nanoseconds + 1) * slot.nanoseconds - offset)

        // Windows that both contain `boundary` and end at different times.
        let a = WakeRequest(earliest: boundary - .seconds(180), latest: boundary + .seconds(60), align: slot, label: "a")
        let b = WakeRequest(earliest: boundary - .seconds(60), latest: boundary + .seconds(120), align: slot, label: "b")
        // Not aligned, but its window overlaps: it joins the first batch.
        let c = WakeRequest(earliest: boundary - .seconds(200), latest: boundary + .seconds(200), label: "c")
        async let firingA = first.wake(a)
        async let firingB = second.wake(b)
        async let firingC = first.wake(c)
        await WakeTesting.waitUntil("all three requests are pending") {
            let (inFirst, inSecond) = (await first.pendingCount, await second.pendingCount)
            return inFirst == 2 && inSecond == 1
        }
        #expect(await first.nextTarget == boundary)
        #expect(await second.nextTarget == boundary)
        await WakeTesting.advance(clock, to: boundary + .seconds(600), timers: [firstTimer, secondTimer])
        let (fa, fb, fc) = try await (firingA, firingB, firingC)
        #expect(fa.firedAt == boundary)
        #expect(fb.firedAt == boundary)
        #expect(fc.firedAt == boundary)
        #expect((fa.firedAt.nanoseconds + offset) % slot.nanoseconds == 0)
        #expect(fa.batchSize == 2)
        #expect(fb.batchSize == 1)
    }

    @Test func alignmentFallsBackToLatestWithoutABoundaryInTheWindow() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let slot = Duration.seconds(3600)
        let offset = wallOffset(clock)
        let nowWall = clock.now.nanoseconds + offset
        // A window that lies strictly between two slot boundaries.
        let nextBoundary = VigilInstant(nanoseconds: (nowWall / slot.nanoseconds + 1) * slot.nanoseconds - offset)
        let request = WakeRequest(earliest: nextBoundary + .seconds(10), latest: nextBoundary + .seconds(20), align: slot, label: "x")
        async let firing = scheduler.wake(request)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 1)
        #expect(await scheduler.nextTarget == request.latest)
        await WakeTesting.advance(clock, to: request.latest + .seconds(1), timers: [timer])
        #expect(try await firing.firedAt == request.latest)
    }

    @Test func cancellationWithdrawsTheRequestAndRearmsToTheNext() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let now = clock.now
        let early = WakeRequest(earliest: now + .seconds(60), latest: now + .seconds(120), label: "early")
        let late = WakeRequest(earliest: now + .seconds(300), latest: now + .seconds(360), label: "late")
        let earlyTask = Task { try await scheduler.wake(early) }
        let lateTask = Task { try await scheduler.wake(late) }
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 2)
        #expect(timer.armedDeadline == early.latest)
        #expect(clock.nextDeadline == early.latest)
        let armingsBefore = timer.armCount

        earlyTask.cancel()
        await #expect(throws: CancellationError.self) { try await earlyTask.value }
        #expect(await scheduler.pendingCount == 1)
        #expect(timer.armedDeadline == late.latest)
        #expect(timer.armCount == armingsBefore + 1)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 1)
        #expect(clock.nextDeadline == late.latest)

        await WakeTesting.advance(clock, to: now + .seconds(600), timers: [timer])
        let firing = try await lateTask.value
        #expect(firing.firedAt == late.latest)
        #expect(firing.batchSize == 1)
        let stats = await scheduler.statistics
        #expect(stats.withdrawnRequests == 1)
        #expect(stats.requestsFired == 1)
        #expect(stats.timerExpirations == 1)
    }

    @Test func rearmsOnlyWhenTheFirstTargetChanges() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let now = clock.now
        let first = Task { try await scheduler.wake(WakeRequest(earliest: now + .seconds(10), latest: now + .seconds(20), label: "1")) }
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 1)
        #expect(timer.armCount == 1)
        // Later target: the timer stays as it is.
        let second = Task { try await scheduler.wake(WakeRequest(earliest: now + .seconds(30), latest: now + .seconds(40), label: "2")) }
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 2)
        #expect(timer.armCount == 1)
        // Earlier target: re-armed.
        let third = Task { try await scheduler.wake(WakeRequest(earliest: now + .seconds(5), latest: now + .seconds(15), label: "3")) }
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 3)
        #expect(timer.armCount == 2)
        #expect(timer.armedDeadline == now + .seconds(15))
        await WakeTesting.advance(clock, to: now + .seconds(60), timers: [timer])
        let (f1, f2, f3) = try await (first.value, second.value, third.value)
        #expect(f3.firedAt == now + .seconds(15))
        #expect(f1.firedAt == now + .seconds(15))  // earliest 10 <= 15: coalesced
        #expect(f1.batchSize == 2)
        #expect(f2.firedAt == now + .seconds(40))
    }

    @Test func pastDueRequestFiresAtOnce() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let now = clock.now
        let request = WakeRequest(earliest: now - .seconds(120), latest: now - .seconds(60), label: "late caller")
        let firing = try await scheduler.wake(request)  // no clock advance needed
        #expect(firing.firedAt == now)
        #expect(firing.batchSize == 1)
        #expect(timer.armCount == 0)
        let stats = await scheduler.statistics
        #expect(stats.pastDueRequests == 1)
        #expect(stats.requestsFired == 1)
        #expect(stats.timerExpirations == 0)
    }

    @Test func startedWindowFiresAtItsPreferredTimeNotAtOnce() async throws {
        let (clock, timer, scheduler) = manualScheduler()
        let now = clock.now
        let request = WakeRequest(earliest: now - .seconds(10), latest: now + .seconds(10), label: "open window")
        async let firing = scheduler.wake(request)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 1)
        await WakeTesting.advance(clock, to: now + .seconds(30), timers: [timer])
        #expect(try await firing.firedAt == request.latest)
    }

    @Test func wakeSystemRequestsUseOnlyTheAlarmTimer() async throws {
        let clock = ManualClock()
        let timer = ClockDrivenWakeTimer(clock: clock, clockName: "CLOCK_BOOTTIME")
        let alarm = ClockDrivenWakeTimer(clock: clock, clockName: "CLOCK_BOOTTIME_ALARM")
        let scheduler = WakeScheduler(clock: clock, timer: timer, alarmTimer: alarm)
        let now = clock.now
        let ordinary = WakeRequest(earliest: now + .seconds(60), latest: now + .seconds(120), label: "heartbeat")
        let waking = WakeRequest(earliest: now + .seconds(180), latest: now + .seconds(240), wakeSystem: true, label: "alarm")
        async let ordinaryFiring = scheduler.wake(ordinary)
        async let wakingFiring = scheduler.wake(waking)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarm], pending: 2)
        #expect(timer.armedDeadline == ordinary.latest)
        #expect(alarm.armedDeadline == waking.latest)

        await WakeTesting.advance(clock, to: ordinary.latest, timers: [timer, alarm])
        #expect(try await ordinaryFiring.onAlarmClock == false)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarm], pending: 1)
        #expect(timer.armedDeadline == nil)  // nothing ordinary before the alarm
        #expect(alarm.armedDeadline == waking.latest)

        await WakeTesting.advance(clock, to: waking.latest + .seconds(1), timers: [timer, alarm])
        let firing = try await wakingFiring
        #expect(firing.onAlarmClock)
        #expect(firing.firedAt == waking.latest)
        #expect(alarm.armedDeadline == nil)
        #expect(await scheduler.statistics.alarmBatches == 1)
    }

    @Test func ordinaryRequestsJoinAnAlarmBatchWithoutASecondTimer() async throws {
        let clock = ManualClock()
        let timer = ClockDrivenWakeTimer(clock: clock)
        let alarm = ClockDrivenWakeTimer(clock: clock, clockName: "CLOCK_BOOTTIME_ALARM")
        let scheduler = WakeScheduler(clock: clock, timer: timer, alarmTimer: alarm)
        let now = clock.now
        let waking = WakeRequest(earliest: now + .seconds(60), latest: now + .seconds(120), wakeSystem: true, label: "alarm")
        let ordinary = WakeRequest(earliest: now + .seconds(90), latest: now + .seconds(300), label: "heartbeat")
        async let wakingFiring = scheduler.wake(waking)
        async let ordinaryFiring = scheduler.wake(ordinary)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarm], pending: 2)
        #expect(alarm.armedDeadline == waking.latest)
        #expect(timer.armedDeadline == nil)
        await WakeTesting.advance(clock, to: now + .seconds(400), timers: [timer, alarm])
        let (w, o) = try await (wakingFiring, ordinaryFiring)
        #expect(w == o)
        #expect(w.batchSize == 2 && w.onAlarmClock)
        #expect(await scheduler.statistics.timerExpirations == 1)
    }

    @Test func clockInfoOfATestScheduler() {
        let (_, _, scheduler) = manualScheduler()
        #expect(scheduler.clockInfo.clock == "test")
        #expect(!scheduler.clockInfo.canWakeSystem)
        #expect(!scheduler.clockInfo.reason.isEmpty)
    }
}

/// How the probe turns what it found into a report.
@Suite struct WakeClockProbeTests {
    private func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-rtc-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    @Test func withoutCapWakeAlarm() {
        let probe = WakeClockProbe(alarmCreationError: WakeTimerError(operation: "timerfd_create(CLOCK_BOOTTIME_ALARM)", code: EPERM), rtcDevices: ["rtc0"], rtcDevicesWithWakeAlarm: ["rtc0"], rtcDirectory: "/sys/class/rtc")
        let info = probe.clockInfo
        #expect(info.clock == "CLOCK_BOOTTIME")
        #expect(!info.canWakeSystem)
        #expect(info.reason.contains("EPERM"))
        #expect(info.reason.contains("CAP_WAKE_ALARM"))
    }

    @Test func permittedWithoutRTC() throws {
        let empty = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: empty) }
        for directory in [empty.path, empty.path + "/missing"] {
            let rtc = WakeClockProbe.rtcDevices(in: directory)
            #expect(rtc.all.isEmpty)
            let info = WakeClockProbe(alarmCreationError: nil, rtcDevices: rtc.all, rtcDevicesWithWakeAlarm: rtc.withWakeAlarm, rtcDirectory: directory).clockInfo
            #expect(info.clock == "CLOCK_BOOTTIME_ALARM")
            #expect(!info.canWakeSystem)
            #expect(info.reason.contains("no RTC"))
        }
    }

    @Test func permittedWithRTC() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let fm = FileManager.default
        try fm.createDirectory(atPath: directory.path + "/rtc0", withIntermediateDirectories: true)
        var rtc = WakeClockProbe.rtcDevices(in: directory.path)
        #expect(rtc.all == ["rtc0"] && rtc.withWakeAlarm.isEmpty)
        var info = WakeClockProbe(alarmCreationError: nil, rtcDevices: rtc.all, rtcDevicesWithWakeAlarm: rtc.withWakeAlarm, rtcDirectory: directory.path).clockInfo
        #expect(!info.canWakeSystem)
        #expect(info.reason.contains("wakealarm"))

        #expect(fm.createFile(atPath: directory.path + "/rtc0/wakealarm", contents: Data()))
        rtc = WakeClockProbe.rtcDevices(in: directory.path)
        info = WakeClockProbe(alarmCreationError: nil, rtcDevices: rtc.all, rtcDevicesWithWakeAlarm: rtc.withWakeAlarm, rtcDirectory: directory.path).clockInfo
        #expect(info.canWakeSystem)
        #expect(info.clock == "CLOCK_BOOTTIME_ALARM")
    }
}
