import Foundation
import VigilKit
import GRDB

/// Answers `Survival` from inside vigild: a read-only connection to the
/// survival store, opened on first use and kept for the life of the API.
///
/// Kept open on purpose: a short-lived GRDB queue is released on
/// libdispatch's default queue, which starts its 1 Hz worker monitor for the
/// life of the process (see Sources/CExecutor), so `SurvivalReport.load`,
/// which opens and closes a queue per call, must not run inside vigild.
final class HostBusSurvivalReader: @unchecked Sendable {
    // Invariant: `reader` is only touched while holding `lock`; GRDB's
    // DatabaseQueue is itself thread-safe.
    private let lock = NSLock()
    private var reader: DatabaseQueue?
    let path: String

    init(path: String) {
        self.path = path
    }

    /// Runs that started at or after `sinceWallMicros` (all for 0), newest first.
    func runs(startedSince sinceWallMicros: Int64) throws -> [RunSummary] {
        let queue: DatabaseQueue? = try lock.withLock {
            if let reader { return reader }
            reader = try SurvivalReport.openReader(path: path)
            return reader
        }
        guard let queue else { return [] }
        do {
            return try queue.read { db in
                let records = try RunRecord.fetchAll(db, sql: """
                    SELECT * FROM run WHERE startWall >= ? ORDER BY id DESC
                    """, arguments: [sinceWallMicros])
                return try SurvivalReport.summaries(records, db)
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading the runs")
        }
    }
}

extension RunRow {
    /// The `Survival` row of a run.
    init(_ run: RunSummary) {
        self.init()
        runId = run.runId
        startedAt = UInt64(clamping: run.startWall)
        endedAt = run.endReason == .running ? 0 : UInt64(clamping: run.endWall ?? run.lastHeartbeatWall)
        endReason = run.endReason.rawValue
        aliveUsec = UInt64(clamping: run.aliveMicros)
        awakeUsec = UInt64(clamping: run.awakeMicros)
        suspendedUsec = UInt64(clamping: run.suspendedMicros)
        stalls = UInt32(clamping: run.stalls)
        longestStallUsec = UInt64(clamping: run.longestStallMicros)
        heartbeats = UInt32(clamping: run.heartbeats)
    }
}
