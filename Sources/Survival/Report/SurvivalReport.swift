import Foundation
import GRDB
import VigilKit

/// A stretch of a run's life on its boottime axis, for the timeline.
public struct TimelineSegment: Codable, Sendable, Hashable {
    public enum Kind: String, Codable, Sendable, CaseIterable {
        /// Alive and awake, heartbeats on time.
        case awake
        /// The system was suspended (boottime ran, monotonic stopped).
        case suspended
        /// Frozen or stalled: awake but no heartbeat for far longer than the interval.
        case stalled
        /// Alive, but the store could not be written (disk full, I/O errors).
        case unwritable
    }

    public var kind: Kind
    /// Start, microseconds of boottime since the run started.
    public var startOffsetMicros: Int64
    public var durationMicros: Int64
    /// Wall-clock start, microseconds since the Unix epoch.
    public var startWall: Int64

    public init(kind: Kind, startOffsetMicros: Int64, durationMicros: Int64, startWall: Int64) {
        self.kind = kind
        self.startOffsetMicros = startOffsetMicros
        self.durationMicros = durationMicros
        self.startWall = startWall
    }
}

/// One run of the host as the survival log saw it. Times are microseconds:
/// walls since the Unix epoch, durations from CLOCK_BOOTTIME / CLOCK_MONOTONIC.
public struct RunSummary: Codable, Sendable, Hashable {
    public var runId: String
    public var pid: Int32
    public var bootId: String
    public var version: String
    public var configPath: String
    public var intervalMicros: Int64
    public var startWall: Int64
    /// Wall time of the end: the clean end, or the last heartbeat of a run
    /// that was killed or rebooted; nil while `endReason` is `.running`.
    public var endWall: Int64?
    public var lastHeartbeatWall: Int64
    public var endReason: RunEndReason
    /// Why a run was closed as killed or rebooted, when it was.
    public var endNote: String?
    /// Boottime from the start to the last heartbeat (includes suspension).
    public var aliveMicros: Int64
    /// Monotonic time from the start to the last heartbeat (excludes suspension).
    public var awakeMicros: Int64
    /// Total suspended time found between heartbeats.
    public var suspendedMicros: Int64
    /// Number of gaps that contained a suspension.
    public var suspends: Int
    /// Heartbeats written, the start (seq 0) and any final one included.
    public var heartbeats: Int
    /// Number of frozen or stalled gaps.
    public var stalls: Int
    /// Total length of stalled gaps.
    public var stalledMicros: Int64
    /// Length of the longest stalled gap (0 when none).
    public var longestStallMicros: Int64
    /// Events recorded during the run.
    public var events: Int
    /// Stretches when the store could not be written (disk full, I/O errors).
    public var unwritableGaps: Int = 0
    /// Their total length.
    public var unwritableMicros: Int64 = 0
    /// awake / suspended / stalled / unwritable segments covering the run from start to last heartbeat.
    public var timeline: [TimelineSegment]
    /// What woke the system after each suspend the running host saw
    /// (`system-resumed` events), oldest first; nil when there were none.
    public var wakes: [SystemWake]? = nil
    /// Each wake by vigild's own alarm and what followed it (`dark-wake`
    /// events), oldest first; nil when there were none.
    public var darkWakes: [DarkWake]? = nil
    /// Suspends that began while Vigil leases held sleep
    /// (`sleep-broke-leases` events), oldest first; nil when there were none.
    public var brokenSleeps: [BrokenSleep]? = nil

    public var alive: Duration { .microseconds(aliveMicros) }
    public var awake: Duration { .microseconds(awakeMicros) }
    public var suspended: Duration { .microseconds(suspendedMicros) }
    public var longestStall: Duration { .microseconds(longestStallMicros) }
}

