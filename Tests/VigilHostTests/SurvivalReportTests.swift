import Foundation
import Testing
@testable import VigilHost
@testable import VigilSurvival

/// Gap classification with injected clock readings (suspend cannot happen on
/// the test machines), and the text / JSON renderings of the report.
@Suite("Survival report")
struct SurvivalReportTests {
    @Test func gapRuleThresholds() {
        let minute = GapRule(intervalMicros: 60_000_000)
        #expect(minute.stallThresholdMicros == 90_000_000)
        let start = ClockReadings(wallMicros: 0, monotonicMicros: 1_000_000_000, boottimeMicros: 1_000_000_000)
        func after(mono: Int64, boot: Int64) -> ClockReadings {
            ClockReadings(wallMicros: boot, monotonicMicros: start.monotonicMicros + mono, boottimeMicros: start.boottimeMicros + boot)
        }
        #expect(minute.classify(from: start, to: after(mono: 90_000_000, boot: 90_000_000)).stallMicros == nil)
        #expect(minute.classify(from: start, to: after(mono: 90_000_001, boot: 90_000_001)).stallMicros == 90_000_001)
        #expect(minute.classify(from: start, to: after(mono: 60_000_000, boot: 61_000_000)).suspendedMicros == 0)
        #expect(minute.classify(from: start, to: after(mono: 60_000_000, boot: 61_000_001)).suspendedMicros == 1_000_001)
        // Short intervals get at least 2 s of slack.
        #expect(GapRule(intervalMicros: 1_000_000).stallThresholdMicros == 3_000_000)
        // Readings that go backwards never produce negative durations.
        let backwards = minute.classify(from: after(mono: 10, boot: 10), to: start)
        #expect(backwards.awakeMicros == 0 && backwards.suspendedMicros == 0 && backwards.stallMicros == nil)
    }

