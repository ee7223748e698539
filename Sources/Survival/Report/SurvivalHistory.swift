import Foundation
import GRDB
import VigilKit

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
            let beats = try db.rows("SELECT seq, wall, mono, boot FROM heartbeat WHERE runId = ? ORDER BY seq", [key]) { row in
                try (seq: row.int64(0), readings: ClockReadings(wallMicros: row.int64(1), monotonicMicros: row.int64(2), boottimeMicros: row.int64(3)))
            }
            let spans = try db.rows("""
                SELECT firstSeq, lastSeq, leaseId, strategy, holds, state FROM leaseSpan
                WHERE runId = ? ORDER BY firstSeq, leaseId
                """, [key]) { row in
                try (firstSeq: row.int64(0), lastSeq: row.int64(1),
                     lease: HeartbeatLease(id: UInt64(bitPattern: row.int64(2)), strategy: row.string(3), holds: row.string(4), state: row.string(5)))
            }
            var next = 0
            var open: [(firstSeq: Int64, lastSeq: Int64, lease: HeartbeatLease)] = []
            return beats.map { beat in
                while next < spans.count, spans[next].firstSeq <= beat.seq {
                    open.append(spans[next])
                    next += 1
                }
                open.removeAll { $0.lastSeq < beat.seq }
                return HeartbeatEntry(seq: Int(beat.seq), readings: beat.readings, leases: open.map(\.lease).sorted { $0.id < $1.id })
            }
        }
    }

    /// Every event of run `runId`, in the order recorded.
    public static func events(path: String, runId: String) throws -> [EventEntry] {
        try readRun(path: path, runId: runId) { db, key in
            try db.rows("""
                SELECT seq, wall, mono, boot, name, strategy, fields FROM event WHERE runId = ? ORDER BY id
                """, [key]) { row in
                var fields: [String: String] = [:]
                if let text = try row.optionalString(6) {
                    fields = try JSONDecoder().decode([String: String].self, from: Data(text.utf8))
                }
                return EventEntry(
                    afterSeq: Int(try row.int64(0)), name: try row.string(4), strategy: try row.optionalString(5), fields: fields,
                    readings: ClockReadings(wallMicros: try row.int64(1), monotonicMicros: try row.int64(2), boottimeMicros: try row.int64(3)))
            }
        }
    }

    private static func readRun<T>(path: String, runId: String, _ body: (Database, Int64) throws -> T) throws -> T {
        guard let reader = try openReader(path: path) else {
            throw SurvivalStoreError(.invalidArgument, path: path, "no run \(runId): the store is empty")
        }
        do {
            return try reader.read { db in
                guard let key = try db.row("SELECT id FROM run WHERE uuid = ?", [runId], { try $0.int64(0) }) else {
                    throw SurvivalStoreError(.invalidArgument, path: path, "no run \(runId) in the store")
                }
                return try body(db, key)
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading run \(runId)")
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
        do {
            return try reader.read { db in
                let stall = "d.mono > r.intervalMicros + MAX(r.intervalMicros / 2, \(GapRule.minimumStallSlackMicros))"
                let sleep = "(d.boot - d.mono) > \(GapRule.suspendThresholdMicros)"
                return try db.rows("""
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
                    """) { row in
                    try RunRecount(
                        runId: row.string(0), heartbeats: row.int(1),
                        aliveMicros: row.int64(2), awakeMicros: row.int64(3),
                        suspends: row.int(4), suspendedMicros: row.int64(5),
                        stalls: row.int(6), stalledMicros: row.int64(7),
                        longestStallMicros: row.int64(8))
                }
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "recounting heartbeats")
        }
    }
}
