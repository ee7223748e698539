import GRDB
import VigilKit

// One record type per table of the survival store (see SurvivalSchema).
// Times are microseconds: wall since the Unix epoch, mono and boot since
// boot (CLOCK_MONOTONIC, CLOCK_BOOTTIME).

/// A row of `run`: one host run and its aggregates.
struct RunRecord: Codable, FetchableRecord, MutablePersistableRecord, Sendable {
    static let databaseTableName = "run"

    var id: Int64?
    var uuid: String
    var pid: Int64
    var bootId: String
    var version: String
    var configPath: String
    var intervalMicros: Int64
    var startWall: Int64
    var startMono: Int64
    var startBoot: Int64
    var lastSeq: Int64
    var lastWall: Int64
    var lastMono: Int64
    var lastBoot: Int64
    var endReason: String
    var endWall: Int64?
    var endNote: String?
    var suspendCount: Int64
    var suspendedMicros: Int64
    var stallCount: Int64
    var stalledMicros: Int64
    var longestStallMicros: Int64
    var eventCount: Int64

    mutating func didInsert(_ inserted: InsertionSuccess) {
        id = inserted.rowID
    }

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let endReason = Column(CodingKeys.endReason)
        static let endWall = Column(CodingKeys.endWall)
        static let lastWall = Column(CodingKeys.lastWall)
    }
}

/// The reader's side of `run` (SurvivalReport): raw SQL read column by
/// column, in an extension so the record keeps its memberwise init.
extension RunRecord {
    /// The run's key (`id`). Invariant: every row read back has one, and
    /// insert() sets it through didInsert; 0 only before the insert.
    var key: Int64 { id ?? 0 }

    /// The columns ``init(_:)`` reads, in its order.
    static let columns = """
        id, uuid, pid, bootId, version, configPath, intervalMicros, startWall, startMono, startBoot,
        lastSeq, lastWall, lastMono, lastBoot, endReason, endWall, endNote,
        suspendCount, suspendedMicros, stallCount, stalledMicros, longestStallMicros, eventCount
        """

    /// A row of ``columns`` read column by column, as the reader reads: a
    /// damaged value is an error that names its column, never a trap.
    init(_ row: StoreRow) throws {
        id = try row.int64(0)
        uuid = try row.string(1)
        pid = try row.int64(2)
        bootId = try row.string(3)
        version = try row.string(4)
        configPath = try row.string(5)
        intervalMicros = try row.int64(6)
        startWall = try row.int64(7)
        startMono = try row.int64(8)
        startBoot = try row.int64(9)
        lastSeq = try row.int64(10)
        lastWall = try row.int64(11)
        lastMono = try row.int64(12)
        lastBoot = try row.int64(13)
        endReason = try row.string(14)
        endWall = try row.optionalInt64(15)
        endNote = try row.optionalString(16)
        suspendCount = try row.int64(17)
        suspendedMicros = try row.int64(18)
        stallCount = try row.int64(19)
        stalledMicros = try row.int64(20)
        longestStallMicros = try row.int64(21)
        eventCount = try row.int64(22)
    }
}

/// A row of `heartbeat`. Written on the hot path, so encoded by hand; read
/// back by the reader (SurvivalReport.heartbeats).
struct HeartbeatRecord: PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "heartbeat"

    var runId: Int64
    var seq: Int64
    var wall: Int64
    var mono: Int64
    var boot: Int64

    init(runId: Int64, seq: Int64, readings: ClockReadings) {
        self.runId = runId
        self.seq = seq
        self.wall = readings.wallMicros
        self.mono = readings.monotonicMicros
        self.boot = readings.boottimeMicros
    }

    func encode(to container: inout PersistenceContainer) {
        container["runId"] = runId
        container["seq"] = seq
        container["wall"] = wall
        container["mono"] = mono
        container["boot"] = boot
    }
}

