import Foundation
import Testing
import VigilDBus
@testable import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// The sleep cycle's logind side against the logind stand-in on a real
/// dbus-daemon: what ``LogindSleepSystem`` reads and calls, and
/// ``SleepBreaks`` following PrepareForSleep.
@Suite(.serialized) struct SleepCycleLogindTests {
    @Test func theSleepSystemReadsInhibitorsSessionsAndCallsSuspend() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let other = try await standIn.bus.connect()
        // This process's own inhibitors are vigild's: never another program's.
        let own = LogindSleepSystem(connection: host)
        let backend = LogindPowerBackend(connection: other)
        let block = try await backend.inhibit(PowerHold(what: ["sleep", "idle"], mode: "block"), who: "backup", why: "copying")
        defer { block.close() }
        let delay = try await backend.inhibit(PowerHold(what: ["sleep"], mode: "delay"), who: "player", why: "pause first")
        defer { delay.close() }
        let idleOnly = try await backend.inhibit(PowerHold(what: ["idle"], mode: "block"), who: "video", why: "playing")
        defer { idleOnly.close() }
        #expect(try await own.sleepBlockers().isEmpty)
        // The same inhibitors seen as another process's: only the sleep block one counts.
        let seenAsOthers = LogindSleepSystem(connection: host, ownPID: 1)
        let blockers = try await seenAsOthers.sleepBlockers()
        #expect(blockers.count == 1)
        #expect(blockers.first?.hasPrefix("backup (pid ") == true && blockers.first?.hasSuffix("): copying") == true, "\(blockers)")

        // Sessions: a person's session that is not idle since the resume.
        let resumeMono: Int64 = 5_000_000
        func add(_ id: String, _ klass: String, idle: Bool, since: UInt64) async throws {
            _ = try await standIn.call(other, "AddSession", [.string(id), .string("alice"), .string(klass), .bool(idle), .uint64(since)], test: true)
        }
        #expect(try await own.busySessions(since: resumeMono).isEmpty)
        try await add("1", "user", idle: true, since: 9_000_000)
        try await add("2", "manager", idle: false, since: 9_000_000)
        try await add("3", "user", idle: false, since: 1_000_000)  // active since before the suspend
        #expect(try await own.busySessions(since: resumeMono).isEmpty)
        try await add("4", "user", idle: false, since: 6_000_000)
        #expect(try await own.busySessions(since: resumeMono) == ["session 4 of alice"])

        #expect(try await own.sleepInProgress() == false)
        _ = try await standIn.call(other, "SetPreparingForSleep", [.bool(true)], test: true)
        #expect(try await own.sleepInProgress() == true)