    @Test func normalHeartbeatsHaveNoGaps() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        // Jitter around the interval, and one beat late but within the slack.
        for seconds in [60.4, 59.7, 60.0, 61.2, 89.0, 60.0, 58.9, 60.1] {
            try await store.heartbeat(clocks.awake(seconds), leases: [])
        }
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.stalls == 0 && run.longestStallMicros == 0)
        #expect(run.suspends == 0 && run.suspendedMicros == 0)
        #expect(run.heartbeats == 9)
        #expect(run.aliveMicros == 509_300_000)
        #expect(run.awakeMicros == run.aliveMicros)
        #expect(run.timeline == [TimelineSegment(kind: .awake, startOffsetMicros: 0, durationMicros: 509_300_000, startWall: FakeClocks().wall)])
    }

    @Test func suspendIsBoottimeGrowingMoreThanMonotonic() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        try await store.heartbeat(clocks.awake(60), leases: [])
        // 20 s awake, one hour asleep, 40 s awake: one heartbeat late in wall
        // and boottime terms, on time in monotonic terms.
        clocks.awake(20)
        clocks.suspend(3_600)
        try await store.heartbeat(clocks.awake(40), leases: [])
        try await store.heartbeat(clocks.awake(60), leases: [])
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.suspends == 1)
        #expect(run.suspended == .seconds(3_600))
        #expect(run.stalls == 0, "a suspend is not a stall")
        #expect(run.awake == .seconds(180))
        #expect(run.alive == .seconds(3_780))
        #expect(run.timeline.map(\.kind) == [.awake, .suspended, .awake])
        #expect(run.timeline[1].startOffsetMicros == 60_000_000)
        #expect(run.timeline[1].durationMicros == 3_600_000_000)
        #expect(run.timeline.map(\.durationMicros).reduce(0, +) == run.aliveMicros)
    }

    /// A heartbeat only learns that the system slept somewhere since the
    /// one before; the resume the host saw says where the sleep ended, and
    /// the timeline puts the suspended span there.
    @Test func aSuspendedSpanEndsAtItsWake() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(interval: .seconds(2), at: clocks.readings))
        try await store.heartbeat(clocks.awake(2), leases: [])
        clocks.awake(0.3)
        clocks.suspend(15)
        let resumed = clocks.readings
        let wake = SystemWake(wall: resumed.wallMicros, startOffsetMicros: 0, suspendedMicros: 15_000_000, cause: .vigilAlarm,
                              alarm: "tick periodic-wake", alarmStrategy: "tick", alarmKind: "periodic-wake", latenessMicros: 100_000)
        try await store.recordEvent(SystemWake.eventName, strategy: nil, fields: wake.fields, readings: resumed)
        try await store.heartbeat(clocks.awake(1.7), leases: [])
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.timeline.map(\.kind) == [.awake, .suspended, .awake])
        // Asleep from 2.3 s to 17.3 s, not from the heartbeat at 2 s.
        #expect(run.timeline[1].startOffsetMicros == 2_300_000)
        #expect(run.timeline[1].startOffsetMicros + run.timeline[1].durationMicros == 17_300_000)
        #expect(run.timeline.map(\.durationMicros).reduce(0, +) == run.aliveMicros)
        let recorded = try #require(run.wakes?.first)
        #expect(recorded.startOffsetMicros == 17_300_000)
        #expect(recorded.alarmStrategy == "tick" && recorded.alarmKind == "periodic-wake")
    }

    @Test func frozenGapIsCountedOnceWithItsLength() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        try await store.heartbeat(clocks.awake(60), leases: [])
        try await store.heartbeat(clocks.awake(60), leases: [])
        // SIGSTOP: both clocks grow 5x the interval before the next heartbeat.
        try await store.heartbeat(clocks.awake(300), leases: [])
        try await store.heartbeat(clocks.awake(60), leases: [])
        try await store.heartbeat(clocks.awake(60), leases: [])
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.stalls == 1)
        #expect(run.longestStall == .seconds(300))
        #expect(run.stalledMicros == 300_000_000)
        #expect(run.suspends == 0, "the system was awake")
        #expect(run.timeline.map(\.kind) == [.awake, .stalled, .awake])
        #expect(run.timeline[1].startOffsetMicros == 120_000_000)
        #expect(run.timeline[1].durationMicros == 300_000_000)
    }

    @Test func stallAndSuspendInOneGapAreBothCounted() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        clocks.awake(200)
        clocks.suspend(1_000)
        try await store.heartbeat(clocks.awake(10), leases: [])
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.stalls == 1 && run.longestStall == .seconds(210))
        #expect(run.suspends == 1 && run.suspended == .seconds(1_000))
        #expect(run.timeline.map(\.kind) == [.stalled, .suspended])
        #expect(run.timeline.map(\.durationMicros).reduce(0, +) == run.aliveMicros)
    }

    @Test func writingManyHeartbeatsAtOnceEqualsWritingThemOneByOne() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        var samples: [HeartbeatSample] = []
        for i in 0..<50 {
            if i == 10 { clocks.suspend(600) }
            let readings = clocks.awake(i == 30 ? 400 : 60)
            samples.append(HeartbeatSample(readings: readings, leases: i < 20 ? [HeartbeatLease(id: 1, strategy: "s", holds: "none", state: "active")] : []))
        }
        func write(_ path: String, batched: Bool) async throws -> RunSummary {
            let store = try SurvivalStore(path: path)
            _ = try await store.beginRun(runStart("same-run", at: FakeClocks().readings))
            if batched {
                try await store.appendHeartbeats(samples)
            } else {
                for sample in samples { try await store.heartbeat(sample.readings, leases: sample.leases) }
            }
            return try #require(try SurvivalReport.load(path: path, runs: 1, sinceWallMicros: nil).first)
        }
        let oneByOne = try await write(dir.path + "/a.sqlite", batched: false)
        let batched = try await write(dir.path + "/b.sqlite", batched: true)
        #expect(oneByOne == batched)
        #expect(batched.suspends == 1 && batched.stalls == 1)
        #expect(try SurvivalReport.heartbeats(path: dir.path + "/a.sqlite", runId: "same-run")
            == SurvivalReport.heartbeats(path: dir.path + "/b.sqlite", runId: "same-run"))
    }

    /// A store with three runs: rebooted, killed (with a stall), stopped (with a suspend).
    func threeRuns(_ dir: SurvivalTempDir) async throws -> [RunSummary] {
        var clocks = FakeClocks()
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart("run-rebooted", boot: "boot-1", at: clocks.readings))
            for _ in 0..<30 { try await store.heartbeat(clocks.awake(60), leases: []) }
        }
        clocks = FakeClocks(wall: clocks.wall + 120_000_000, mono: 30_000_000, boot: 30_000_000)
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart("run-killed", boot: "boot-2", at: clocks.readings))
            for i in 0..<40 { try await store.heartbeat(clocks.awake(i == 20 ? 600 : 60), leases: []) }
        }
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart("run-stopped", boot: "boot-2", at: clocks.awake(30)))
        for i in 0..<40 {
            if i == 10 { clocks.suspend(1_800) }
            try await store.heartbeat(clocks.awake(60), leases: [])
        }
        try await store.recordEvent("lease-expired", strategy: "focus", fields: [:], readings: clocks.readings)
        try await store.endRun(reason: .stopped, readings: clocks.awake(10))
        return try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil)
    }

    @Test func jsonRoundTrips() async throws {
        let dir = try SurvivalTempDir()
        let runs = try await threeRuns(dir)
        #expect(runs.map(\.endReason) == [.stopped, .killed, .rebooted])
        let json = SurvivalReportFormat.json(runs)
        let decoded = try JSONDecoder().decode([RunSummary].self, from: Data(json.utf8))
        #expect(decoded == runs)
        #expect(json.contains(#""endReason" : "killed""#))
        #expect(json.contains(#""aliveMicros""#))
    }

    @Test func aggregatesAgreeWithARecountOfTheRawHeartbeats() async throws {
        let dir = try SurvivalTempDir()
        let runs = try await threeRuns(dir)
        let recount = try SurvivalReport.recount(path: dir.store)
        #expect(recount.map(\.runId) == runs.map(\.runId))
        for (counted, summary) in zip(recount, runs) {
            #expect(counted.matches(summary), "\(counted) vs \(summary)")
        }
        #expect(recount.map(\.stalls) == [0, 1, 0])
        #expect(recount.map(\.suspends) == [1, 0, 0])
    }

    @Test func textTimelineShowsEachRunsSegments() async throws {
        let dir = try SurvivalTempDir()
        let runs = try await threeRuns(dir)
        let text = SurvivalReportFormat.text(runs, width: 80, nowWall: runs[0].lastHeartbeatWall, timeZone: TimeZone(identifier: "UTC")!)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines[0] == "Survival log: 3 runs, newest first.")
        #expect(lines[1].contains("[=] awake") && lines[1].contains("[z] suspended") && lines[1].contains("[!] frozen/stalled"))
        let bars = lines.filter { $0.hasPrefix("  [") }
        #expect(bars.count == 3)
        #expect(bars.allSatisfy { $0.count <= 80 })
        // Newest first: stopped (awake, suspended, awake), killed (awake, stall, awake), rebooted (all awake).
        #expect(bars[0].wholeMatch(of: /\ \ \[=+z+=+\] stopped/) != nil, "\(bars[0])")
        #expect(bars[1].wholeMatch(of: /\ \ \[=+!+=+\] killed/) != nil, "\(bars[1])")
        #expect(bars[2].wholeMatch(of: /\ \ \[=+\] rebooted/) != nil, "\(bars[2])")
        #expect(text.contains("run run-killed  pid 4242  vigil 0.1.0-test  heartbeat every 60s"))
        #expect(text.contains("stalls 1, longest 10m"))
        #expect(text.contains("suspended 30m (1×)"))
        #expect(text.contains("boot id changed from boot-1 to boot-2"))
        #expect(text.contains("events 1"))
    }

    @Test func shortGapsStayVisibleAndRunningRunsSayWhenTheyWereLastSeen() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        for i in 0..<2_000 { try await store.heartbeat(clocks.awake(i == 1_000 ? 100 : 60), leases: []) }
        let runs = try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil)
        let fresh = SurvivalReportFormat.text(runs, width: 60, nowWall: clocks.wall + 5_000_000, timeZone: TimeZone(identifier: "UTC")!)
        // A 100 s stall in 33 hours is far below one cell, yet drawn.
        #expect(fresh.contains("!"))
        #expect(fresh.contains("now  running (last heartbeat"))
        let silent = SurvivalReportFormat.text(runs, width: 60, nowWall: clocks.wall + 3_600_000_000, timeZone: TimeZone(identifier: "UTC")!)
        #expect(silent.contains("running? no heartbeat since"))
        #expect(silent.contains("(1h ago)"))
    }

    @Test func durationsReadAtAGlance() {
        #expect(SurvivalReportFormat.duration(0) == "0s")
        #expect(SurvivalReportFormat.duration(400_000) == "400ms")
        #expect(SurvivalReportFormat.interval(60_000_000) == "60s")
        #expect(SurvivalReportFormat.interval(1_500_000) == "1.5s")
        #expect(SurvivalReportFormat.duration(2_500_000) == "2.5s")
        #expect(SurvivalReportFormat.duration(42_000_000) == "42s")
        #expect(SurvivalReportFormat.duration(250_000_000) == "4m10s")
        #expect(SurvivalReportFormat.duration(7_500_000_000) == "2h05m")
        #expect(SurvivalReportFormat.duration(31_536_000_000_000) == "365d")
    }
}
