import Foundation
import Testing
@testable import VigilHost
@testable import VigilSurvival
import VigilKit

/// The survival reader (VigilSurvival): read-only GRDB with typed column
/// reads, on stores the writer made and on stores damaged afterwards.
@Suite("Survival reader")
struct SurvivalReaderTests {
    /// The reader checks the writer's one list of migrations: a store
    /// migrated by this build gets no "newer Vigil" warning, one migration
    /// more does.
    @Test func theReaderKnowsTheWritersMigrations() throws {
        let dir = try SurvivalTempDir()
        _ = try SurvivalStore(path: dir.store)
        #expect(SurvivalReport.warnings(path: dir.store) == [])
        try SurvivalStoreInspector.execute(path: dir.store, sql: "INSERT INTO grdb_migrations VALUES ('v9-from-the-future')")
        #expect(SurvivalReport.warnings(path: dir.store).first?.contains("unknown migrations: v9-from-the-future") == true)
    }

    /// One SQLite layer, in one folder: only `Sources/Survival` imports GRDB
    /// (or SQLite itself) or registers a migration, so a schema change
    /// touches that folder alone.
    @Test func onlySourcesSurvivalTalksToSQLite() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        var inside: [String] = [], outside: [String] = []
        for top in ["Sources", "Plugins"] {
            let base = root.appendingPathComponent(top)
            let files = try #require(FileManager.default.enumerator(at: base, includingPropertiesForKeys: nil, options: [.skipsHiddenFiles]))
            for case let file as URL in files where file.pathExtension == "swift" {
                let text = try String(contentsOf: file, encoding: .utf8)
                guard ["import GRDB", "import CSQLite", "import SQLite3", "registerMigration("].contains(where: text.contains) else { continue }
                let relative = String(file.path.dropFirst(root.path.count + 1))
                if relative.hasPrefix("Sources/Survival/") { inside.append(relative) } else { outside.append(relative) }
            }
        }
        #expect(inside.contains("Sources/Survival/Store/SurvivalSchema.swift") && inside.contains("Sources/Survival/Report/SurvivalReport.swift"), "\(inside)")
        #expect(outside == [], "SQLite outside Sources/Survival: \(outside)")
    }

    /// A store with two runs, the first killed and the second stopped, with
    /// a lease and a cost, closed.
    private static func writeStore(_ path: String) async throws {
        var clocks = FakeClocks()
        do {
            let store = try SurvivalStore(path: path)
            _ = try await store.beginRun(runStart("first", at: clocks.readings))
            var cost = StrategyCostRow()
            cost.wakeups = 3
            try await store.heartbeat(clocks.awake(60), leases: [HeartbeatLease(id: 1, strategy: "tick", holds: "none", state: "active")], costs: ["tick": cost])
        }
        let store = try SurvivalStore(path: path)
        let began = try await store.beginRun(runStart("second", at: clocks.awake(5)))
        // The writer reads the run it closed through the reader, on its own connection.
        #expect(began.closedRuns.map(\.runId) == ["first"] && began.closedRuns.first?.endReason == .killed)
        #expect(began.previousRun?.runId == "first" && began.previousRun?.heartbeats == 2)
        try await store.endRun(reason: .stopped, readings: clocks.awake(60))
        let totals = try await store.metricTotals()
        #expect(totals.runs == [.killed: 1, .stopped: 1])
    }

    /// Every column of `run` damaged in turn (a NULL, or text where an
    /// integer belongs): each reader ends in a store error naming the
    /// column, never a trap.
    @Test(arguments: ["uuid = NULL", "startWall = NULL", "lastBoot = 'soon'", "endReason = x'07'", "intervalMicros = x'00'"])
    func damagedRunRowsAreErrorsNotCrashes(_ damage: String) async throws {
        let dir = try SurvivalTempDir()
        try await Self.writeStore(dir.store)
        #expect(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).map(\.runId) == ["second", "first"])
        try SurvivalStoreInspector.execute(path: dir.store, sql: """
            PRAGMA writable_schema = ON;
            UPDATE sqlite_schema SET sql = replace(sql, 'NOT NULL', '') WHERE name = 'run';
            PRAGMA writable_schema = OFF;
            """)
        try SurvivalStoreInspector.execute(path: dir.store, sql: "PRAGMA ignore_check_constraints = ON; UPDATE run SET \(damage) WHERE uuid = 'first' OR uuid IS NULL")
        let column = String(damage.prefix { $0 != " " })
        var reads: [(String, () throws -> Void)] = [
            ("load", { _ = try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil) }),
            ("picture", { _ = try SurvivalPicture.load(path: dir.store, runs: nil, sinceWallMicros: nil) }),
        ]
        if column == "startWall" {
            // The bus asks for runs started since a time: a NULL start is none of them.
            #expect(try SurvivalRunReader(path: dir.store).runs(startedSince: 0).map(\.runId) == ["second"])
        } else {
            reads.append(("bus", { _ = try SurvivalRunReader(path: dir.store).runs(startedSince: 0) }))
        }
        for (what, read) in reads {
            let error = #expect(throws: SurvivalStoreError.self, "\(what)") { try read() }
            #expect(error?.code == .corrupt, "\(what): \(String(describing: error))")
            #expect(error?.description.contains(column) == true, "\(what): \(String(describing: error))")
        }
        // The cost report reads only ids and costs: it still answers.
        _ = try? CostReport.load(path: dir.store, sinceWallMicros: nil)
    }

    /// A damaged cost row is an error too, not a trap.
    @Test func damagedCostRowsAreErrors() async throws {
        let dir = try SurvivalTempDir()
        try await Self.writeStore(dir.store)
        #expect(try CostReport.load(path: dir.store, sinceWallMicros: nil).strategies.map(\.strategy) == ["tick"])
        try SurvivalStoreInspector.execute(path: dir.store, sql: """
            PRAGMA writable_schema = ON;
            UPDATE sqlite_schema SET sql = replace(sql, 'NOT NULL', '') WHERE name = 'strategyCost';
            PRAGMA writable_schema = OFF;
            """)
        try SurvivalStoreInspector.execute(path: dir.store, sql: "PRAGMA ignore_check_constraints = ON; UPDATE strategyCost SET wakeups = NULL")
        let error = #expect(throws: SurvivalStoreError.self) { try CostReport.load(path: dir.store, sinceWallMicros: nil) }
        #expect(error?.code == .corrupt)
        #expect(error?.description.contains("wakeups is NULL, expected an integer") == true, "\(String(describing: error))")
    }

    /// The bus's reader keeps its connection: runs written after it opened
    /// are seen by the next call.
    @Test func theBusReaderSeesLaterRuns() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart("one", at: clocks.readings))
        let reader = SurvivalRunReader(path: dir.store)
        #expect(try reader.runs(startedSince: 0).map(\.runId) == ["one"])
        try await store.heartbeat(clocks.awake(60), leases: [])
        try await store.endRun(reason: .stopped, readings: clocks.awake(1))
        let runs = try reader.runs(startedSince: 0)
        #expect(runs.map(\.runId) == ["one"] && runs.first?.endReason == .stopped && runs.first?.heartbeats == 3, "\(runs)")
    }
}
