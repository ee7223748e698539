import Foundation
import Testing
@testable import VigilHost
@testable import VigilSurvival

/// A temporary directory removed when the test ends.
final class SurvivalTempDir {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "vigil-survival-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
    var store: String { path + "/state/survival.sqlite" }
}

/// Injected clock readings: the test moves monotonic and boottime on its own,
/// which is how a suspend (boottime only) is simulated.
struct FakeClocks {
    var wall: Int64 = 1_750_000_000_000_000
    var mono: Int64 = 5_000_000_000
    var boot: Int64 = 5_000_000_000

    var readings: ClockReadings { ClockReadings(wallMicros: wall, monotonicMicros: mono, boottimeMicros: boot) }

    /// Awake time passes: all three clocks move.
    @discardableResult
    mutating func awake(_ seconds: Double) -> ClockReadings {
        let micros = Int64(seconds * 1_000_000)
        wall += micros; mono += micros; boot += micros
        return readings
    }

    /// The system sleeps: monotonic stops, boottime and wall go on.
    mutating func suspend(_ seconds: Double) {
        let micros = Int64(seconds * 1_000_000)
        wall += micros; boot += micros
    }
}

func runStart(_ id: String = UUID().uuidString, boot: String = "boot-a", interval: Duration = .seconds(60), at readings: ClockReadings) -> RunStart {
    RunStart(runId: id, pid: 4242, bootID: boot, version: "0.1.0-test", configPath: "/etc/vigil/vigil.toml", interval: interval, readings: readings)
}

