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
    /// Apps' inhibits and client leases refused, and expired at their cap
    /// or budget, summed over the period's runs (runs recorded by a vigild
    /// that kept no such counts have none). Most refused and expired first.
    public var apps: [App] = []

    /// One app's refusals and expiries summed over the period's runs.
    public struct App: Codable, Sendable, Hashable {
        public var app: String
        public var refused: UInt64
        public var expired: UInt64
        /// Runs of the period in which it was refused or expired.
        public var runs: Int

        public init(app: String, refused: UInt64, expired: UInt64, runs: Int) {
            (self.app, self.refused, self.expired, self.runs) = (app, refused, expired, runs)
        }
    }

    /// Reads the costs of the runs alive at or after `sinceWallMicros`
    /// (whole runs: a run that began before counts whole). A store made
    /// before costs were kept opens read-only as it is, with its runs
    /// counted in ``runsWithoutCost``. Throws `.missing` when there is no
    /// store at `path`.
    public static func load(path: String, sinceWallMicros: Int64?) throws -> CostReport {
        guard let reader = try SurvivalReport.openReader(path: path) else {
            return CostReport(sinceWallMicros: sinceWallMicros, runs: 0, runsWithoutCost: 0, strategies: [])
        }
        do {
            return try reader.read { db in
                let runs = try db.rows("""
                    SELECT id FROM run WHERE ?1 IS NULL OR COALESCE(endWall, lastWall) >= ?1
                    """, [sinceWallMicros]) { try $0.int64(0) }
                // The migration marks the runs it found: they have no costs.
                let withCost: Set<Int64> = try db.tableExists("strategyCost")
                    ? Set(db.rows("SELECT id FROM run WHERE costsRecorded = 1") { try $0.int64(0) })
                    : []
                let counted = runs.filter(withCost.contains)
                let records = counted.isEmpty ? [] : try db.rows("""
                    SELECT strategy, wakeups, systemWakes, sleepHeldMicros, idleHeldMicros, childCPUMicros, bytesSent, bytesReceived
                    FROM strategyCost WHERE runId IN (\(counted.map(String.init).joined(separator: ", ")))
                    """) { row -> (strategy: String, cost: StrategyCostRow) in
                    var cost = StrategyCostRow()
                    cost.wakeups = UInt64(clamping: try row.int64(1))
                    cost.systemWakes = UInt64(clamping: try row.int64(2))
                    cost.sleepHeldUsec = UInt64(clamping: try row.int64(3))
                    cost.idleHeldUsec = UInt64(clamping: try row.int64(4))
                    cost.childCPUUsec = UInt64(clamping: try row.int64(5))
                    cost.bytesSent = UInt64(clamping: try row.int64(6))
                    cost.bytesReceived = UInt64(clamping: try row.int64(7))
                    return (strategy: try row.string(0), cost: cost)
                }
                var byStrategy: [String: Strategy] = [:]
                for record in records {
                    var total = byStrategy[record.strategy] ?? Strategy(strategy: record.strategy, runs: 0, cost: StrategyCostRow())
                    total.runs += 1
                    total.cost = total.cost + record.cost
                    byStrategy[record.strategy] = total
                }
                var byApp: [String: App] = [:]
                if try db.tableExists("appCount"), !runs.isEmpty {
                    let rows = try db.rows("""
                        SELECT app, refused, expired FROM appCount WHERE runId IN (\(runs.map(String.init).joined(separator: ", ")))
                        """) { row in (app: try row.string(0), refused: UInt64(clamping: try row.int64(1)), expired: UInt64(clamping: try row.int64(2))) }
                    for row in rows {
                        var total = byApp[row.app] ?? App(app: row.app, refused: 0, expired: 0, runs: 0)
                        total.refused &+= row.refused
                        total.expired &+= row.expired
                        total.runs += 1
                        byApp[row.app] = total
                    }
                }
                return CostReport(
                    sinceWallMicros: sinceWallMicros, runs: runs.count,
                    runsWithoutCost: runs.filter { !withCost.contains($0) }.count,
                    strategies: byStrategy.values.sorted(by: Self.costlierFirst),
                    apps: byApp.values.sorted { ($0.refused &+ $0.expired, $1.app) > ($1.refused &+ $1.expired, $0.app) })
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