/// Reads the survival log for people and tools. Opens the store read-only, so
/// it works with or without a running host.
public struct SurvivalReport {
    /// Summaries of the newest `runs` runs (all when nil), newest first,
    /// limited to runs still alive at or after `sinceWallMicros` when given.
    /// Throws `.missing` when there is no store at `path`.
    public static func load(path: String, runs: Int?, sinceWallMicros: Int64?) throws -> [RunSummary] {
        try read(path: path, runs: runs, sinceWallMicros: sinceWallMicros) { db, records in
            try summaries(records, db)
        } ?? []
    }

    /// Reads the newest `runs` run rows (all when nil), newest first, alive
    /// at or after `sinceWallMicros`, and hands them to `body` in the same
    /// read transaction; nil for an empty store.
    static func read<T>(path: String, runs: Int?, sinceWallMicros: Int64?, _ body: (Database, [RunRecord]) throws -> T) throws -> T? {
        if let runs, runs < 0 {
            throw SurvivalStoreError(.invalidArgument, path: path, "number of runs must be 0 or more, got \(runs)")
        }
        guard let reader = try openReader(path: path) else { return nil }
        do {
            return try reader.read { db in
                let records = try db.rows("""
                    SELECT \(RunRecord.columns) FROM run
                    WHERE ?1 IS NULL OR COALESCE(endWall, lastWall) >= ?1
                    ORDER BY id DESC LIMIT ?2
                    """, [sinceWallMicros, Int64(runs ?? -1)], RunRecord.init)
                return try body(db, records)
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading the report")
        }
    }

    /// Run rows, newest first, of the runs started at or after `sinceWallMicros`.
    static func runs(startedSince sinceWallMicros: Int64, _ db: Database) throws -> [RunRecord] {
        try db.rows("SELECT \(RunRecord.columns) FROM run WHERE startWall >= ? ORDER BY id DESC", [sinceWallMicros], RunRecord.init)
    }

    /// Summaries of the runs with these keys (`run.id`), in the order given,
    /// read through the writer's own connection inside its transaction, so
    /// they include what it just wrote.
    static func summaries(ofRunKeys keys: [Int64], _ db: Database) throws -> [RunSummary] {
        guard !keys.isEmpty else { return [] }
        let rows = try db.rows("SELECT \(RunRecord.columns) FROM run WHERE id IN (\(keys.map(String.init).joined(separator: ", ")))", [], RunRecord.init)
        let byKey = Dictionary(rows.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        return try summaries(keys.compactMap { byKey[$0] }, db)
    }

    /// Builds summaries (in the order given) from run rows and their gaps.
    static func summaries(_ records: [RunRecord], _ db: Database) throws -> [RunSummary] {
        guard !records.isEmpty else { return [] }
        let keys = records.map { String($0.key) }.joined(separator: ", ")
        let gaps = try db.rows("""
            SELECT runId, seq, kind, startWall, startOffsetMicros, durationMicros FROM gap
            WHERE runId IN (\(keys)) ORDER BY runId, startOffsetMicros, seq
            """) { row in
            try GapRecord(runId: row.int64(0), seq: row.int64(1), kind: row.string(2), startWall: row.int64(3),
                       startOffsetMicros: row.int64(4), durationMicros: row.int64(5))
        }
        let gapsByRun = Dictionary(grouping: gaps, by: \.runId)
        let resumes = try db.rows("""
            SELECT runId, wall, boot, fields, name FROM event
            WHERE runId IN (\(keys)) AND name IN (?, ?, ?) ORDER BY runId, id
            """, [SystemWake.eventName, DarkWake.eventName, BrokenSleep.eventName]) { row in
            try (runId: row.int64(0), wall: row.int64(1), boot: row.int64(2), fields: row.optionalString(3), name: row.string(4))
        }
        let resumesByRun = Dictionary(grouping: resumes, by: \.runId)
        return records.map { run in
            var wakes: [SystemWake] = [], dark: [DarkWake] = [], broken: [BrokenSleep] = []
            for event in resumesByRun[run.key] ?? [] {
                let fields = event.fields.flatMap { try? JSONDecoder().decode([String: String].self, from: Data($0.utf8)) } ?? [:]
                let offset = max(0, event.boot - run.startBoot)
                switch event.name {
                case SystemWake.eventName:
                    if let wake = SystemWake(fields: fields, wall: event.wall, startOffsetMicros: offset) { wakes.append(wake) }
                case DarkWake.eventName:
                    if let wake = DarkWake(fields: fields, runStartBoot: run.startBoot) { dark.append(wake) }
                default:
                    if let sleep = BrokenSleep(fields: fields, wall: event.wall, startOffsetMicros: offset) { broken.append(sleep) }
                }
            }
            var summary = summary(of: run, gaps: gapsByRun[run.key] ?? [], wakes: wakes)
            summary.wakes = wakes.isEmpty ? nil : wakes
            summary.darkWakes = dark.isEmpty ? nil : dark
            summary.brokenSleeps = broken.isEmpty ? nil : broken
            return summary
        }
    }

    static func summary(of run: RunRecord, gaps: [GapRecord], wakes: [SystemWake] = []) -> RunSummary {
        let alive = max(0, run.lastBoot - run.startBoot)
        return RunSummary(
            runId: run.uuid,
            pid: Int32(truncatingIfNeeded: run.pid),
            bootId: run.bootId,
            version: run.version,
            configPath: run.configPath,
            intervalMicros: run.intervalMicros,
            startWall: run.startWall,
            endWall: run.endWall,
            lastHeartbeatWall: run.lastWall,
            endReason: RunEndReason(rawValue: run.endReason) ?? .running,
            endNote: run.endNote,
            aliveMicros: alive,
            awakeMicros: max(0, run.lastMono - run.startMono),
            suspendedMicros: run.suspendedMicros,
            suspends: Int(run.suspendCount),
            heartbeats: Int(run.lastSeq) + 1,
            stalls: Int(run.stallCount),
            stalledMicros: run.stalledMicros,
            longestStallMicros: run.longestStallMicros,
            events: Int(run.eventCount),
            unwritableGaps: gaps.filter { $0.kind == TimelineSegment.Kind.unwritable.rawValue }.count,
            unwritableMicros: gaps.filter { $0.kind == TimelineSegment.Kind.unwritable.rawValue }.reduce(0) { $0 + $1.durationMicros },
            timeline: timeline(gaps: placed(gaps, wakes: wakes, intervalMicros: run.intervalMicros), aliveMicros: alive, startWall: run.startWall))
    }

    /// Suspended gaps moved to where the system really slept. A heartbeat
    /// only learns that it slept somewhere since the one before, so the
    /// store places the suspension at the start of the gap; the resume the
    /// running host saw says where it ended. Each suspended gap takes the
    /// first unused wake that ends it: a wake no earlier than the gap's
    /// start plus its length, and within an interval (plus the stall slack)
    /// after that. Its start moves to the wake's offset less the time slept,
    /// never before the gap's own start.
    static func placed(_ gaps: [GapRecord], wakes: [SystemWake], intervalMicros: Int64) -> [GapRecord] {
        guard !wakes.isEmpty else { return gaps }
        let slack = intervalMicros + max(intervalMicros / 2, GapRule.minimumStallSlackMicros)
        var used = Set<Int>()
        return gaps.map { gap in
            guard gap.kind == TimelineSegment.Kind.suspended.rawValue else { return gap }
            let earliestEnd = gap.startOffsetMicros + gap.durationMicros
            guard let index = wakes.indices.first(where: {
                !used.contains($0) && wakes[$0].startOffsetMicros >= earliestEnd && wakes[$0].startOffsetMicros <= earliestEnd + slack
            }) else { return gap }
            used.insert(index)
            var moved = gap
            let start = max(gap.startOffsetMicros, wakes[index].startOffsetMicros - gap.durationMicros)
            moved.startWall += start - gap.startOffsetMicros
            moved.startOffsetMicros = start
            return moved
        }
    }

    /// Fills the time between gaps with awake segments.
    static func timeline(gaps: [GapRecord], aliveMicros: Int64, startWall: Int64) -> [TimelineSegment] {
        var segments: [TimelineSegment] = []
        var cursor: Int64 = 0
        for gap in gaps {
            let start = max(gap.startOffsetMicros, cursor)
            let end = gap.startOffsetMicros + gap.durationMicros
            guard end > start else { continue }
            if start > cursor {
                segments.append(TimelineSegment(kind: .awake, startOffsetMicros: cursor, durationMicros: start - cursor, startWall: startWall + cursor))
            }
            let kind = TimelineSegment.Kind(rawValue: gap.kind) ?? .stalled
            segments.append(TimelineSegment(kind: kind, startOffsetMicros: start, durationMicros: end - start, startWall: gap.startWall + (start - gap.startOffsetMicros)))
            cursor = end
        }
        if aliveMicros > cursor || segments.isEmpty {
            segments.append(TimelineSegment(kind: .awake, startOffsetMicros: cursor, durationMicros: max(0, aliveMicros - cursor), startWall: startWall + cursor))
        }
        return segments
    }

    /// Warnings about the store itself, for people: corruption found by
    /// `PRAGMA quick_check`, and migrations this version does not know (a
    /// newer Vigil wrote it, so figures it added are not shown). Empty when
    /// all is well or there is no store.
    public static func warnings(path: String) -> [String] {
        guard let reader = try? openReader(path: path) else { return [] }
        var out: [String] = []
        do {
            try reader.read { db in
                let check = try db.rows("PRAGMA quick_check") { try $0.string(0) }
                if check != ["ok"] {
                    out.append("the store is damaged (quick_check: \(check.prefix(3).joined(separator: "; "))\(check.count > 3 ? "; ..." : "")); the figures below may be wrong or incomplete; move it aside and vigild starts a new one")
                }
                let unknown = try SurvivalStoreIdentity.unknownMigrations(db)
                if !unknown.isEmpty {
                    out.append("the store was written by a newer Vigil (unknown migrations: \(unknown.joined(separator: ", "))); what that version added is not shown")
                }
            }
        } catch {
            out.append("the store could not be checked: \(SurvivalStoreError.wrap(error, path: path, doing: "checking the store"))")
        }
        return out
    }

    /// Opens the store read-only; nil for an empty SQLite file (nothing
    /// recorded yet). `immutable` skips straight to the fallback (for tests).
    package static func openReader(path: String, immutable: Bool = false) throws -> DatabaseQueue? {
        guard FileManager.default.fileExists(atPath: path) else {
            throw SurvivalStoreError(.missing, path: path, "no survival store here; vigild creates it when it first runs (or pass --store / --state-dir)")
        }
        do {
            if immutable { return try openImmutable(path) }
            return try open(path, path: path)
        } catch let error as DatabaseError where [.SQLITE_CANTOPEN, .SQLITE_READONLY].contains(error.resultCode.primaryResultCode) {
            // A WAL store whose -shm file we may not create (another user's
            // store while its host is stopped): read the main file as is.
            do {
                return try openImmutable(path)
            } catch {
                throw SurvivalStoreError.wrap(error, path: path, doing: "opening the store read-only")
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "opening the store read-only")
        }
    }

    /// A `file:` URI (SQLite on Debian is built with SQLITE_USE_URI).
    private static func openImmutable(_ path: String) throws -> DatabaseQueue? {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "?#%")
        let uri = "file:" + (path.addingPercentEncoding(withAllowedCharacters: allowed) ?? path) + "?immutable=1"
        return try open(uri, path: path)
    }

    private static func open(_ name: String, path: String) throws -> DatabaseQueue? {
        var config = Configuration()
        config.readonly = true
        config.label = "vigil.survival.reader"
        let reader = try DatabaseQueue(path: name, configuration: config)
        let isEmpty = try reader.read { db in
            try SurvivalStoreIdentity.check(db, path: path)
            return try SurvivalStoreIdentity.applicationID(db) != SurvivalStoreIdentity.applicationID
        }
        return isEmpty ? nil : reader
    }
}