@Suite("Survival store")
struct SurvivalStoreTests {
    @Test func migrationsCreateTheSchemaInWALMode() throws {
        let dir = try SurvivalTempDir()
        _ = try SurvivalStore(path: dir.store)
        let tables = try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        #expect(tables == ["appCount", "event", "gap", "grdb_migrations", "heartbeat", "leaseSpan", "run", "strategyCost", "strategyRecord"])
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "PRAGMA journal_mode") == ["wal"])
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "PRAGMA application_id") == ["\(SurvivalSchema.applicationID)"])
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT identifier FROM grdb_migrations") == SurvivalSchema.migrationNames)
        let heartbeatColumns = try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT name || ':' || \"notnull\" FROM pragma_table_info('heartbeat')")
        #expect(heartbeatColumns == ["runId:1", "seq:1", "wall:1", "mono:1", "boot:1"])
        let foreignKeys = try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT \"table\" FROM pragma_foreign_key_list('heartbeat')")
        #expect(foreignKeys == ["run"])
        // Opening again applies nothing new and keeps the data.
        _ = try SurvivalStore(path: dir.store)
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT count(*) FROM grdb_migrations") == ["\(SurvivalSchema.migrationNames.count)"])
    }

    @Test func eventsRecordedTogetherKeepTheirOrderReadingsAndCount() async throws {
        var clocks = FakeClocks()
        let (dir, store, id) = try await storeWithARun(&clocks)
        let batch = (1...3).map { i in
            SurvivalStore.Event("lease-acquired", strategy: "s\(i)", fields: ["lease": String(i)], readings: clocks.awake(1))
        }
        try await store.recordEvents(batch)
        try await store.recordEvents([])
        let events = try SurvivalReport.events(path: dir.store, runId: id)
        #expect(events.map(\.strategy) == ["s1", "s2", "s3"])
        #expect(events.map(\.fields) == [["lease": "1"], ["lease": "2"], ["lease": "3"]])
        #expect(events.map(\.readings) == batch.map(\.readings))
        #expect(events.allSatisfy { $0.afterSeq == 1 })
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT eventCount FROM run") == ["3"])
        // An unnamed event refuses the whole batch.
        await #expect(throws: SurvivalStoreError.self) {
            try await store.recordEvents([SurvivalStore.Event("ok", strategy: nil, fields: [:], readings: clocks.awake(1)),
                                          SurvivalStore.Event("", strategy: nil, fields: [:], readings: clocks.awake(1))])
        }
        #expect(try SurvivalReport.events(path: dir.store, runId: id).count == 3)
    }

    /// The store's methods run on its own thread, not on the cooperative
    /// pool, whose few threads its fsyncs would hold.
    @Test func theStoreRunsOnAThreadOfItsOwn() async throws {
        let dir = try SurvivalTempDir()
        let store = try SurvivalStore(path: dir.store)
        #expect(await store.runsOnItsThread())
    }

    @Test func heartbeatsLeasesAndEventsPersist() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        let id = UUID().uuidString
        _ = try await store.beginRun(runStart(id, at: clocks.readings))
        let lease = HeartbeatLease(id: 7, strategy: "focus", holds: "logind", state: "active")
        let other = HeartbeatLease(id: 9, strategy: "music", holds: "none", state: "active")
        try await store.heartbeat(clocks.awake(60), leases: [lease])
        try await store.heartbeat(clocks.awake(60), leases: [lease, other])
        var expiring = lease
        expiring.state = "expiring"
        try await store.heartbeat(clocks.awake(60), leases: [expiring, other])
        try await store.heartbeat(clocks.awake(60), leases: [])
        let eventAt = clocks.awake(1)
        try await store.recordEvent("lease-expired", strategy: "focus", fields: ["lease": "7", "reason": "budget"], readings: eventAt)
        try await store.recordEvent("reload", strategy: nil, fields: [:], readings: clocks.awake(1))

        // A second store object on the same file sees it all (as a restarted host would).
        let beats = try SurvivalReport.heartbeats(path: dir.store, runId: id)
        #expect(beats.map(\.seq) == [0, 1, 2, 3, 4])
        #expect(beats.map(\.leases) == [[], [lease], [lease, other], [expiring, other], []])
        #expect(beats[4].readings.monotonicMicros == 5_000_000_000 + 240_000_000)
        let events = try SurvivalReport.events(path: dir.store, runId: id)
        #expect(events.count == 2)
        #expect(events[0].name == "lease-expired")
        #expect(events[0].strategy == "focus")
        #expect(events[0].fields == ["lease": "7", "reason": "budget"])
        #expect(events[0].readings == eventAt)
        #expect(events[0].afterSeq == 4)
        #expect(events[1].strategy == nil && events[1].fields.isEmpty)
        // A lease unchanged across heartbeats is one span row, not one row per heartbeat.
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT count(*) FROM leaseSpan") == ["3"])
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT fields FROM event ORDER BY id") == [#"{"lease":"7","reason":"budget"}"#, "NULL"])
        let summary = try #require(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).first)
        #expect(summary.events == 2)
        #expect(summary.heartbeats == 5)
        #expect(summary.endReason == .running)
        #expect(summary.endWall == nil)
    }

    @Test func runWithoutEndIsMarkedKilledByTheNextStart() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let first = UUID().uuidString
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart(first, at: clocks.readings))
            for _ in 0..<3 { try await store.heartbeat(clocks.awake(60), leases: []) }
        }
        let lastBeatWall = clocks.wall
        clocks.awake(45) // it died 45 s after its last heartbeat; nobody wrote that down
        let store = try SurvivalStore(path: dir.store)
        let began = try await store.beginRun(runStart(at: clocks.readings))
        #expect(began.closedRuns.map(\.runId) == [first])
        #expect(began.closedRuns.first?.endReason == .killed)
        #expect(began.previousRun?.runId == first)
        let killed = try #require(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).last)
        #expect(killed.runId == first)
        #expect(killed.endReason == .killed)
        #expect(killed.endWall == lastBeatWall)
        // Alive time ends at the last heartbeat, not at the next start.
        #expect(killed.aliveMicros == 180_000_000)
        #expect(killed.stalls == 0)
    }

    @Test func runWithoutEndInAnotherBootIsMarkedRebooted() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let first = UUID().uuidString
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart(first, boot: "boot-a", at: clocks.readings))
            try await store.heartbeat(clocks.awake(60), leases: [])
        }
        // New boot: monotonic and boottime restart near zero.
        var rebooted = FakeClocks(wall: clocks.wall + 300_000_000, mono: 20_000_000, boot: 20_000_000)
        let store = try SurvivalStore(path: dir.store)
        let began = try await store.beginRun(runStart(boot: "boot-b", at: rebooted.readings))
        #expect(began.closedRuns.map(\.endReason) == [.rebooted])
        #expect(began.closedRuns.first?.endNote?.contains("boot-a") == true)
        #expect(began.closedRuns.first?.endNote?.contains("boot-b") == true)
        try await store.heartbeat(rebooted.awake(60), leases: [])
        let runs = try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil)
        #expect(runs.map(\.endReason) == [.running, .rebooted])
        #expect(runs[1].aliveMicros == 60_000_000)
    }

    /// A store with a run begun and one heartbeat written.
    private func storeWithARun(_ clocks: inout FakeClocks) async throws -> (SurvivalTempDir, SurvivalStore, String) {
        let dir = try SurvivalTempDir()
        let store = try SurvivalStore(path: dir.store)
        let id = UUID().uuidString
        _ = try await store.beginRun(runStart(id, at: clocks.readings))
        try await store.heartbeat(clocks.awake(60), leases: [])
        return (dir, store, id)
    }

    @Test func endRunIsAStopWithAFinalHeartbeat() async throws {
        var clocks = FakeClocks()
        let (dir, store, id) = try await storeWithARun(&clocks)
        let end = clocks.awake(30)
        try await store.endRun(reason: .stopped, readings: end)
        #expect(await store.activeRunId == nil)
        // A clean end is not turned into killed by the next start.
        let began = try await store.beginRun(runStart(at: clocks.awake(5)))
        #expect(began.closedRuns.isEmpty)
        #expect(began.previousRun?.endReason == .stopped)
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).last)
        #expect(run.runId == id)
        #expect(run.endReason == .stopped)
        #expect(run.endWall == end.wallMicros)
        #expect(run.heartbeats == 3)
        #expect(run.aliveMicros == 90_000_000)
        #expect(run.awakeMicros == 90_000_000)
    }

    @Test func misuseGivesSpecificErrors() async throws {
        let dir = try SurvivalTempDir()
        let clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        let noRun = await #expect(throws: SurvivalStoreError.self) { try await store.heartbeat(clocks.readings, leases: []) }
        #expect(noRun?.code == .noActiveRun)
        let zero = await #expect(throws: SurvivalStoreError.self) { try await store.beginRun(runStart(interval: .zero, at: clocks.readings)) }
        #expect(zero?.code == .invalidArgument)
        let id = UUID().uuidString
        _ = try await store.beginRun(runStart(id, at: clocks.readings))
        let twice = await #expect(throws: SurvivalStoreError.self) { try await store.beginRun(runStart(at: clocks.readings)) }
        #expect(twice?.code == .runAlreadyActive)
        let running = await #expect(throws: SurvivalStoreError.self) { try await store.endRun(reason: .running, readings: clocks.readings) }
        #expect(running?.code == .invalidArgument)
        try await store.endRun(reason: .failed, readings: clocks.readings)
        let reused = await #expect(throws: SurvivalStoreError.self) { try await store.beginRun(runStart(id, at: clocks.readings)) }
        #expect(reused?.code == .invalidArgument)
        #expect(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).map(\.endReason) == [.failed])
    }

    @Test func garbageFileIsRefusedWithAClearError() throws {
        let dir = try SurvivalTempDir()
        let path = dir.path + "/survival.sqlite"
        let garbage = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalStore(path: path) }
        #expect(error?.code == .notAVigilStore)
        #expect(error?.description.contains(path) == true)
        #expect(error?.description.contains("not an SQLite database") == true)
        let reportError = #expect(throws: SurvivalStoreError.self) { try SurvivalReport.load(path: path, runs: nil, sinceWallMicros: nil) }
        #expect(reportError?.code == .notAVigilStore)
        // The file is left as it was.
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)
    }

    @Test func foreignSQLiteDatabaseIsRefusedAndLeftAlone() throws {
        let dir = try SurvivalTempDir()
        let path = dir.path + "/other.sqlite"
        try SurvivalStoreInspector.execute(path: path, sql: "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me')")
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalStore(path: path) }
        #expect(error?.code == .notAVigilStore)
        #expect(error?.description.contains("notes") == true)
        #expect(try SurvivalStoreInspector.strings(path: path, sql: "PRAGMA journal_mode") == ["delete"])
        #expect(try SurvivalStoreInspector.strings(path: path, sql: "SELECT body FROM notes") == ["keep me"])
    }

    @Test func corruptStoreIsRefusedWithAClearError() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart(at: clocks.readings))
            try await store.appendHeartbeats((0..<3000).map { _ in HeartbeatSample(readings: clocks.awake(60)) })
            try await store.endRun(reason: .stopped, readings: clocks.awake(1))
        }
        // Overwrite the middle of the file (b-tree pages), keep the header.
        let handle = try #require(FileHandle(forWritingAtPath: dir.store))
        try handle.seek(toOffset: 4096 * 3)
        try handle.write(contentsOf: Data(repeating: 0xA5, count: 4096 * 4))
        try handle.close()
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalStore(path: dir.store) }
        #expect(error?.code == .corrupt)
        #expect(error?.description.contains("corrupt") == true)
    }

    /// A damaged file can hold NULLs where the schema forbids them (the
    /// fuzzer found one: a heartbeat whose runId read back NULL). Every reader
    /// must end in an error, not a trap in GRDB's non-throwing subscript.
    @Test func nullsWhereTheSchemaForbidsThemAreErrorsNotCrashes() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        do {
            let store = try SurvivalStore(path: dir.store)
            _ = try await store.beginRun(runStart("nulls", at: clocks.readings))
            try await store.appendHeartbeats((0..<5).map { _ in HeartbeatSample(readings: clocks.awake(60)) })
            try await store.endRun(reason: .stopped, readings: clocks.awake(1))
        }
        // Rewrite the table's schema without its NOT NULLs, as damage could.
        try SurvivalStoreInspector.execute(path: dir.store, sql: """
            PRAGMA writable_schema = ON;
            UPDATE sqlite_schema SET sql = replace(sql, 'NOT NULL', '') WHERE name = 'heartbeat';
            PRAGMA writable_schema = OFF;
            """)
        try SurvivalStoreInspector.execute(path: dir.store, sql: "UPDATE heartbeat SET wall = NULL, mono = NULL WHERE seq = 2")
        #expect(try SurvivalStoreInspector.strings(path: dir.store, sql: "SELECT mono FROM heartbeat WHERE seq = 2") == ["NULL"])
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalReport.heartbeats(path: dir.store, runId: "nulls") }
        #expect(error?.description.contains("reading run nulls") == true)
        #expect(error?.description.contains("NULL") == true)
        // The recount's window functions and the picture meet the same rows.
        _ = try? SurvivalReport.recount(path: dir.store)
        _ = try? SurvivalPicture.load(path: dir.store, runs: nil, sinceWallMicros: nil)
    }

    @Test func storeFromANewerVigilIsNotWritten() throws {
        let dir = try SurvivalTempDir()
        _ = try SurvivalStore(path: dir.store)
        try SurvivalStoreInspector.execute(path: dir.store, sql: "INSERT INTO grdb_migrations VALUES ('v9-from-the-future')")
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalStore(path: dir.store) }
        #expect(error?.code == .newerSchema)
        #expect(error?.description.contains("v9-from-the-future") == true)
    }

    @Test func immutableFallbackReadsAStoreWithAnAwkwardPath() async throws {
        let dir = try SurvivalTempDir()
        let path = dir.path + "/odd dir #1?/survival%.sqlite"
        var clocks = FakeClocks()
        do {
            let store = try SurvivalStore(path: path)
            _ = try await store.beginRun(runStart("odd", at: clocks.readings))
            try await store.endRun(reason: .stopped, readings: clocks.awake(60))
        }
        // Opened and closed (deinit) by the immutable fallback alone.
        _ = try #require(try SurvivalReport.openReader(path: path, immutable: true))
        #expect(try SurvivalReport.load(path: path, runs: nil, sinceWallMicros: nil).map(\.runId) == ["odd"])
    }

    @Test func missingStoreIsReportedNotCreated() throws {
        let dir = try SurvivalTempDir()
        let error = #expect(throws: SurvivalStoreError.self) { try SurvivalReport.load(path: dir.store, runs: 10, sinceWallMicros: nil) }
        #expect(error?.code == .missing)
        #expect(!FileManager.default.fileExists(atPath: dir.store))
    }

    @Test func runsAndSinceSelectTheNewestRuns() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        var ids: [String] = []
        var ends: [Int64] = []
        for _ in 0..<4 {
            let id = UUID().uuidString
            ids.append(id)
            _ = try await store.beginRun(runStart(id, at: clocks.readings))
            try await store.heartbeat(clocks.awake(60), leases: [])
            try await store.endRun(reason: .stopped, readings: clocks.awake(60))
            ends.append(clocks.wall)
            _ = clocks.awake(600)
        }
        #expect(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: nil).map(\.runId) == ids.reversed())
        #expect(try SurvivalReport.load(path: dir.store, runs: 2, sinceWallMicros: nil).map(\.runId) == [ids[3], ids[2]])
        // since: runs alive at or after that time, including one that started earlier.
        #expect(try SurvivalReport.load(path: dir.store, runs: nil, sinceWallMicros: ends[1] - 30_000_000).map(\.runId) == [ids[3], ids[2], ids[1]])
        #expect(try SurvivalReport.load(path: dir.store, runs: 0, sinceWallMicros: nil).isEmpty)
    }
}
