import GRDB

/// What the survival log adds up to over every run it holds: the survival
/// part of the metrics. One row per run, so this reads a handful of rows
/// however long the log is.
public struct SurvivalTotals: Sendable, Hashable {
    /// Runs by how they ended; the current run is `running`.
    public var runs: [RunEndReason: Int] = [:]
    public var suspends = 0
    public var suspendedMicros: Int64 = 0
    /// Stalls: the host frozen or starved between heartbeats.
    public var stalls = 0
    public var stalledMicros: Int64 = 0
    /// The wall time of the current run's last heartbeat.
    public var lastHeartbeatWallMicros: Int64?


    /// Sums every run in the store, read through the writer's connection
    /// (inside its read); `activeRunId` is the current run's id, if one is
    /// running.
    static func read(_ db: Database, activeRunId: String?) throws -> SurvivalTotals {
        var totals = SurvivalTotals()
        for (reason, count) in try db.rows("SELECT endReason, COUNT(*) FROM run GROUP BY endReason", [], { try ($0.string(0), $0.int(1)) }) {
            if let reason = RunEndReason(rawValue: reason) { totals.runs[reason] = count }
        }
        if let sums = try db.row("""
            SELECT COALESCE(SUM(suspendCount), 0), COALESCE(SUM(suspendedMicros), 0),
                   COALESCE(SUM(stallCount), 0), COALESCE(SUM(stalledMicros), 0) FROM run
            """, [], { try ($0.int(0), $0.int64(1), $0.int(2), $0.int64(3)) }) {
            (totals.suspends, totals.suspendedMicros, totals.stalls, totals.stalledMicros) = sums
        }
        if let activeRunId {
            totals.lastHeartbeatWallMicros = try db.row("SELECT lastWall FROM run WHERE uuid = ?", [activeRunId]) { try $0.int64(0) }
        }
        return totals
    }
}
