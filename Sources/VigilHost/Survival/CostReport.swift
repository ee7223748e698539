import Foundation
import GRDB
import VigilKit

/// What each strategy cost over the runs of a period, read from the
/// survival store (`vigilctl cost`): "what kept this machine awake".
public struct CostReport: Codable, Sendable, Hashable {
    /// One strategy's cost summed over the period's runs.
    public struct Strategy: Codable, Sendable, Hashable {
        public var strategy: String
        /// Runs of the period in which it cost anything.
        public var runs: Int
        public var cost: StrategyCostRow
    }

    /// The start of the period (microseconds since the Unix epoch); nil: every run.
    public var sinceWallMicros: Int64?
    /// Runs alive at or after `sinceWallMicros`.
    public var runs: Int
    /// Of those, runs recorded before the store kept costs (by a vigild
    /// older than the `v4-strategyCost` migration): not in the figures.
    public var runsWithoutCost: Int
    /// Most time holding sleep off first, then most idle held, most CPU,
    /// most wakeups, then by name.
    public var strategies: [Strategy]

    /// Reads the costs of the runs alive at or after `sinceWallMicros`
    /// (whole runs: a run that began before counts whole). A store made
    /// before costs were kept opens read-only as it is, with its runs
    /// counted in ``runsWithoutCost``. Throws `.missing` when there is no
    /// store at `path`.
    public static func load(path: String, sinceWallMicros: Int64?) throws -> CostReport {
        let reader = try SurvivalReport.openReader(path: path)
        defer { try? reader?.close() }
        guard let reader else { return CostReport(sinceWallMicros: sinceWallMicros, runs: 0, runsWithoutCost: 0, strategies: []) }
        do {
            return try reader.read { db in
                let runs = try Int64.fetchAll(db, sql: """
                    SELECT id FROM run WHERE ?1 IS NULL OR COALESCE(endWall, lastWall) >= ?1
                    """, arguments: [sinceWallMicros])
                // The migration marks the runs it found: they have no costs.
                let withCost: Set<Int64> = try db.tableExists(StrategyCostRecord.databaseTableName)
                    ? Set(Int64.fetchAll(db, sql: "SELECT id FROM run WHERE costsRecorded = 1"))
                    : []
                let records = withCost.isEmpty ? [] : try StrategyCostRecord
                    .filter(runs.filter(withCost.contains).contains(Column("runId")))
                    .fetchAll(db)
                var byStrategy: [String: Strategy] = [:]
                for record in records {
                    var total = byStrategy[record.strategy] ?? Strategy(strategy: record.strategy, runs: 0, cost: StrategyCostRow())
                    total.runs += 1
                    total.cost = total.cost + record.cost
                    byStrategy[record.strategy] = total
                }
                return CostReport(
                    sinceWallMicros: sinceWallMicros, runs: runs.count,
                    runsWithoutCost: runs.filter { !withCost.contains($0) }.count,
                    strategies: byStrategy.values.sorted(by: Self.costlierFirst))
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading the costs")
        }
    }

    static func costlierFirst(_ a: Strategy, _ b: Strategy) -> Bool {
        let x = a.cost, y = b.cost
        let left = (x.sleepHeldUsec, x.idleHeldUsec, x.childCPUUsec, x.wakeups), right = (y.sleepHeldUsec, y.idleHeldUsec, y.childCPUUsec, y.wakeups)
        if left != right { return left > right }
        return a.strategy < b.strategy
    }
}
