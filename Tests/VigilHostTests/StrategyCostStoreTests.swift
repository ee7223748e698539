import Foundation
import GRDB
import Testing
import VigilKit
@testable import VigilHost
@testable import VigilSurvival

/// The per-run cost in the survival store: the `v4-strategyCost`
/// migration, a store made by the schema before it, and the report.
@Suite("Strategy cost in the survival store")
struct StrategyCostStoreTests {
    /// A store as the schema before `v4-strategyCost` left it, with one
    /// run and two heartbeats written the way that vigild wrote them.
    static func previousSchemaStore(at path: String, clocks: inout FakeClocks) throws {
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let queue = try DatabaseQueue(path: path)
        try SurvivalSchema.migrator.migrate(queue, upTo: "v3-gap-unwritable")
        let start = clocks.readings
        let last = clocks.awake(120)
        try queue.write { db in
            try db.execute(sql: """
                INSERT INTO run (uuid, pid, bootId, version, configPath, intervalMicros, startWall, startMono, startBoot,
                                 lastSeq, lastWall, lastMono, lastBoot, endReason, endWall)
                VALUES ('old-run', 99, 'boot-a', '0.1.0', '/etc/vigil/vigil.toml', 60000000, ?, ?, ?, 2, ?, ?, ?, 'stopped', ?)
                """, arguments: [start.wallMicros, start.monotonicMicros, start.boottimeMicros,
                                 last.wallMicros, last.monotonicMicros, last.boottimeMicros, last.wallMicros])
            for (seq, r) in [(1, start), (2, last)] {
                try db.execute(sql: "INSERT INTO heartbeat (runId, seq, wall, mono, boot) VALUES (1, ?, ?, ?, ?)",
                               arguments: [seq, r.wallMicros, r.monotonicMicros, r.boottimeMicros])
            }
        }
        try queue.close()
    }

    @Test func anOlderStoreOpensAndIsReportedWithoutTheCost() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        try Self.previousSchemaStore(at: dir.store, clocks: &clocks)
        #expect(!SurvivalSchema.migrationNames.isEmpty && SurvivalSchema.migrationNames.last == "v5-appCount")

        // Read as it is (a newer vigilctl beside the older vigild): no cost.
        let before = try CostReport.load(path: dir.store, sinceWallMicros: nil)
        #expect(before.runs == 1 && before.runsWithoutCost == 1 && before.strategies.isEmpty)

        // The newer vigild migrates it; its runs keep costs, the old one has none.
        let store = try SurvivalStore(path: dir.store)
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT identifier FROM grdb_migrations ORDER BY rowid").last == "v5-appCount")
        _ = try await store.beginRun(runStart("new-run", at: clocks.awake(10)))
        let first = StrategyCostRow(wakeups: 1, sleepHeldUsec: 2_000_000, childCPUUsec: 300_000)
        try await store.heartbeat(clocks.awake(60), leases: [], costs: ["mail": first])
        // The next heartbeat replaces the run's figures: they are counters.
        let mail = StrategyCostRow(wakeups: 3, systemWakes: 1, sleepHeldUsec: 5_000_000, idleHeldUsec: 7, childCPUUsec: 900_000, bytesSent: 10, bytesReceived: 20)
        let client = StrategyCostRow(sleepHeldUsec: 9_000_000)
        try await store.endRun(reason: .stopped, readings: clocks.awake(60), costs: ["mail": mail, "client": client])

        let after = try CostReport.load(path: dir.store, sinceWallMicros: nil)
        #expect(after.runs == 2 && after.runsWithoutCost == 1)
        #expect(after.strategies.map(\.strategy) == ["client", "mail"])
        #expect(after.strategies.map(\.cost) == [client, mail])
        #expect(after.strategies.map(\.runs) == [1, 1])
        // The survival report still reads the old run whole.
        let runs = try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil)
        #expect(runs.map(\.runId) == ["new-run", "old-run"])
        #expect(runs.last?.heartbeats == 3)
        // --since: the new run only.
        let recent = try CostReport.load(path: dir.store, sinceWallMicros: clocks.wall - 1_000_000)
        #expect(recent.runs == 1 && recent.runsWithoutCost == 0 && recent.strategies.count == 2)
    }

    @Test func costsSumOverRunsMostSleepHeldFirst() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        for (run, held) in [("a", UInt64(1_000_000)), ("b", UInt64(4_000_000))] {
            _ = try await store.beginRun(runStart(run, at: clocks.awake(1)))
            try await store.endRun(reason: .stopped, readings: clocks.awake(60), costs: [
                "sync": StrategyCostRow(wakeups: 2, sleepHeldUsec: held),
                "audio": StrategyCostRow(sleepHeldUsec: 2_000_000, bytesSent: 5),
            ])
        }
        let report = try CostReport.load(path: dir.store, sinceWallMicros: nil)
        #expect(report.strategies.map(\.strategy) == ["sync", "audio"])
        #expect(report.strategies[0].cost == StrategyCostRow(wakeups: 4, sleepHeldUsec: 5_000_000))
        #expect(report.strategies[1].cost == StrategyCostRow(sleepHeldUsec: 4_000_000, bytesSent: 10))
        #expect(report.strategies.map(\.runs) == [2, 2])
    }

    @Test func appsRefusedAndExpiredSumOverRunsAsOfEachRunsLastHeartbeat() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart("a", at: clocks.awake(1)))
        try await store.heartbeat(clocks.awake(60), leases: [], apps: ["steam": AppRequestCount(refused: 1)])
        // The last figures of a run replace the earlier ones: they are counters.
        try await store.endRun(reason: .stopped, readings: clocks.awake(60), apps: [
            "steam": AppRequestCount(refused: 3, expired: 1), "chat": AppRequestCount(expired: 2),
        ])
        _ = try await store.beginRun(runStart("b", at: clocks.awake(1)))
        // A run killed after one heartbeat keeps what that heartbeat wrote.
        try await store.heartbeat(clocks.awake(60), leases: [], apps: ["steam": AppRequestCount(refused: 2)])
        let report = try CostReport.load(path: dir.store, sinceWallMicros: nil)
        #expect(report.apps == [CostReport.App(app: "steam", refused: 5, expired: 1, runs: 2), CostReport.App(app: "chat", refused: 0, expired: 2, runs: 1)])
        let recent = try CostReport.load(path: dir.store, sinceWallMicros: clocks.wall - 1_000_000)
        #expect(recent.apps == [CostReport.App(app: "steam", refused: 2, expired: 0, runs: 1)])
    }
}
