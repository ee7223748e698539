import Foundation
import GRDB

/// When a strategy held leases in one run, as the survival log saw it: the
/// store keeps each lease as a span of heartbeats (`leaseSpan`), so a held
/// span starts at the first heartbeat that saw one of the strategy's leases
/// and ends at the last, with the heartbeat interval as its resolution.
public struct HeldSpan: Codable, Sendable, Hashable {
    /// Boottime since the run's start at heartbeat `firstSeq` (µs).
    public var startOffsetMicros: Int64
    /// Boottime from heartbeat `firstSeq` to heartbeat `lastSeq` (µs; 0 when
    /// only one heartbeat saw it).
    public var durationMicros: Int64
    public var firstSeq: Int
    public var lastSeq: Int
}

/// One strategy's held time in one run: the union of its leases' spans.
public struct StrategyHeld: Codable, Sendable, Hashable {
    /// The strategy instance (or client) that held the leases.
    public var strategy: String
    /// What its leases held on the system ("logind", "wakelock", ...), distinct and sorted.
    public var holds: [String]
    /// Oldest first, never overlapping.
    public var spans: [HeldSpan]

    public var heldMicros: Int64 { spans.reduce(0) { $0 + $1.durationMicros } }
}

/// What `vigilctl survival --html/--svg` draws: the report's runs, each with
/// its strategies' held time.
public struct SurvivalPicture: Sendable, Hashable {
    public struct Run: Sendable, Hashable {
        public var summary: RunSummary
        /// Most held first.
        public var strategies: [StrategyHeld]

        public init(summary: RunSummary, strategies: [StrategyHeld]) {
            self.summary = summary
            self.strategies = strategies
        }
    }

    /// Newest first, as ``SurvivalReport/load(path:runs:sinceWallMicros:)`` returns them.
    public var runs: [Run]
    /// Where the time axis starts (`--since`); nil: at the oldest run's start.
    /// Runs that began earlier are cut at the left edge.
    public var sinceWallMicros: Int64?

    public init(runs: [Run], sinceWallMicros: Int64? = nil) {
        self.runs = runs
        self.sinceWallMicros = sinceWallMicros
    }

    /// The same runs as the text report (`runs`, `sinceWallMicros` as in
    /// ``SurvivalReport/load(path:runs:sinceWallMicros:)``), with the lease
    /// spans of each run merged per strategy. Reads the `run`, `gap`,
    /// resume `event` and `leaseSpan` rows, and one heartbeat row per end of
    /// a merged span (by primary key): never the whole heartbeat table.
    public static func load(path: String, runs: Int?, sinceWallMicros: Int64?) throws -> SurvivalPicture {
        try SurvivalReport.read(path: path, runs: runs, sinceWallMicros: sinceWallMicros) { db, records in
            let summaries = try SurvivalReport.summaries(records, db)
            return SurvivalPicture(runs: try zip(records, summaries).map { record, summary in
                Run(summary: summary, strategies: try held(runKey: record.key, startBoot: record.startBoot, db))
            }, sinceWallMicros: sinceWallMicros)
        } ?? SurvivalPicture(runs: [], sinceWallMicros: sinceWallMicros)
    }

    /// The lease spans of one run merged per strategy: spans whose heartbeat
    /// ranges touch or overlap become one.
    static func held(runKey: Int64, startBoot: Int64, _ db: Database) throws -> [StrategyHeld] {
        let rows = try db.rows("""
            SELECT strategy, holds, firstSeq, lastSeq FROM leaseSpan
            WHERE runId = ? ORDER BY strategy, firstSeq
            """, [runKey]) { row in
            try (strategy: row.string(0), holds: row.string(1), first: row.int64(2), last: row.int64(3))
        }
        var merged: [String: (holds: Set<String>, ranges: [ClosedRange<Int64>])] = [:]
        for row in rows {
            let range: ClosedRange<Int64> = row.first...max(row.first, row.last)
            var entry = merged[row.strategy] ?? (holds: [], ranges: [])
            entry.holds.insert(row.holds)
            if let last = entry.ranges.last, range.lowerBound <= last.upperBound + 1 {
                entry.ranges[entry.ranges.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
            } else {
                entry.ranges.append(range)
            }
            merged[row.strategy] = entry
        }
        // Prepared once for every end of a span.
        let boot = try db.cachedStatement(sql: "SELECT boot FROM heartbeat WHERE runId = ? AND seq = ?")
        func offset(_ seq: Int64) throws -> Int64? {
            try Row.fetchOne(boot, arguments: [runKey, seq]).map { try StoreRow(row: $0).int64(0) }.map { max(0, $0 - startBoot) }
        }
        var out: [StrategyHeld] = []
        for (strategy, entry) in merged {
            var spans: [HeldSpan] = []
            for range in entry.ranges {
                // A span names heartbeats of its run, which are never deleted
                // alone (the foreign keys cascade from the run).
                guard let first = try offset(range.lowerBound), let last = try offset(range.upperBound) else { continue }
                spans.append(HeldSpan(startOffsetMicros: first, durationMicros: max(0, last - first),
                                      firstSeq: Int(range.lowerBound), lastSeq: Int(range.upperBound)))
            }
            out.append(StrategyHeld(strategy: strategy, holds: entry.holds.sorted(), spans: spans))
        }
        return out.sorted { ($0.heldMicros, $1.strategy) > ($1.heldMicros, $0.strategy) }
    }
}
