import Foundation
import Testing
import VigilKit
@testable import VigilHost
@testable import VigilSurvival
import VigilKitTesting

/// What woke the system (SystemWake.attribute) with injected readings, its
/// round trip through the survival log and `vigilctl survival`'s text, and the
/// scheduler's record of system-waking alarms. A real suspend cannot happen on
/// the test machines: Scripts/guest-test proves the same on a real kernel.
@Suite("Wake attribution")
struct WakeAttributionTests {
    /// The resume at boottime 1000 s after 30 s asleep (asleep from 970 s).
    let resume = ClockReadings(wallMicros: 1_750_000_000_000_000, monotonicMicros: 800_000_000, boottimeMicros: 1_000_000_000)
    let slept: Int64 = 30_000_000

    func alarm(_ label: String, atSeconds: Double, fired: Bool = true) -> SystemWakeAlarm {
        let deadline = VigilInstant(nanoseconds: Int64(atSeconds * 1e9))
        return SystemWakeAlarm(label: label, deadline: deadline, firedAt: fired ? VigilInstant(nanoseconds: resume.boottimeMicros * 1_000) : nil)
    }

    func attribute(_ alarms: [SystemWakeAlarm]) -> SystemWake {
        SystemWake.attribute(resume: resume, runStartBoottimeMicros: 400_000_000, suspendedMicros: slept, alarms: alarms, kernelSource: "pm_wakeup_irq 8")
    }

    @Test func anAlarmDueDuringTheSuspendWokeIt() {
        var tick = alarm("tick periodic-wake", atSeconds: 999.6)
        tick.owner = WakeOwner(strategy: "tick", kind: "periodic-wake")
        let wake = attribute([tick, alarm("later", atSeconds: 1_500, fired: false)])
        #expect(wake.cause == .vigilAlarm)
        #expect(wake.alarm == "tick periodic-wake")
        #expect(wake.alarmStrategy == "tick")
        #expect(wake.alarmKind == "periodic-wake")
        #expect(wake.fields["alarmStrategy"] == "tick" && wake.fields["alarmKind"] == "periodic-wake")
        #expect(wake.latenessMicros == 400_000)
        #expect(wake.startOffsetMicros == 600_000_000)
        #expect(wake.suspendedMicros == slept)
    }

    @Test func theRTCsWholeSecondsMayWakeItABitEarly() {
        let wake = attribute([alarm("tick", atSeconds: 1_000.8, fired: false)])
        #expect(wake.cause == .vigilAlarm)
        #expect(wake.latenessMicros == -800_000)
    }

    @Test func noAlarmDueMeansSomethingElse() {
        // Pending far after the resume, or fired before the suspend began.
        let wake = attribute([alarm("later", atSeconds: 1_060, fired: false), alarm("before", atSeconds: 960)])
        #expect(wake.cause == .other)
        #expect(wake.alarm == nil && wake.missedAlarm == nil)
        #expect(wake.kernelSource == "pm_wakeup_irq 8")
    }

    @Test func anAlarmDueLongBeforeTheResumeDidNotWakeIt() {
        // Due 20 s before the resume: an alarm on a clock that cannot wake
        // the system (CLOCK_BOOTTIME) looks like this.
        let wake = attribute([alarm("tick", atSeconds: 980)])
        #expect(wake.cause == .other)
        #expect(wake.missedAlarm == "tick")
        #expect(wake.missedByMicros == 20_000_000)
        #expect(SurvivalReportFormat.wakeCause(wake).contains("did not wake it"))
    }

