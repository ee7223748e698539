import Foundation
import GRDB
import Testing
@testable import VigilHost

/// Strings that may come from D-Bus clients are cut before they reach the
/// store, whatever the bus door let through (4 MB names grew a store to
/// 805 MB in 81 s).
@Suite("Survival store bounds")
struct SurvivalStoreBoundsTests {
    @Test func clientStringsAreCutBeforeTheStore() async throws {
        let dir = try SurvivalTempDir()
        var clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(interval: .seconds(1), at: clocks.readings))
        let huge = String(repeating: "n", count: 4 << 20)
        for i in 0..<20 {
            try await store.recordEvent("lease-acquired", strategy: huge, fields: ["holds": huge, huge: "x"], readings: clocks.awake(1))
            try await store.heartbeat(clocks.awake(1), leases: [HeartbeatLease(id: UInt64(i), strategy: huge, holds: huge, state: "active")])
        }
        try await store.endRun(reason: .stopped, readings: clocks.awake(1))
        let queue = try DatabaseQueue(path: dir.store)
        let longest = try await queue.read { db in
            try Int.fetchOne(db, sql: """
                SELECT MAX(m) FROM (
                    SELECT MAX(LENGTH(strategy), LENGTH(fields)) AS m FROM event
                    UNION ALL SELECT MAX(LENGTH(strategy), LENGTH(holds)) FROM leaseSpan)
                """) ?? 0
        }
        // The JSON of two cut fields and a cut key: about 3 KiB, not 12 MB.
        #expect(longest <= 4 * SurvivalStore.maxStoredStringBytes, "longest stored string: \(longest)")
        var info = stat()
        #expect(stat(dir.store, &info) == 0 && info.st_size < 2 << 20, "store is \(info.st_size) bytes")
        #expect(SurvivalStore.bounded(huge).hasSuffix("bytes cut)"))
        #expect(SurvivalStore.bounded("short") == "short")
    }
}

@Suite("Survival report warnings")
struct SurvivalReportWarningsTests {
    @Test func aNewerSchemaIsNamed() async throws {
        let dir = try SurvivalTempDir()
        let clocks = FakeClocks()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart(at: clocks.readings))
        try await store.endRun(reason: .stopped, readings: clocks.readings)
        #expect(SurvivalReport.warnings(path: dir.store).isEmpty)
        let queue = try DatabaseQueue(path: dir.store)
        try await queue.write { db in try db.execute(sql: "INSERT INTO grdb_migrations VALUES ('v99-from-the-future')") }
        try queue.close()
        let warnings = SurvivalReport.warnings(path: dir.store)
        #expect(warnings == ["the store was written by a newer Vigil (unknown migrations: v99-from-the-future); what that version added is not shown"])
    }
}
