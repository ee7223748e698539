import Foundation
import GRDB
import VigilKit

/// What the host knows when a run starts.
public struct RunStart: Sendable, Hashable {
    /// Unique id of this run (a UUID string).
    public var runId: String
    public var pid: Int32
    /// The kernel boot id (`BootID.current()`).
    public var bootID: String
    /// Vigil version string.
    public var version: String
    /// The config file the host runs from.
    public var configPath: String
    /// The heartbeat interval I.
    public var interval: Duration
    /// Clock readings at the start; they count as heartbeat 0.
    public var readings: ClockReadings

    public init(runId: String, pid: Int32, bootID: String, version: String, configPath: String, interval: Duration, readings: ClockReadings) {
        self.runId = runId
        self.pid = pid
        self.bootID = bootID
        self.version = version
        self.configPath = configPath
        self.interval = interval
        self.readings = readings
    }
}

/// What `beginRun` found in the store.
public struct RunBegan: Sendable {
    /// The run just begun.
    public var runId: String
    /// Earlier runs with no clean end, now closed as `.killed` (same boot) or
    /// `.rebooted` (different boot id), oldest first.
    public var closedRuns: [RunSummary]
    /// The run before this one, however it ended (nil for the first run).
    public var previousRun: RunSummary?
}

/// An app's refused requests and expired leases so far in a run (``AppPolicy``).
public struct AppRequestCount: Sendable, Hashable {
    public var refused: UInt64
    public var expired: UInt64
    public init(refused: UInt64 = 0, expired: UInt64 = 0) {
        self.refused = refused
        self.expired = expired
    }
}

/// One heartbeat for `SurvivalStore.appendHeartbeats`.
public struct HeartbeatSample: Sendable, Hashable {
    public var readings: ClockReadings
    public var leases: [HeartbeatLease]
    /// Each strategy's cost so far in this run (``StrategyCosts``); the
    /// run's `strategyCost` rows take these figures (empty: unchanged).
    public var costs: [String: StrategyCostRow]
    /// Each app's refusals and expiries so far in this run; the run's
    /// `appCount` rows take these figures (empty: unchanged).
    public var apps: [String: AppRequestCount]

    public init(readings: ClockReadings, leases: [HeartbeatLease] = [], costs: [String: StrategyCostRow] = [:],
                apps: [String: AppRequestCount] = [:]) {
        self.readings = readings
        self.leases = leases
        self.costs = costs
        self.apps = apps
    }
}