    @Test func wakesAreStoredAndShownUnderTheRunsBar() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        let start = clocks.readings
        _ = try await store.beginRun(runStart(at: start))
        try await store.heartbeat(clocks.awake(60), leases: [])
        clocks.awake(10)
        clocks.suspend(300)
        let resumed = clocks.awake(0.2)
        let deadline = VigilInstant(nanoseconds: (resumed.boottimeMicros - 500_000) * 1_000)
        let byAlarm = SystemWake.attribute(resume: resumed, runStartBoottimeMicros: start.boottimeMicros, suspendedMicros: 300_000_000,
                                           alarms: [SystemWakeAlarm(label: "tick periodic-wake", deadline: deadline, firedAt: nil)], kernelSource: nil)
        try await store.recordEvent(SystemWake.eventName, strategy: nil, fields: byAlarm.fields, readings: resumed)
        try await store.heartbeat(clocks.awake(50), leases: [])
        clocks.suspend(120)
        let second = clocks.awake(0.1)
        let other = SystemWake.attribute(resume: second, runStartBoottimeMicros: start.boottimeMicros, suspendedMicros: 120_000_000,
                                         alarms: [], kernelSource: "wakeup sources: rtc0")
        try await store.recordEvent(SystemWake.eventName, strategy: nil, fields: other.fields, readings: second)
        try await store.endRun(reason: .stopped, readings: clocks.awake(5))

        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.suspends == 2)
        #expect(run.wakes == [byAlarm, other])
        #expect(run.wakes?.first?.latenessMicros == 500_000)
        let text = SurvivalReportFormat.text([run], width: 80, nowWall: clocks.wall, timeZone: DisplayTimeZone.utc().zone)
        #expect(text.contains("after 5m suspended: Vigil alarm of tick periodic-wake, 500ms late"))
        #expect(text.contains("after 2m suspended: woken by something else (wakeup sources: rtc0)"))
        let json = SurvivalReportFormat.json([run])
        #expect(json.contains("\"cause\" : \"vigil-alarm\""))
    }

    /// A scheduler whose alarm clock can wake the system (a test RTC), and its two timers.
    static func alarmScheduler(_ clock: ManualClock) -> (WakeScheduler, ClockDrivenWakeTimer, ClockDrivenWakeTimer) {
        let timer = ClockDrivenWakeTimer(clock: clock, clockName: "CLOCK_BOOTTIME")
        let alarmTimer = ClockDrivenWakeTimer(clock: clock, clockName: "CLOCK_BOOTTIME_ALARM")
        let canWake = WakeClockInfo(clock: "CLOCK_BOOTTIME_ALARM", canWakeSystem: true, reason: "test RTC")
        return (WakeScheduler(clock: clock, timer: timer, alarmTimer: alarmTimer, clockInfo: canWake), timer, alarmTimer)
    }

    @Test func theSchedulerRemembersSystemWakingAlarms() async throws {
        let clock = ManualClock()
        let (scheduler, timer, alarmTimer) = Self.alarmScheduler(clock)
        let now = clock.now
        let waking = WakeRequest(earliest: now + .seconds(10), latest: now + .seconds(20), wakeSystem: true, label: "tick")
        let ordinary = WakeRequest(earliest: now + .seconds(5), latest: now + .seconds(6), label: "heartbeat")
        // As a strategy's run asks (the supervisor sets the owner around it).
        let owner = WakeOwner(strategy: "tick", kind: "periodic-wake")
        async let wakingFiring = WakeOwner.$current.withValue(owner) { try await scheduler.wake(waking) }
        async let ordinaryFiring = scheduler.wake(ordinary)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarmTimer], pending: 2)
        #expect(await scheduler.systemWakeAlarms(since: now) == [SystemWakeAlarm(label: "tick", owner: owner, deadline: waking.latest, firedAt: nil)])
        // The next alarm, as return to sleep asks (the ordinary request, due sooner, is not one).
        #expect(await scheduler.nextSystemWakeAlarm() == SystemWakeAlarm(label: "tick", owner: owner, deadline: waking.latest, firedAt: nil))
        await WakeTesting.advance(clock, to: waking.latest, timers: [timer, alarmTimer])
        _ = try await (wakingFiring, ordinaryFiring)
        #expect(await scheduler.systemWakeAlarms(since: now) == [SystemWakeAlarm(label: "tick", owner: owner, deadline: waking.latest, firedAt: waking.latest)])
        #expect(await scheduler.systemWakeAlarms(since: waking.latest + .seconds(1)).isEmpty)
        #expect(await scheduler.nextSystemWakeAlarm() == nil, "fired: no longer next")

        // Without an alarm clock, or without an RTC behind it, nothing of
        // Vigil's can wake the system.
        let plain = WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock))
        #expect(await plain.systemWakeAlarms(since: now).isEmpty)
        #expect(await plain.nextSystemWakeAlarm() == nil)
        let ordinaryTimer = ClockDrivenWakeTimer(clock: clock), rtcLess = ClockDrivenWakeTimer(clock: clock)
        let noRTC = WakeScheduler(clock: clock, timer: ordinaryTimer, alarmTimer: rtcLess)
        let lone = WakeRequest(earliest: clock.now + .seconds(10), latest: clock.now + .seconds(20), wakeSystem: true, label: "tick")
        async let loneFiring = noRTC.wake(lone)
        await WakeTesting.quiesce(noRTC, clock, timers: [ordinaryTimer, rtcLess], pending: 1)
        #expect(await noRTC.systemWakeAlarms(since: now).isEmpty)
        #expect(await noRTC.nextSystemWakeAlarm() == nil)
        await WakeTesting.advance(clock, to: lone.latest, timers: [ordinaryTimer, rtcLess])
        _ = try await loneFiring
    }

    /// A resume put down to a strategy's alarm is that strategy's system
    /// wake (its `SystemWakes`), besides the wakeup its expiration was.
    @Test func aResumeByAStrategysAlarmIsItsSystemWake() async throws {
        let clock = ManualClock()
        let (scheduler, timer, alarmTimer) = Self.alarmScheduler(clock)
        let costs = StrategyCosts(clock: clock)
        await scheduler.observeExpirations { costs.timerExpired(firing: $0) }
        let waking = WakeRequest(earliest: clock.now + .seconds(290), latest: clock.now + .seconds(300), wakeSystem: true, label: "tick")
        async let firing = WakeOwner.$current.withValue(WakeOwner(strategy: "tick", kind: "periodic-wake")) { try await scheduler.wake(waking) }
        await WakeTesting.quiesce(scheduler, clock, timers: [timer, alarmTimer], pending: 1)
        await WakeTesting.advance(clock, to: waking.latest, timers: [timer, alarmTimer])
        _ = try await firing

        let dir = try SurvivalTempDir()
        let store = try SurvivalStore(path: dir.store)
        let resumedAt = waking.latest.nanoseconds / 1_000 + 500_000
        let readings = ClockReadings(wallMicros: 1_750_000_000_000_000, monotonicMicros: resumedAt - 300_000_000, boottimeMicros: resumedAt)
        _ = try await store.beginRun(runStart(at: ClockReadings(wallMicros: 1_749_999_000_000_000, monotonicMicros: 0, boottimeMicros: 0)))
        let recorder = ResumeRecorder(store: store, scheduler: scheduler, runStartBoottimeMicros: 0,
                                      log: WaitableLog<LogLine>().logger("test"), costs: costs, sysfsRoot: dir.path)
        await recorder.resumed(readings, suspendedMicros: 299_000_000)
        #expect(costs.cost(of: "tick") == StrategyCostRow(wakeups: 1, systemWakes: 1))
        // Something else woke it: nobody's.
        await recorder.resumed(ClockReadings(wallMicros: 1_750_001_000_000_000, monotonicMicros: resumedAt, boottimeMicros: resumedAt + 900_000_000),
                               suspendedMicros: 600_000_000)
        #expect(costs.cost(of: "tick").systemWakes == 1)
    }
}

