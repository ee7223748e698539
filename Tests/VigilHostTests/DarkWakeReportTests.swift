import Foundation
import Testing
import VigilKit
@testable import VigilHost
@testable import VigilSurvival
import VigilKitTesting

/// Dark wakes and sleeps that broke leases in the survival log: stored as
/// events, read back by the report, shown in its text, its JSON, the
/// picture and the metrics.
@Suite("Dark wakes in the survival log")
struct DarkWakeReportTests {
    @Test func darkWakesAndBrokenSleepsAreStoredAndShown() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        let start = clocks.readings
        _ = try await store.beginRun(runStart(at: start))
        try await store.heartbeat(clocks.awake(60), leases: [])
        clocks.suspend(900)
        let woke = clocks.awake(0)
        let asleep = DarkWake(wall: woke.wallMicros, startOffsetMicros: 0, alarm: "sync periodic-wake", alarmStrategy: "sync",
                              alarmKind: "periodic-wake", runs: 1, workEndedAfterMicros: 8_200_000, awakeMicros: 9_200_000, outcome: .asleepAgain)
        try await store.recordEvent(DarkWake.eventName, strategy: nil, fields: asleep.fields(wokeBootMicros: woke.boottimeMicros), readings: clocks.awake(9.2))
        clocks.suspend(900)
        let second = clocks.awake(0)
        let stayed = DarkWake(wall: second.wallMicros, startOffsetMicros: 0, alarm: "sync periodic-wake", alarmStrategy: "sync",
                              alarmKind: "periodic-wake", runs: 1, workEndedAfterMicros: 4_000_000, awakeMicros: 5_000_000,
                              outcome: .stayedAwake, reason: "keys pressed", refusal: DarkWake.Refusal.person.rawValue)
        try await store.recordEvent(DarkWake.eventName, strategy: nil, fields: stayed.fields(wokeBootMicros: second.boottimeMicros), readings: clocks.awake(5))
        let sleepStart = clocks.awake(30)
        let broken = BrokenSleep(wall: sleepStart.wallMicros, startOffsetMicros: sleepStart.boottimeMicros - start.boottimeMicros,
                                 sleptMicros: 600_000_000, wakeCause: "other",
                                 leases: [BrokenSleep.Lease(id: 7, holder: "client", name: "backup <\u{1B}[31m>")])
        clocks.suspend(600)
        try await store.recordEvent(BrokenSleep.eventName, strategy: nil, fields: broken.fields, readings: sleepStart)
        try await store.heartbeat(clocks.awake(10), leases: [])
        try await store.endRun(reason: .stopped, readings: clocks.awake(5))

        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        let dark = try #require(run.darkWakes)
        #expect(dark.count == 2)
        #expect(dark[0].outcome == .asleepAgain && dark[0].awakeMicros == 9_200_000 && dark[0].alarmStrategy == "sync")
        #expect(dark[0].startOffsetMicros == woke.boottimeMicros - start.boottimeMicros, "placed at the resume, not at the decision")
        #expect(dark[1].reason == "keys pressed")
        #expect(run.brokenSleeps == [broken])

        let text = SurvivalReportFormat.text([run], width: 80, nowWall: clocks.wall, timeZone: DisplayTimeZone.utc().zone)
        #expect(text.contains("woke for sync, asleep again after 9.2s"), "\(text)")
        #expect(text.contains("woke for sync, stayed awake: keys pressed"), "\(text)")
        #expect(text.contains("SLEEP BROKE LEASES"), "\(text)")
        #expect(text.contains("slept 10m (woken by other) although lease 7 client"), "\(text)")
        #expect(!text.contains("\u{1B}"), "stored strings are escaped for the terminal")

        let json = SurvivalReportFormat.json([run])
        #expect(json.contains("\"darkWakes\""))
        #expect(json.contains("\"outcome\" : \"asleep-again\""))
        #expect(json.contains("\"brokenSleeps\""))
        #expect(json.contains("\"sleptMicros\" : 600000000"))

        let svg = SurvivalPictureFormat.svg(try SurvivalPicture.load(path: dir.store, runs: 1, sinceWallMicros: nil),
                                            timeZone: DisplayTimeZone.utc().zone, nowWall: clocks.wall)
        #expect(svg.components(separatedBy: "class=\"dk\"").count == 2, "one mark for the return to sleep")
        #expect(svg.components(separatedBy: "class=\"dka\"").count == 2, "one for the wake that stayed awake")
        #expect(svg.contains("class=\"bk\""), "a cross where the sleep broke a lease")
        #expect(svg.contains("stayed awake: keys pressed"))
        #expect(!svg.contains("backup <"), "escaped for XML")
    }

    @Test func theMetricsCountReturnsToSleepAwakeSecondsAndBrokenLeases() throws {
        let metrics = HostMetrics()
        metrics.darkWake(DarkWake(wall: 0, startOffsetMicros: 0, awakeMicros: 9_200_000, outcome: .asleepAgain))
        metrics.darkWake(DarkWake(wall: 0, startOffsetMicros: 0, awakeMicros: 800_000, outcome: .asleepAgain))
        metrics.darkWake(DarkWake(wall: 0, startOffsetMicros: 0, awakeMicros: 5_000_000, outcome: .stayedAwake, reason: "keys pressed"))
        metrics.sleepBroke(BrokenSleep(wall: 0, startOffsetMicros: 0, sleptMicros: 1, wakeCause: "other", leases: [
            BrokenSleep.Lease(id: 1, holder: "a", name: "a"), BrokenSleep.Lease(id: 2, holder: "b", name: "b"),
        ]))
        let text = String(decoding: metrics.exposition(HostMetrics.Snapshot(
            version: "0", upSeconds: 1, powerBackend: "logind", wakeClock: "boottime-alarm", canWakeSystem: true,
            strategies: [], leases: LeaseTotals(), survival: nil)), as: UTF8.self)
        #expect(text.contains("vigil_returns_to_sleep_total 2"), "\(text)")
        #expect(text.contains("vigil_dark_wakes_total{outcome=\"asleep-again\"} 2"))
        #expect(text.contains("vigil_dark_wakes_total{outcome=\"stayed-awake\"} 1"))
        #expect(text.contains("vigil_dark_wake_awake_seconds_total 15"))
        #expect(text.contains("vigil_sleep_broke_leases_total 1"))
        #expect(text.contains("vigil_broken_leases_total 2"))
    }
}