        _ = try await standIn.call(other, "RefuseInhibits", [.uint32(1)], test: true)
        await #expect(throws: SleepSystemBusy.self) { try await own.suspend() }
        try await own.suspend()
        #expect(try await standIn.history(other).suffix(2) == ["suspend refused", "suspend"])
    }

    /// Clock readings whose boottime − monotonic grows by `slept` from the
    /// second reading on (the system slept in between).
    final class SleepingReadings: @unchecked Sendable {
        // Invariant: guarded by its lock.
        let calls = Lock(0)
        let slept: Int64
        init(slept: Int64) { self.slept = slept }
        func read() -> ClockReadings {
            let n = calls.withLock { c in
                c += 1
                return c
            }
            return ClockReadings(wallMicros: 1_750_000_000_000_000 + Int64(n), monotonicMicros: 100_000_000 + Int64(n),
                                 boottimeMicros: 200_000_000 + Int64(n) + (n > 1 ? slept : 0))
        }
    }

    @Test func aSleepWhileALeaseHoldsSleepIsReportedWithTimeSleptAndCause() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let other = try await standIn.bus.connect()
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock, backend: LogindPowerBackend(connection: host))
        let held = try await registry.acquire(strategy: "focus", LeaseRequest(
            holds: "focus", reason: "focus session", power: PowerHold(what: ["sleep"], mode: "block")))
        // Not broken: an idle-only lease and a tracked one.
        _ = try await registry.acquire(strategy: "video", LeaseRequest(holds: "screen", reason: "film", power: PowerHold(what: ["idle"], mode: "block")))
        _ = try await registry.acquire(strategy: "track", LeaseRequest(holds: "nothing", reason: "tracked"))
        let readings = SleepingReadings(slept: 30_000_000)
        let recorded = WaitableLog<BrokenSleep>()
        let breaks = SleepBreaks(registry: registry, clock: clock, readings: { readings.read() }, runStartBoottimeMicros: 100_000_000,
                                 logging: WaitableLog<LogLine>().logging, record: { broken, _ in recorded.append(broken) })
        try await breaks.watch(host)
        var told = await breaks.breaks().makeAsyncIterator()

        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(true)], test: true)
        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(false)], test: true)
        // The resume watcher explains the resume (its order against
        // PrepareForSleep(false) is not fixed; either way it is joined).
        let wake = SystemWake(wall: 0, startOffsetMicros: 0, suspendedMicros: 30_000_000, cause: .vigilAlarm, alarm: "tick periodic-wake")
        await breaks.resumed(wake, boottimeMicros: 230_000_100)
        let broken = try #require(await told.next())
        #expect(broken.leases == [BrokenSleep.Lease(id: held.rawValue, holder: "focus", name: "focus session")])
        #expect(broken.sleptMicros == 30_000_000)
        #expect(broken.wakeCause == "vigil-alarm")
        #expect(broken.startOffsetMicros == 100_000_001)
        #expect(recorded.all == [broken])
        #expect(BrokenSleep(fields: broken.fields, wall: broken.wall, startOffsetMicros: broken.startOffsetMicros) == broken)
    }

    @Test func aSleepWithoutASleepLeaseIsNotReported() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let other = try await standIn.bus.connect()
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock, backend: LogindPowerBackend(connection: host))
        let recorded = WaitableLog<BrokenSleep>()
        let logs = WaitableLog<LogLine>()
        let breaks = SleepBreaks(registry: registry, clock: clock, readings: { ClockReadings.now() }, runStartBoottimeMicros: 0,
                                 logging: logs.logging, record: { broken, _ in recorded.append(broken) })
        try await breaks.watch(host)
        var told = await breaks.breaks().makeAsyncIterator()
        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(true)], test: true)
        // The signal reaches SleepBreaks on its own connection: the lease
        // below must come after it has looked (seen in CI: taken first, so
        // that sleep was told too).
        #expect(await logs.wait(forLineContaining: "a sleep begins; no Vigil lease holds sleep"))
        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(false)], test: true)
        // A lease taken after that sleep, then a second sleep: only that one is told.
        let later = try await registry.acquire(strategy: "focus", LeaseRequest(
            holds: "focus", reason: "later", power: PowerHold(what: ["sleep"], mode: "block")))
        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(true)], test: true)
        _ = try await standIn.call(other, "EmitPrepareForSleep", [.bool(false)], test: true)
        let broken = try #require(await told.next())
        #expect(broken.leases.map(\.id) == [later.rawValue])
        #expect(broken.wakeCause == "unknown")
        #expect(recorded.count == 1)
    }

    /// vigild's runtime with the logind backend on the stand-in, on the test
    /// clock, with `scheduler` for its wake scheduler.
    struct Runtime {
        let standIn: LogindStandIn
        let other: DBusConnection
        let directory: String
        let clock: ManualClock
        let logs = WaitableLog<LogLine>()
        let runtime: HostRuntime
        let services: RunningHostServices
        let cycle: ReturnToSleep

        init(clock: ManualClock, scheduler: WakeScheduler) async throws {
            standIn = try LogindStandIn()
            let host = try await standIn.bus.connect()
            other = try await standIn.bus.connect()
            var template = Array("/tmp/vigil-sleep-cycle-XXXXXX".utf8CString)
            directory = String(cString: try #require(mkdtemp(&template)))
            let configPath = directory + "/vigil.toml"
            try "[host]\nstate_dir = \"\(directory)/state\"\nreturn_to_sleep_grace = \"2s\"\n".write(toFile: configPath, atomically: true, encoding: .utf8)
            let plugins = PluginLoader(searchPath: [])
            let loaded = try ConfigLoader.load(path: configPath, resolver: plugins)
            self.clock = clock
            runtime = try await HostRuntime.open(config: loaded, environment: HostRuntime.Environment(
                clock: clock, scheduler: scheduler,
                logging: logs.logging, power: LogindPowerBackend(connection: host), version: "9.9.9-test", plugins: plugins))
            services = await RunningHostServices(runtime, logs: logs)
            cycle = try #require(runtime.returnToSleep)
        }

        /// A resume that the tick strategy's alarm caused, and its woken
        /// run: a lease of tick's, begun and ended at once.
        func wokenByTick() async throws {
            let seen = await cycle.leaseEventsSeen
            let woke = ClockReadings.now()
            await cycle.resumed(SystemWake(wall: woke.wallMicros, startOffsetMicros: 0, suspendedMicros: 60_000_000, cause: .vigilAlarm,
                                           alarm: "tick periodic-wake", alarmStrategy: "tick", alarmKind: "periodic-wake"), readings: woke)
            let run = try await runtime.registry.acquire(strategy: "tick", LeaseRequest(holds: "command", reason: "periodic-wake run #1"))
            await runtime.registry.release(run)
            // Its acquired and released events: then the decision waits a grace.
            try await cycle.settled(seen: seen + 2, on: clock)
        }

        /// Waits (5 s at most) for logind's Suspend; true when it came.
        func suspended() async throws -> Bool {
            try await standIn.call(other, "WaitForSuspend", [.uint64(5_000_000)], test: true).argument(0, as: Bool.self)
        }

        /// Stops the host and the stand-in; the state directory stays for
        /// the test to read until ``remove()``.
        func stop() async {
            await services.stop()
            standIn.stop()
        }

        func remove() {
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// The runtime with the logind backend: a dark wake by a strategy's
    /// alarm ends in logind's Suspend, a `dark-wake` event the report reads,
    /// and the return-to-sleep counter.
    @Test func theRuntimeReturnsToSleepThroughLogindAndRecordsIt() async throws {
        let clock = ManualClock()
        let rig = try await Runtime(clock: clock, scheduler: WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock)))
        defer { rig.remove() }
        try await rig.wokenByTick()
        await clock.advance(by: .seconds(2))
        #expect(try await rig.suspended())
        #expect(await rig.logs.wait { $0.contains { $0.message.contains("returned the system to sleep") } })
        let metrics = String(decoding: await rig.runtime.metricsExposition(), as: UTF8.self)
        #expect(metrics.contains("vigil_returns_to_sleep_total 1"), "\(metrics.prefix(300))")
        #expect(metrics.contains("vigil_dark_wake_awake_seconds_total 2"))
        await rig.stop()
        let run = try #require(try SurvivalReport.load(path: HostPaths.survivalStore(stateDir: rig.directory + "/state"), runs: 1, sinceWallMicros: nil).first)
        let dark = try #require(run.darkWakes?.first)
        #expect(dark.outcome == .asleepAgain && dark.alarmStrategy == "tick" && dark.awakeMicros == 2_000_000)
    }

    /// The runtime's own wake scheduler says when its next system-waking
    /// alarm is due: one due 5 s after the wake is waited for, and the
    /// system sleeps a grace after it, not a grace after the wake.
    @Test func theRuntimeWaitsForItsOwnAlarmDueSoon() async throws {
        let clock = ManualClock()
        let (scheduler, timer, alarmTimer) = WakeAttributionTests.alarmScheduler(clock)
        let alarm = WakeRequest(earliest: clock.now + .seconds(5), latest: clock.now + .seconds(5), wakeSystem: true, label: "fetch")
        async let firing = scheduler.wake(alarm)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarmTimer], pending: 1)
        // Only the scheduler's timers are on the clock so far; the host adds
        // sleepers of its own, so from here on the clock moves by plain steps.
        let rig = try await Runtime(clock: clock, scheduler: scheduler)
        defer { rig.remove() }
        try await rig.wokenByTick()
        await clock.advance(by: .seconds(2))
        #expect(await rig.logs.wait { $0.contains { $0.message.contains("next alarm (fetch) is due in 3s") } })
        await clock.advance(by: .seconds(3))
        _ = try await firing
        await clock.advance(by: .seconds(2))
        #expect(try await rig.suspended())
        let metrics = String(decoding: await rig.runtime.metricsExposition(), as: UTF8.self)
        #expect(metrics.contains("vigil_returns_to_sleep_total 1"), "\(metrics.prefix(300))")
        #expect(metrics.contains("vigil_dark_wake_awake_seconds_total 7"), "a grace after the alarm, 5 s after the wake")
        await rig.stop()
    }
}