/// A row of `gap`: one suspension or stall between heartbeat seq-1 and seq.
struct GapRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "gap"

    var runId: Int64
    var seq: Int64
    /// "suspended", "stalled" or "unwritable".
    var kind: String
    /// Wall time of the heartbeat before the gap.
    var startWall: Int64
    /// Where the gap starts on the run's boottime axis, from the run start.
    var startOffsetMicros: Int64
    var durationMicros: Int64

    enum Columns {
        static let runId = Column(CodingKeys.runId)
        static let seq = Column(CodingKeys.seq)
    }
}

/// A row of `leaseSpan`: a lease seen in heartbeats firstSeq...lastSeq of a
/// run with the same strategy, holds and state. Keyed by (runId, firstSeq,
/// leaseId): a lease starts at most one span per heartbeat.
struct LeaseSpanRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "leaseSpan"

    var runId: Int64
    var firstSeq: Int64
    /// The lease id's bit pattern (SQLite integers are signed).
    var leaseId: Int64
    var lastSeq: Int64
    var strategy: String
    var holds: String
    var state: String
}

/// A row of `strategyCost`: what one strategy cost in one run, as of the
/// run's last heartbeat (the figures are the run's counters, replaced at
/// each heartbeat). Integers are signed in SQLite: the figures are clamped.
struct StrategyCostRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "strategyCost"

    var runId: Int64
    var strategy: String
    var wakeups: Int64 = 0
    var systemWakes: Int64 = 0
    var sleepHeldMicros: Int64 = 0
    var idleHeldMicros: Int64 = 0
    var childCPUMicros: Int64 = 0
    var bytesSent: Int64 = 0
    var bytesReceived: Int64 = 0

    /// Each column and the row's field it keeps (the reader, CostReport,
    /// reads the same columns by name).
    private static let columns: [(column: any WritableKeyPath<Self, Int64> & Sendable, field: any WritableKeyPath<StrategyCostRow, UInt64> & Sendable)] = [
        (\.wakeups, \.wakeups), (\.systemWakes, \.systemWakes), (\.sleepHeldMicros, \.sleepHeldUsec),
        (\.idleHeldMicros, \.idleHeldUsec), (\.childCPUMicros, \.childCPUUsec), (\.bytesSent, \.bytesSent),
        (\.bytesReceived, \.bytesReceived),
    ]

    init(runId: Int64, strategy: String, cost: StrategyCostRow) {
        self.runId = runId
        self.strategy = strategy
        for (column, field) in Self.columns { self[keyPath: column] = Int64(clamping: cost[keyPath: field]) }
    }
}

/// A row of `event`: something the host recorded, after heartbeat `seq`.
/// Written by ``insert(_:)``; read back as a Codable record.
struct EventRecord: Codable, FetchableRecord, TableRecord, Sendable, Hashable {
    static let databaseTableName = "event"

    var id: Int64?
    var runId: Int64
    var seq: Int64
    var wall: Int64
    var mono: Int64
    var boot: Int64
    var name: String
    var strategy: String?
    /// JSON object of string fields; NULL when there are none.
    var fields: String?

    /// Inserts the row through one cached statement: GRDB's persistence
    /// (a container of the columns, the SQL rebuilt for each record) was
    /// a third of recording an event, two per client lease.
    func insert(_ db: Database) throws {
        try db.cachedStatement(sql: """
            INSERT INTO event (runId, seq, wall, mono, boot, name, strategy, fields) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: [runId, seq, wall, mono, boot, name, strategy, fields])
    }
}

/// A row of `appCount`: an app's refused requests and expired leases in
/// one run, as of the run's last heartbeat (``AppPolicy``; replaced at
/// each heartbeat). The app name is bounded like other stored text.
struct AppCountRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "appCount"

    var runId: Int64
    var app: String
    var refused: Int64
    var expired: Int64

    init(runId: Int64, app: String, count: AppRequestCount) {
        self.runId = runId
        self.app = app
        self.refused = Int64(clamping: count.refused)
        self.expired = Int64(clamping: count.expired)
    }
}
