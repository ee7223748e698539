import Foundation
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// The scheduler on real timerfds, with short real times.
@Suite(.serialized) struct WakeTimerFDTests {
    let clock = SystemClock()
    /// Lateness is a speed figure, measured by `vigil-bench wake-latency`,
    /// not asserted here: on a loaded 2-core VM (the suite builds plugin
    /// packages in parallel) a wakeup can be delayed by more than a second.
    /// Tests check what the scheduler guarantees: never early, lateness
    /// recorded as fired minus planned.

    /// Whether /sys/class/rtc holds an RTC device, read independently of the probe.
    private var hostHasRTC: Bool {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/sys/class/rtc")) ?? []
        return names.contains { $0.hasPrefix("rtc") }
    }

    @Test func requestFiresWithinItsWindowAndRecordsLateness() async throws {
        let scheduler = try WakeScheduler.system()
        let now = clock.now
        let request = WakeRequest(earliest: now + .milliseconds(50), latest: now + .milliseconds(60), label: "real")
        let firing = try await scheduler.wake(request)
        let resumedAt = clock.now
        #expect(firing.target == request.latest)
        #expect(firing.firedAt >= request.earliest)
        #expect(firing.firedAt >= firing.target)  // an absolute timerfd never fires early
        #expect(firing.lateness == firing.firedAt - firing.target)
        #expect(resumedAt >= firing.firedAt)
        #expect(!firing.onAlarmClock)
        let stats = await scheduler.statistics
        #expect(stats.timerExpirations == 1)
        #expect(stats.batchesFired == 1)
        #expect(stats.maxLateness == firing.lateness)
        #expect(stats.meanLateness == firing.lateness)
    }

    /// The expiry reaches the scheduler in a task of high priority (see
    /// docs/wake-scheduler.md, "Priority"): Swift's pool runs those on
    /// threads of their own, so busy default-priority threads do not hold
    /// up a wake.
    @Test func expiryIsDeliveredAtHighPriority() async throws {
        let timer = try TimerFDWakeTimer()
        defer { timer.invalidate() }
        let seen = WaitableLog<TaskPriority>()
        timer.setExpiryHandler { seen.append(Task.currentPriority) }
        timer.arm(at: clock.now + .milliseconds(20))
        #expect(await seen.wait { !$0.isEmpty })
        #expect(seen.all == [.high])
    }

    @Test func overlappingRequestsShareOneExpiry() async throws {
        let scheduler = try WakeScheduler.system()
        let now = clock.now
        // Windows wide enough that both requests are placed before the
        // first is due even when the suite loads both cores (an `async let`
        // child started 560 ms late once, with the voip-socket suites
        // running beside it).
        async let a = scheduler.wake(WakeRequest(earliest: now + .milliseconds(1000), latest: now + .milliseconds(1500), label: "a"))
        async let b = scheduler.wake(WakeRequest(earliest: now + .milliseconds(1200), latest: now + .milliseconds(2500), label: "b"))
        let (fa, fb) = try await (a, b)
        #expect(fa == fb)
        #expect(fa.batchSize == 2)
        #expect(fa.target == now + .milliseconds(1500))
        #expect(await scheduler.statistics.timerExpirations == 1)
    }

    @Test func cancellationWithdrawsAndTheTimerRearms() async throws {
        let scheduler = try WakeScheduler.system()
        let now = clock.now
        let far = WakeRequest(earliest: now + .seconds(10), latest: now + .seconds(11), label: "far")
        let farTask = Task { try await scheduler.wake(far) }
        await WakeTesting.waitUntil("the far request is pending") { await scheduler.pendingCount == 1 }
        #expect(await scheduler.armedDeadlines.ordinary == far.latest)

        farTask.cancel()
        await #expect(throws: CancellationError.self) { try await farTask.value }
        // The actor hop orders this read after the withdrawal and its re-arm.
        #expect(await scheduler.pendingCount == 0)
        #expect(await scheduler.armedDeadlines.ordinary == nil)

        // The timer still works after being disarmed.
        let start = clock.now
        let near = WakeRequest(earliest: start + .milliseconds(20), latest: start + .milliseconds(30), label: "near")
        let firing = try await scheduler.wake(near)
        #expect(firing.target == near.latest)
        #expect(firing.lateness == firing.firedAt - firing.target)
        #expect(clock.now < now + .seconds(10))  // did not wait for the far one
        let stats = await scheduler.statistics
        #expect(stats.withdrawnRequests == 1)
        #expect(stats.requestsFired == 1)
        #expect(stats.timerExpirations == 1)
    }

    @Test func clockInfoReportsAlarmPermissionAndRTC() throws {
        let scheduler = try WakeScheduler.system()
        let info = scheduler.clockInfo
        let probe = WakeClockProbe.run().probe
        if probe.alarmTimerUsable {
            #expect(info.clock == "CLOCK_BOOTTIME_ALARM")
            #expect(info.reason.contains("permitted"))
            if !hostHasRTC {
                #expect(!info.canWakeSystem)
                #expect(info.reason.contains("RTC"))
            }
        } else {
            #expect(info.clock == "CLOCK_BOOTTIME")
            #expect(!info.canWakeSystem)
            #expect(info.reason.contains("CAP_WAKE_ALARM") || info.reason.contains("EINVAL"))
        }
    }

    @Test func wakeSystemRequestFiresOnTheAlarmTimerWherePermitted() async throws {
        let scheduler = try WakeScheduler.system()
        guard scheduler.clockInfo.clock == "CLOCK_BOOTTIME_ALARM" else {
            // No alarm timer here: the request still fires, on CLOCK_BOOTTIME.
            let now = clock.now
            let firing = try await scheduler.wake(WakeRequest(earliest: now + .milliseconds(20), latest: now + .milliseconds(30), wakeSystem: true, label: "alarm"))
            #expect(!firing.onAlarmClock)
            return
        }
        let now = clock.now
        // As above: room for late-starting `async let` children.
        let waking = WakeRequest(earliest: now + .milliseconds(500), latest: now + .milliseconds(600), wakeSystem: true, label: "alarm")
        let ordinary = WakeRequest(earliest: now + .milliseconds(200), latest: now + .milliseconds(300), label: "heartbeat")
        async let wakingFiring = scheduler.wake(waking)
        async let ordinaryFiring = scheduler.wake(ordinary)
        let o = try await ordinaryFiring
        #expect(!o.onAlarmClock)
        let w = try await wakingFiring
        #expect(w.onAlarmClock)
        #expect(w.target == waking.latest)
        #expect(w.firedAt >= w.target)
        let stats = await scheduler.statistics
        #expect(stats.alarmBatches == 1)
        #expect(stats.batchesFired == 2)
    }
}
