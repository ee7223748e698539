import Foundation
import GRDB

/// One heartbeat read back from the store, with the leases active at it
/// (ordered by lease id).
public struct HeartbeatEntry: Codable, Sendable, Hashable {
    public var seq: Int
    public var readings: ClockReadings
    public var leases: [HeartbeatLease]
}

/// One event read back from the store.
public struct EventEntry: Codable, Sendable, Hashable {
    /// The heartbeat the event followed.
    public var afterSeq: Int
    public var name: String
    public var strategy: String?
    public var fields: [String: String]
    public var readings: ClockReadings
}

extension SurvivalReport {
    /// Every heartbeat of run `runId`, oldest first, with its leases
    /// (rebuilt from the lease spans).
    public static func heartbeats(path: String, runId: String) throws -> [HeartbeatEntry] {
        try readRun(path: path, runId: runId) { db, key in
            let beats = try HeartbeatRecord.filter(Column("runId") == key).order(Column("seq")).fetchAll(db)
            let spans = try LeaseSpanRecord.filter(Column("runId") == key).order(Column("firstSeq"), Column("leaseId")).fetchAll(db)
            var next = 0
            var open: [LeaseSpanRecord] = []
            return beats.map { beat in
                while next < spans.count, spans[next].firstSeq <= beat.seq {
                    open.append(spans[next])
                    next += 1
                }
                open.removeAll { $0.lastSeq < beat.seq }
                return HeartbeatEntry(
                    seq: Int(beat.seq), readings: beat.readings,
                    leases: open
                        .map { HeartbeatLease(id: UInt64(bitPattern: $0.leaseId), strategy: $0.strategy, holds: $0.holds, state: $0.state) }
                        .sorted { $0.id < $1.id })
            }
        }
    }

    /// Every event of run `runId`, in the order recorded.
    public static func events(path: String, runId: String) throws -> [EventEntry] {
        try readRun(path: path, runId: runId) { db, key in
            try EventRecord.filter(Column("runId") == key).order(Column("id")).fetchAll(db).map { event in
                var fields: [String: String] = [:]
                if let text = event.fields {
                    fields = try JSONDecoder().decode([String: String].self, from: Data(text.utf8))
                }
                return EventEntry(
                    afterSeq: Int(event.seq), name: event.name, strategy: event.strategy, fields: fields,
                    readings: ClockReadings(wallMicros: event.wall, monotonicMicros: event.mono, boottimeMicros: event.boot))
            }
        }
    }

    private static func readRun<T>(path: String, runId: String, _ body: (Database, Int64) throws -> T) throws -> T {
        guard let reader = try openReader(path: path) else {
            throw SurvivalStoreError(.invalidArgument, path: path, "no run \(runId): the store is empty")
        }
        defer { try? reader.close() }
        do {
            return try reader.read { db in
                guard let key = try Int64.fetchOne(db, sql: "SELECT id FROM run WHERE uuid = ?", arguments: [runId]) else {
                    throw SurvivalStoreError(.invalidArgument, path: path, "no run \(runId) in the store")
                }
                return try body(db, key)
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading run \(runId)")
        }
    }
}

/// Direct SQL on a store file, for tests and benchmarks that check the schema
/// or build unusual files. Not part of the public API.
enum SurvivalStoreInspector {
    /// Runs `sql` (one or more statements) on `path`, creating the file if needed.
    static func execute(path: String, sql: String) throws {
        let queue = try DatabaseQueue(path: path)
        try queue.write { try $0.execute(sql: sql) }
        try queue.close()
    }

    /// The first column of every row `sql` returns, as text (NULL as "NULL").
    static func strings(path: String, sql: String) throws -> [String] {
        var config = Configuration()
        config.readonly = true
        let queue = try DatabaseQueue(path: path, configuration: config)
        defer { try? queue.close() }
        return try queue.read { db in
            try Row.fetchAll(db, sql: sql).map { row in
                let value: DatabaseValue = try row.decode(atIndex: 0)
                return value.isNull ? "NULL" : (String.fromDatabaseValue(value) ?? value.description)
            }
        }
    }
}

/// A run's figures recomputed from its raw heartbeat rows.
public struct RunRecount: Codable, Sendable, Hashable {
    public var runId: String
    public var heartbeats: Int
    public var aliveMicros: Int64
    public var awakeMicros: Int64
    public var suspends: Int
    public var suspendedMicros: Int64
    public var stalls: Int
    public var stalledMicros: Int64
    public var longestStallMicros: Int64

    /// Whether `summary` (built from the aggregates kept at write time) agrees.
    public func matches(_ summary: RunSummary) -> Bool {
        runId == summary.runId && heartbeats == summary.heartbeats && aliveMicros == summary.aliveMicros
            && awakeMicros == summary.awakeMicros && suspends == summary.suspends
            && suspendedMicros == summary.suspendedMicros && stalls == summary.stalls
            && stalledMicros == summary.stalledMicros && longestStallMicros == summary.longestStallMicros
    }
}

extension SurvivalReport {
    /// Recomputes every run's figures from the heartbeat table alone (one
    /// full scan with window functions, applying `GapRule` in SQL), newest
    /// run first. An audit of the aggregates that `load` reads: the two must
    /// agree. Its cost grows with the log; `load`'s does not.
    public static func recount(path: String) throws -> [RunRecount] {
        guard let reader = try openReader(path: path) else { return [] }
        defer { try? reader.close() }
        do {
            return try reader.read { db in
                let stall = "d.mono > r.intervalMicros + MAX(r.intervalMicros / 2, \(GapRule.minimumStallSlackMicros))"
                let sleep = "(d.boot - d.mono) > \(GapRule.suspendThresholdMicros)"
                let rows = try Row.fetchAll(db, sql: """
                    WITH d AS (
                        SELECT runId,
                            MAX(0, mono - LAG(mono, 1, mono) OVER beats) AS mono,
                            MAX(0, boot - LAG(boot, 1, boot) OVER beats) AS boot
                        FROM heartbeat
                        WINDOW beats AS (PARTITION BY runId ORDER BY seq)
                    )
                    SELECT r.uuid AS runId, COUNT(*) AS heartbeats,
                        SUM(d.boot) AS aliveMicros, SUM(d.mono) AS awakeMicros,
                        SUM(\(sleep)) AS suspends,
                        SUM(CASE WHEN \(sleep) THEN d.boot - d.mono ELSE 0 END) AS suspendedMicros,
                        SUM(\(stall)) AS stalls,
                        SUM(CASE WHEN \(stall) THEN d.mono ELSE 0 END) AS stalledMicros,
                        MAX(CASE WHEN \(stall) THEN d.mono ELSE 0 END) AS longestStallMicros
                    FROM d JOIN run r ON r.id = d.runId
                    GROUP BY d.runId ORDER BY d.runId DESC
                    """)
                return try rows.map { row in
                    try RunRecount(
                        runId: row.decode(forColumn: "runId"), heartbeats: row.decode(forColumn: "heartbeats"),
                        aliveMicros: row.decode(forColumn: "aliveMicros"), awakeMicros: row.decode(forColumn: "awakeMicros"),
                        suspends: row.decode(forColumn: "suspends"), suspendedMicros: row.decode(forColumn: "suspendedMicros"),
                        stalls: row.decode(forColumn: "stalls"), stalledMicros: row.decode(forColumn: "stalledMicros"),
                        longestStallMicros: row.decode(forColumn: "longestStallMicros"))
                }
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "recounting heartbeats")
        }
    }
}
