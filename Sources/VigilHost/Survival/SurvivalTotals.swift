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
}

extension SurvivalStore {
    /// Sums every run in the store (see ``SurvivalTotals``).
    public func metricTotals() throws -> SurvivalTotals {
        let runId = activeRunId
        return try database.read { db in
            var totals = SurvivalTotals()
            for row in try Row.fetchAll(db, sql: "SELECT endReason, COUNT(*) FROM run GROUP BY endReason") {
                if let reason = RunEndReason(rawValue: try row.decode(atIndex: 0)) { totals.runs[reason] = try row.decode(atIndex: 1) }
            }
            if let row = try Row.fetchOne(db, sql: """
                SELECT COALESCE(SUM(suspendCount), 0), COALESCE(SUM(suspendedMicros), 0),
                       COALESCE(SUM(stallCount), 0), COALESCE(SUM(stalledMicros), 0) FROM run
                """) {
                totals.suspends = try row.decode(atIndex: 0)
                totals.suspendedMicros = try row.decode(atIndex: 1)
                totals.stalls = try row.decode(atIndex: 2)
                totals.stalledMicros = try row.decode(atIndex: 3)
            }
            if let runId {
                totals.lastHeartbeatWallMicros = try Int64.fetchOne(db, sql: "SELECT lastWall FROM run WHERE uuid = ?", arguments: [runId])
            }
            return totals
        }
    }
}