/// The survival log's single writer: one SQLite file (WAL) per host.
///
/// Each heartbeat is one transaction that appends the heartbeat row, records
/// any suspension or stall since the previous heartbeat (see `GapRule`),
/// extends the lease spans, and updates the run's aggregates, so reports read
/// a handful of rows however long the log is.
///
/// Methods are synchronous inside the actor on purpose: a write never
/// suspends, so two heartbeats cannot interleave.
public actor SurvivalStore {
    /// The store file.
    public nonisolated let path: String
    /// Internal (not private) for the strategy records (StrategyRecords.swift).
    let database: DatabaseQueue
    /// Where the store's methods run: their writes wait for the disk, and
    /// must not hold a thread of the cooperative pool meanwhile.
    private nonisolated let thread = StoreThread(name: "vigil-store")
    public nonisolated var unownedExecutor: UnownedSerialExecutor { thread.asUnownedSerialExecutor() }

    /// Whether the store's methods run on its thread (for tests).
    func runsOnItsThread() -> Bool { thread.isCurrent }
    private var active: ActiveRun?
    /// WAL size above which a heartbeat ends with a TRUNCATE checkpoint, and
    /// SQLite's `journal_size_limit`; nil leaves SQLite's defaults (only
    /// for the benchmark's reference run).
    public nonisolated let walCheckpointBytes: Int64?
    /// Set while writes fail for lack of space or I/O errors.
    private var unwritable: Unwritable?

    /// Longest string the store keeps (bytes of UTF-8): names, reasons and
    /// event fields can come from D-Bus clients, and the store must not
    /// depend on the bus door alone to bound them.
    public static let maxStoredStringBytes = 1024

    /// `text` cut to ``maxStoredStringBytes`` on a character boundary, with
    /// a marker saying how much was cut.
    static func bounded(_ text: String) -> String {
        guard text.utf8.count > maxStoredStringBytes else { return text }
        var kept = Substring(text)
        while kept.utf8.count > maxStoredStringBytes - 32 { kept = kept.dropLast(max(1, (kept.utf8.count - maxStoredStringBytes + 32) / 4)) }
        return kept + "… (\(text.utf8.count - kept.utf8.count) bytes cut)"
    }

    /// The default of `walCheckpointBytes`: 256 KiB, a few minutes of
    /// heartbeats with many leases.
    public static let defaultWALCheckpointBytes: Int64 = 256 * 1024

    /// Since when writes fail, and what was lost meanwhile.
    public struct Unwritable: Sendable, Hashable {
        /// The last heartbeat written before the failures.
        public var lastWritten: ClockReadings
        /// The first failure, for people.
        public var firstError: String
        /// Heartbeats and events that could not be written.
        public var failedWrites: Int
        /// Heartbeats among them. Only a failed heartbeat leaves a hole in
        /// the timeline: events lost between two written heartbeats are
        /// counted, but no unwritable gap is recorded for them.
        public var failedHeartbeats: Int = 0
    }

    /// The run being written, mirrored in memory so a heartbeat needs no reads.
    private struct ActiveRun {
        var key: Int64
        var uuid: String
        var rule: GapRule
        var startBoot: Int64
        var lastSeq: Int64
        var last: ClockReadings
        /// Lease spans that include heartbeat `lastSeq`, by lease id.
        var openSpans: [UInt64: OpenSpan]
        /// The `strategyCost` rows as last written: a heartbeat rewrites
        /// only the strategies whose figures moved.
        var writtenCosts: [String: StrategyCostRow] = [:]
        /// The `appCount` rows as last written.
        var writtenApps: [String: AppRequestCount] = [:]
    }

    private struct OpenSpan {
        var firstSeq: Int64
        var strategy: String
        var holds: String
        var state: String
    }

    /// Opens (creating directories and file if needed) the store at `path`,
    /// in WAL mode, and applies pending migrations. Refuses files that are not
    /// Vigil survival stores, corrupt files, and stores from a newer Vigil.
    public init(path: String, walCheckpointBytes: Int64? = SurvivalStore.defaultWALCheckpointBytes) throws {
        self.path = path
        self.walCheckpointBytes = walCheckpointBytes
        self.database = try Self.openWriter(path: path, journalSizeLimit: walCheckpointBytes)
    }

    /// Non-nil while the store cannot be written (see ``Unwritable``).
    public var unwritableState: Unwritable? { unwritable }

    // MARK: Runs

    /// Starts a run; closes any earlier run with no clean end as `.killed`,
    /// or `.rebooted` when its boot id differs. Returns what it found.
    public func beginRun(_ start: RunStart) throws -> RunBegan {
        guard active == nil else {
            throw SurvivalStoreError(.runAlreadyActive, path: path, "beginRun(\(start.runId)) while run \(active?.uuid ?? "") is active; call endRun first")
        }
        let intervalMicros = Self.micros(start.interval)
        guard intervalMicros > 0 else {
            throw SurvivalStoreError(.invalidArgument, path: path, "heartbeat interval must be positive, got \(start.interval)")
        }
        guard !start.runId.isEmpty else {
            throw SurvivalStoreError(.invalidArgument, path: path, "run id is empty; expected a UUID string")
        }
        do {
            let (key, began) = try database.write { db -> (Int64, RunBegan) in
                if try RunRecord.filter(Column("uuid") == start.runId).fetchCount(db) > 0 {
                    throw SurvivalStoreError(.invalidArgument, path: path, "run id \(start.runId) is already in the store; each run needs a new id")
                }
                var closed: [RunRecord] = []
                let unfinished = try RunRecord
                    .filter(RunRecord.Columns.endReason == RunEndReason.running.rawValue)
                    .order(RunRecord.Columns.id)
                    .fetchAll(db)
                for var run in unfinished {
                    if run.bootId == start.bootID {
                        run.endReason = RunEndReason.killed.rawValue
                        run.endNote = "no clean end; run \(start.runId) started in the same boot"
                    } else {
                        run.endReason = RunEndReason.rebooted.rawValue
                        run.endNote = "no clean end; boot id changed from \(run.bootId) to \(start.bootID)"
                    }
                    // A run with no clean end is alive only up to its last heartbeat.
                    run.endWall = run.lastWall
                    try run.update(db)
                    closed.append(run)
                }
                let previous = try RunRecord.order(RunRecord.Columns.id.desc).fetchOne(db)

                var run = RunRecord(
                    id: nil, uuid: start.runId, pid: Int64(start.pid), bootId: start.bootID,
                    version: start.version, configPath: start.configPath, intervalMicros: intervalMicros,
                    startWall: start.readings.wallMicros, startMono: start.readings.monotonicMicros,
                    startBoot: start.readings.boottimeMicros,
                    lastSeq: 0, lastWall: start.readings.wallMicros, lastMono: start.readings.monotonicMicros,
                    lastBoot: start.readings.boottimeMicros,
                    endReason: RunEndReason.running.rawValue, endWall: nil, endNote: nil,
                    suspendCount: 0, suspendedMicros: 0, stallCount: 0, stalledMicros: 0,
                    longestStallMicros: 0, eventCount: 0)
                try run.insert(db)
                let key = run.key
                try HeartbeatRecord(runId: key, seq: 0, readings: start.readings).insert(db)

                return (key, RunBegan(
                    runId: start.runId,
                    closedRuns: try SurvivalReport.summaries(ofRunKeys: closed.compactMap(\.id), db),
                    previousRun: try previous?.id.flatMap { try SurvivalReport.summaries(ofRunKeys: [$0], db).first }))
            }
            active = ActiveRun(
                key: key, uuid: start.runId, rule: GapRule(intervalMicros: intervalMicros),
                startBoot: start.readings.boottimeMicros, lastSeq: 0, last: start.readings, openSpans: [:])
            return began
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "beginning run \(start.runId)")
        }
    }

    /// Writes one heartbeat of the active run with the leases active now.
    public func heartbeat(_ readings: ClockReadings, leases: [HeartbeatLease], costs: [String: StrategyCostRow] = [:],
                          apps: [String: AppRequestCount] = [:]) throws {
        try appendHeartbeats([HeartbeatSample(readings: readings, leases: leases, costs: costs, apps: apps)])
    }

    /// What ``writeHeartbeat(_:leases:costs:apps:)`` did.
    public struct HeartbeatWritten: Sendable, Hashable {
        /// The heartbeat's sequence in its run.
        public var sequence: Int64
        /// The outage this heartbeat ended (the store was unwritable before it), if any.
        public var endedOutage: Unwritable?
    }

    /// Writes one heartbeat and says what it ended, in one call: the
    /// heartbeat writer's only visit to the store's thread per beat (it
    /// asked for the outage before and the sequence after in calls of their
    /// own, two more round trips to this thread).
    public func writeHeartbeat(_ readings: ClockReadings, leases: [HeartbeatLease], costs: [String: StrategyCostRow],
                               apps: [String: AppRequestCount]) throws -> HeartbeatWritten {
        let outage = unwritable
        try heartbeat(readings, leases: leases, costs: costs, apps: apps)
        return HeartbeatWritten(sequence: active?.lastSeq ?? 0, endedOutage: outage)
    }

    /// Writes several heartbeats in one transaction, exactly as that many
    /// `heartbeat` calls would (back-filling, benchmarks).
    public func appendHeartbeats(_ samples: [HeartbeatSample]) throws {
        guard var run = active else {
            throw SurvivalStoreError(.noActiveRun, path: path, "heartbeat with no run begun; call beginRun first")
        }
        // While unwritable, a checkpoint first: it may free the WAL's space.
        if unwritable != nil { checkpoint() }
        let wasUnwritable = (unwritable?.failedHeartbeats ?? 0) > 0
        do {
            try database.write { db in
                for (i, sample) in samples.enumerated() {
                    try Self.writeHeartbeat(sample, run: &run, unwritable: wasUnwritable && i == 0, db)
                }
            }
            // Only a committed transaction moves the in-memory mirror.
            active = run
            unwritable = nil
        } catch {
            throw failed(error, doing: "writing a heartbeat of run \(run.uuid)", heartbeat: true)
        }
        if let limit = walCheckpointBytes, walSize() > limit { checkpoint() }
    }

    /// Wraps a write error; disk-full and I/O errors mark the store unwritable.
    private func failed(_ error: any Error, doing action: String, heartbeat: Bool = false) -> SurvivalStoreError {
        let wrapped = SurvivalStoreError.wrap(error, path: path, doing: action)
        if wrapped.code == .unwritable, let run = active {
            if unwritable == nil {
                unwritable = Unwritable(lastWritten: run.last, firstError: wrapped.message, failedWrites: 0)
            }
            unwritable?.failedWrites += 1
            if heartbeat { unwritable?.failedHeartbeats += 1 }
        }
        return wrapped
    }

    /// Size of the `-wal` file in bytes (0 when there is none).
    public nonisolated func walSize() -> Int64 {
        var info = stat()
        return stat(path + "-wal", &info) == 0 ? Int64(info.st_size) : 0
    }

    /// Copies the WAL into the database and truncates it to zero bytes.
    /// Best effort: a failure (no space for the copy) leaves both as they were.
    private func checkpoint() {
        // Without waiting for readers: while one reads, the WAL it reads
        // cannot be given back however long one waits, and waiting out the
        // busy timeout here held up the heartbeat this checkpoint precedes
        // by up to 5 s, recorded as a stall of the host.
        _ = try? database.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA busy_timeout = 0")
            defer { try? db.execute(sql: "PRAGMA busy_timeout = \(Self.busyTimeoutMilliseconds)") }
            try db.checkpoint(.truncate)
        }
    }

    /// How long a write waits for another connection's lock (GRDB's busy mode).
    static let busyTimeoutMilliseconds = 5000

    /// An event for ``recordEvents(_:)``.
    public struct Event: Sendable {
        public var name: String
        public var strategy: String?
        public var fields: [String: String]
        public var readings: ClockReadings
        public init(_ name: String, strategy: String?, fields: [String: String], readings: ClockReadings) {
            self.name = name
            self.strategy = strategy
            self.fields = fields
            self.readings = readings
        }
    }

    /// Records an event of the active run (after its latest heartbeat).
    /// `fields` are stored as a JSON object (NULL when empty).
    public func recordEvent(_ event: String, strategy: String?, fields: [String: String], readings: ClockReadings) throws {
        try recordEvents([Event(event, strategy: strategy, fields: fields, readings: readings)])
    }

    /// Records events of the active run in one transaction (one sync to
    /// the disk however many there are), in order.
    public func recordEvents(_ events: [Event]) throws {
        guard let run = active else {
            throw SurvivalStoreError(.noActiveRun, path: path, "event \(events.first?.name ?? "") with no run begun; call beginRun first")
        }
        guard !events.isEmpty else { return }
        if let unnamed = events.firstIndex(where: { $0.name.isEmpty }) {
            throw SurvivalStoreError(.invalidArgument, path: path, "event name is empty (event \(unnamed + 1) of \(events.count))")
        }
        func names() -> String { events.count == 1 ? "event \(events[0].name)" : "\(events.count) events" }
        if let outage = unwritable, outage.failedHeartbeats > 0 {
            // An outage the heartbeats confirmed: only they try the disk
            // (each after a checkpoint that may free space) until one is
            // written. An event write would fail too, and could first wait
            // out the busy timeout (a reader pinning the WAL keeps SQLite
            // from restarting it), holding up the heartbeat queued behind.
            unwritable?.failedWrites += 1
            throw SurvivalStoreError(.unwritable, path: path, "cannot write (recording \(names()) of run \(run.uuid)): the store is unwritable since an earlier failure: \(outage.firstError)")
        }
        do {
            // One JSON encoder for the batch, and one cached INSERT
            // (``EventRecord/insert(_:)``): a new encoder and Codable
            // encoding per event were two thirds of the store thread's
            // time under a burst of Begin and End calls.
            let encoder = Self.fieldsEncoder()
            var records: [EventRecord] = []
            records.reserveCapacity(events.count)
            for event in events {
                var boundedFields: [String: String] = [:]
                for (key, value) in event.fields { boundedFields[Self.bounded(key)] = Self.bounded(value) }
                records.append(EventRecord(
                    id: nil, runId: run.key, seq: run.lastSeq, wall: event.readings.wallMicros,
                    mono: event.readings.monotonicMicros, boot: event.readings.boottimeMicros,
                    name: Self.bounded(event.name), strategy: event.strategy.map(Self.bounded),
                    fields: try Self.json(boundedFields, encoder: encoder)))
            }
            try database.write { db in
                for record in records { try record.insert(db) }
                try db.cachedStatement(sql: "UPDATE run SET eventCount = eventCount + ? WHERE id = ?")
                    .execute(arguments: [records.count, run.key])
            }
        } catch {
            throw failed(error, doing: "recording \(names()) of run \(run.uuid)")
        }
    }

    /// Ends the active run: writes a final heartbeat (no leases) and the end.
    public func endRun(reason: RunEndReason, readings: ClockReadings, costs: [String: StrategyCostRow] = [:],
                       apps: [String: AppRequestCount] = [:]) throws {
        guard var run = active else {
            throw SurvivalStoreError(.noActiveRun, path: path, "endRun(\(reason.rawValue)) with no run begun")
        }
        guard reason != .running else {
            throw SurvivalStoreError(.invalidArgument, path: path, "endRun needs an end reason other than running")
        }
        if unwritable != nil { checkpoint() }
        let wasUnwritable = (unwritable?.failedHeartbeats ?? 0) > 0
        do {
            try database.write { db in
                try Self.writeHeartbeat(HeartbeatSample(readings: readings, costs: costs, apps: apps), run: &run, unwritable: wasUnwritable, db)
                try db.cachedStatement(sql: "UPDATE run SET endReason = ?, endWall = ? WHERE id = ?")
                    .execute(arguments: [reason.rawValue, readings.wallMicros, run.key])
            }
            active = nil
            unwritable = nil
        } catch {
            throw failed(error, doing: "ending run \(run.uuid)")
        }
        if walCheckpointBytes != nil { checkpoint() }
    }

    /// The id of the active run, if any.
    public var activeRunId: String? { active?.uuid }

    /// The sequence number of the active run's latest heartbeat (0 = its
    /// start), if a run is active.
    public var lastSequence: Int64? { active?.lastSeq }

    // MARK: Writing

    /// `unwritable`: the heartbeats before this one could not be written, so
    /// the gap's awake part is recorded as `unwritable`, not as a stall.
    private static func writeHeartbeat(_ sample: HeartbeatSample, run: inout ActiveRun, unwritable: Bool = false, _ db: Database) throws {
        let readings = sample.readings
        let seq = run.lastSeq + 1
        let gap = run.rule.classify(from: run.last, to: readings)
        try HeartbeatRecord(runId: run.key, seq: seq, readings: readings).insert(db)

        // Where the gap sits on the run's boottime axis: a stall (or the
        // unwritable stretch) first, the awake part, then any suspension.
        let gapStart = max(0, run.last.boottimeMicros - run.startBoot)
        var stallMicros: Int64 = 0
        if unwritable, gap.awakeMicros > 0 {
            try GapRecord(runId: run.key, seq: seq, kind: TimelineSegment.Kind.unwritable.rawValue,
                          startWall: run.last.wallMicros, startOffsetMicros: gapStart,
                          durationMicros: gap.awakeMicros).insert(db)
        } else if let stall = gap.stallMicros {
            stallMicros = stall
            try GapRecord(runId: run.key, seq: seq, kind: TimelineSegment.Kind.stalled.rawValue,
                          startWall: run.last.wallMicros, startOffsetMicros: gapStart,
                          durationMicros: stall).insert(db)
        }
        if gap.suspendedMicros > 0 {
            try GapRecord(runId: run.key, seq: seq, kind: TimelineSegment.Kind.suspended.rawValue,
                          startWall: run.last.wallMicros + stallMicros, startOffsetMicros: gapStart + stallMicros,
                          durationMicros: gap.suspendedMicros).insert(db)
        }
        try db.cachedStatement(sql: """
            UPDATE run SET lastSeq = ?, lastWall = ?, lastMono = ?, lastBoot = ?,
                suspendCount = suspendCount + ?, suspendedMicros = suspendedMicros + ?,
                stallCount = stallCount + ?, stalledMicros = stalledMicros + ?,
                longestStallMicros = MAX(longestStallMicros, ?)
            WHERE id = ?
            """).execute(arguments: [
                seq, readings.wallMicros, readings.monotonicMicros, readings.boottimeMicros,
                gap.suspendedMicros > 0 ? 1 : 0, gap.suspendedMicros,
                stallMicros == 0 ? 0 : 1, stallMicros, stallMicros,
                run.key,
            ])

        var open: [UInt64: OpenSpan] = [:]
        for var lease in sample.leases where open[lease.id] == nil {
            lease.strategy = bounded(lease.strategy)
            lease.holds = bounded(lease.holds)
            lease.state = bounded(lease.state)
            if let span = run.openSpans[lease.id],
               span.strategy == lease.strategy, span.holds == lease.holds, span.state == lease.state {
                try db.cachedStatement(sql: "UPDATE leaseSpan SET lastSeq = ? WHERE runId = ? AND firstSeq = ? AND leaseId = ?")
                    .execute(arguments: [seq, run.key, span.firstSeq, Int64(bitPattern: lease.id)])
                open[lease.id] = span
            } else {
                try LeaseSpanRecord(
                    runId: run.key, firstSeq: seq, leaseId: Int64(bitPattern: lease.id), lastSeq: seq,
                    strategy: lease.strategy, holds: lease.holds, state: lease.state).insert(db)
                open[lease.id] = OpenSpan(firstSeq: seq, strategy: lease.strategy, holds: lease.holds, state: lease.state)
            }
        }
        run.openSpans = open
        for (strategy, cost) in sample.costs where run.writtenCosts[strategy] != cost {
            try StrategyCostRecord(runId: run.key, strategy: bounded(strategy), cost: cost).insert(db, onConflict: .replace)
            run.writtenCosts[strategy] = cost
        }
        for (app, count) in sample.apps where run.writtenApps[app] != count {
            try AppCountRecord(runId: run.key, app: bounded(app), count: count).insert(db, onConflict: .replace)
            run.writtenApps[app] = count
        }
        run.lastSeq = seq
        run.last = readings
    }

    private static func fieldsEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    private static func json(_ fields: [String: String], encoder: JSONEncoder) throws -> String? {
        guard !fields.isEmpty else { return nil }
        return String(decoding: try encoder.encode(fields), as: UTF8.self)
    }

    static func micros(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }

    // MARK: Opening

    private static func openWriter(path: String, journalSizeLimit: Int64?) throws -> DatabaseQueue {
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            } catch {
                throw SurvivalStoreError(.unreadable, path: path, "cannot create directory \(directory): \(error.localizedDescription)")
            }
        }
        // Look before writing: WAL mode would change another program's
        // database, so the connection opens in the file's own journal mode,
        // checks the file's identity, and only then switches to WAL. One
        // connection only: a second, short-lived DatabaseQueue would be
        // released on libdispatch's default queue, which starts its 1 Hz
        // worker monitor for the life of the process (see Plugins/VigilKit/Sources/CVigilLoop).
        let existing = ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int ?? 0) > 0
        do {
            var config = Configuration()
            config.foreignKeysEnabled = true
            config.busyMode = .timeout(Double(Self.busyTimeoutMilliseconds) / 1000)
            config.label = "vigil.survival"
            config.prepareDatabase { db in
                // FULL: each heartbeat reaches the disk, so a power cut loses
                // at most the heartbeat being written (NORMAL could lose hours
                // of WAL). One fsync a minute is cheap.
                try db.execute(sql: "PRAGMA synchronous = FULL")
                // After a checkpoint SQLite reuses the WAL from its start
                // and shrinks the file to this size.
                if let journalSizeLimit {
                    try db.execute(sql: "PRAGMA journal_size_limit = \(journalSizeLimit)")
                }
            }
            let queue = try DatabaseQueue(path: path, configuration: config)
            if existing {
                try queue.read { db in
                    try SurvivalStoreIdentity.check(db, path: path)
                    let check = try String.fetchAll(db, sql: "PRAGMA quick_check")
                    if check != ["ok"] {
                        throw SurvivalStoreError(.corrupt, path: path,
                            "the database is corrupt (quick_check: \(check.prefix(3).joined(separator: "; "))); move it aside and a new store will be created")
                    }
                }
            }
            try queue.writeWithoutTransaction { db in
                let mode = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
                if mode?.lowercased() != "wal" {
                    throw SurvivalStoreError(.unreadable, path: path, "cannot switch the store to WAL mode (journal_mode is \(mode ?? "unknown"))")
                }
            }
            try queue.read { db in
                try SurvivalStoreIdentity.check(db, path: path)
                let unknown = try SurvivalStoreIdentity.unknownMigrations(db)
                if !unknown.isEmpty {
                    throw SurvivalStoreError(.newerSchema, path: path,
                        "written by a newer Vigil (unknown migrations: \(unknown.joined(separator: ", "))); this version will not write to it")
                }
            }
            try SurvivalSchema.migrator.migrate(queue)
            return queue
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "opening the store")
        }
    }

    /// Sums every run in the store (see ``SurvivalTotals``).
    public func metricTotals() throws -> SurvivalTotals {
        let runId = activeRunId
        do {
            return try database.read { db in try SurvivalTotals.read(db, activeRunId: runId) }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "summing the runs")
        }
    }
}
