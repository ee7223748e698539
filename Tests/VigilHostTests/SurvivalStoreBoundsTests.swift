import Foundation
import GRDB
import Testing
import VigilTestSupport
@testable import VigilHost
@testable import VigilSurvival

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

/// A full filesystem under the store (a 1 MiB tmpfs mounted by the test,
/// which runs as root): only heartbeats that could not be written leave an
/// unwritable gap; events lost between two written heartbeats are counted
/// but leave none (in the full suite they used to make one gap a second).
@Suite("Survival store on a full disk")
struct SurvivalStoreFullDiskTests {
    /// Runs `body` with a directory on a fresh 1 MiB tmpfs.
    static func withTmpfs(_ body: (String) async throws -> Void) async throws {
        var template = Array("/tmp/vigil-storefull-XXXXXX".utf8CString)
        let mountPoint = String(cString: try #require(mkdtemp(&template)))
        defer { try? FileManager.default.removeItem(atPath: mountPoint) }
        let mounted = try await ProcessRunner.runDetached("/bin/mount", ["-t", "tmpfs", "-o", "size=1m", "vigil-storefull", mountPoint])
        try #require(mounted.status == 0, "mount: \(mounted.stderr)")
        defer { _ = umount2(mountPoint, Int32(MNT_DETACH)) }
        try await body(mountPoint)
    }

    static func unwritableGaps(_ path: String) throws -> Int {
        try #require(try SurvivalReport.load(path: path, runs: nil, sinceWallMicros: nil).first).unwritableGaps
    }

    @Test func lostEventsBetweenWrittenHeartbeatsLeaveNoGap() async throws {
        try await Self.withTmpfs { dir in
            var clocks = FakeClocks()
            let path = dir + "/survival.sqlite"
            let store = try SurvivalStore(path: path, walCheckpointBytes: nil)
            _ = try await store.beginRun(runStart(interval: .seconds(1), at: clocks.readings))
            try await store.heartbeat(clocks.awake(1), leases: [])
            let filler = dir + "/filler"
            #expect(try fillFilesystem(filler) > 0)
            await #expect(throws: SurvivalStoreError.self) {
                try await store.recordEvent("lease-acquired", strategy: "s", fields: ["holds": String(repeating: "x", count: 8000)], readings: clocks.awake(0))
            }
            #expect(await store.unwritableState?.failedWrites == 1)
            #expect(await store.unwritableState?.failedHeartbeats == 0)
            // Room again: the next heartbeat is written, with no hole before it.
            #expect(truncate(filler, 0) == 0)
            try await store.heartbeat(clocks.awake(1), leases: [])
            #expect(await store.unwritableState == nil)
            #expect(try Self.unwritableGaps(path) == 0)

            // A heartbeat that cannot be written does leave one.
            _ = try fillFilesystem(filler)
            await #expect(throws: SurvivalStoreError.self) { try await store.heartbeat(clocks.awake(1), leases: []) }
            #expect(await store.unwritableState?.failedHeartbeats == 1)
            #expect(truncate(filler, 0) == 0)
            try await store.heartbeat(clocks.awake(1), leases: [])
            #expect(try Self.unwritableGaps(path) == 1)
        }
    }
}