@Suite("Run id and display time zone")
struct RunIDTests {
    @Test func runIdsAreRandomVersion4UUIDs() throws {
        let a = try RunID.generate(), b = try RunID.generate()
        #expect(a != b)
        #expect(UUID(uuidString: a) != nil)
        #expect(Array(a)[14] == "4")
        #expect(!a.hasPrefix("00000000"))
    }

    @Test func noRandomnessRefusesWithBothReasons() throws {
        let none: RunID.Source = { _ in .failure(RunID.RandomnessUnavailable(reasons: ["getrandom(2): Function not implemented"])) }
        let noDev: RunID.Source = { _ in .failure(RunID.RandomnessUnavailable(reasons: ["/dev/urandom: cannot open (No such file or directory)"])) }
        #expect {
            try RunID.generate(sources: [none, noDev])
        } throws: { error in
            let text = "\(error)"
            return text.contains("cannot get randomness for a run id") && text.contains("getrandom(2)") && text.contains("/dev/urandom")
        }
        // The second source is used when the first fails.
        let fixed: RunID.Source = { count in .success([UInt8](repeating: 0xAB, count: count)) }
        #expect(try RunID.generate(sources: [none, fixed]) == "abababab-abab-4bab-abab-abababababab")
    }

    @Test func withoutTimeZoneDataTimesAreUTCWithANote() throws {
        let missing = DisplayTimeZone.resolve(environment: ["TZDIR": "/nonexistent/zoneinfo"])
        #expect(missing.zone.secondsFromGMT() == 0)
        #expect(missing.note == "times are UTC: no time zone data at /nonexistent/zoneinfo")
        let present = DisplayTimeZone.resolve(environment: ["TZDIR": NSTemporaryDirectory()])
        #expect(present.note == nil)
        let run = RunSummary(
            runId: "r", pid: 1, bootId: "b", version: "v", configPath: "c", intervalMicros: 60_000_000,
            startWall: 0, endWall: 60_000_000, lastHeartbeatWall: 60_000_000, endReason: .stopped, endNote: nil,
            aliveMicros: 60_000_000, awakeMicros: 60_000_000, suspendedMicros: 0, suspends: 0, heartbeats: 2,
            stalls: 0, stalledMicros: 0, longestStallMicros: 0, events: 0, timeline: [])
        let text = SurvivalReportFormat.text([run], width: 80, nowWall: 60_000_000, timeZone: missing.zone, note: missing.note)
        #expect(text.contains("Note: times are UTC: no time zone data at /nonexistent/zoneinfo."))
        #expect(text.contains("1970-01-01 00:00:00 → 1970-01-01 00:01:00  stopped"))
    }
}
