import Foundation
import GRDB

/// The survival store's schema: named migrations, applied in order and never
/// edited once shipped (add a new one instead).
///
/// Tables (one record type each, see SurvivalRecords.swift):
/// - `run`: one row per host run, keyed by a small integer; it also keeps the
///   run's aggregates (last heartbeat, suspended time, stalls), updated in the
///   same transaction as each heartbeat, so a report never scans heartbeats.
/// - `heartbeat`: (run, seq) → wall, monotonic and boottime microseconds.
///   WITHOUT ROWID and integer-only, about 30 bytes a row.
/// - `gap`: each suspension, stall or unwritable stretch found between two
///   heartbeats.
/// - `leaseSpan`: which leases were active at which heartbeats, as runs of
///   consecutive heartbeats (firstSeq...lastSeq) with an unchanged state, so a
///   lease held for a month costs one row, not 43,200 copies.
/// - `event`: events the host records (lease expired, strategy failed, ...).
/// - `strategyCost`: (run, strategy) → what the strategy cost in that run,
///   as of the run's last heartbeat (`v4-strategyCost`).
enum SurvivalSchema {
    /// `PRAGMA application_id` of a Vigil survival store ("Vigl"), which the
    /// reader checks too (``SurvivalStoreIdentity``).
    static let applicationID = SurvivalStoreIdentity.applicationID

    /// Every migration name this build knows, in order: the writer applies
    /// them, the reader warns about any other it finds (a newer Vigil).
    static let migrationNames = migrator.migrations

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1-run-heartbeat-gap-leaseSpan-event") { db in
            try db.execute(sql: "PRAGMA application_id = \(applicationID)")
            try db.execute(sql: """
                CREATE TABLE run (
                    id INTEGER PRIMARY KEY,
                    uuid TEXT NOT NULL UNIQUE,
                    pid INTEGER NOT NULL,
                    bootId TEXT NOT NULL,
                    version TEXT NOT NULL,
                    configPath TEXT NOT NULL,
                    intervalMicros INTEGER NOT NULL CHECK (intervalMicros > 0),
                    startWall INTEGER NOT NULL,
                    startMono INTEGER NOT NULL,
                    startBoot INTEGER NOT NULL,
                    lastSeq INTEGER NOT NULL,
                    lastWall INTEGER NOT NULL,
                    lastMono INTEGER NOT NULL,
                    lastBoot INTEGER NOT NULL,
                    endReason TEXT NOT NULL DEFAULT 'running'
                        CHECK (endReason IN ('running', 'stopped', 'killed', 'rebooted', 'failed')),
                    endWall INTEGER,
                    endNote TEXT,
                    suspendCount INTEGER NOT NULL DEFAULT 0,
                    suspendedMicros INTEGER NOT NULL DEFAULT 0,
                    stallCount INTEGER NOT NULL DEFAULT 0,
                    stalledMicros INTEGER NOT NULL DEFAULT 0,
                    longestStallMicros INTEGER NOT NULL DEFAULT 0,
                    eventCount INTEGER NOT NULL DEFAULT 0,
                    CHECK ((endReason = 'running') = (endWall IS NULL))
                )
                """)
            try db.execute(sql: "CREATE INDEX run_on_endReason ON run(endReason)")
            try db.execute(sql: """
                CREATE TABLE heartbeat (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    seq INTEGER NOT NULL CHECK (seq >= 0),
                    wall INTEGER NOT NULL,
                    mono INTEGER NOT NULL,
                    boot INTEGER NOT NULL,
                    PRIMARY KEY (runId, seq)
                ) WITHOUT ROWID
                """)
            try db.execute(sql: """
                CREATE TABLE gap (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    seq INTEGER NOT NULL,
                    kind TEXT NOT NULL CHECK (kind IN ('suspended', 'stalled')),
                    startWall INTEGER NOT NULL,
                    startOffsetMicros INTEGER NOT NULL CHECK (startOffsetMicros >= 0),
                    durationMicros INTEGER NOT NULL CHECK (durationMicros > 0),
                    PRIMARY KEY (runId, seq, kind)
                ) WITHOUT ROWID
                """)
            try db.execute(sql: """
                CREATE TABLE leaseSpan (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    firstSeq INTEGER NOT NULL,
                    leaseId INTEGER NOT NULL,
                    lastSeq INTEGER NOT NULL,
                    strategy TEXT NOT NULL,
                    holds TEXT NOT NULL,
                    state TEXT NOT NULL,
                    CHECK (lastSeq >= firstSeq),
                    PRIMARY KEY (runId, firstSeq, leaseId)
                ) WITHOUT ROWID
                """)
            try db.execute(sql: """
                CREATE TABLE event (
                    id INTEGER PRIMARY KEY,
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    seq INTEGER NOT NULL,
                    wall INTEGER NOT NULL,
                    mono INTEGER NOT NULL,
                    boot INTEGER NOT NULL,
                    name TEXT NOT NULL CHECK (name <> ''),
                    strategy TEXT,
                    fields TEXT
                )
                """)
            try db.execute(sql: "CREATE INDEX event_on_runId ON event(runId)")
        }
        StrategyRecordSchema.register(in: &migrator)
        // A gap kind for time the store could not be written (disk full,
        // I/O errors): SQLite cannot alter a CHECK, so the table is rebuilt.
        migrator.registerMigration("v3-gap-unwritable") { db in
            try db.execute(sql: """
                CREATE TABLE gap_v3 (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    seq INTEGER NOT NULL,
                    kind TEXT NOT NULL CHECK (kind IN ('suspended', 'stalled', 'unwritable')),
                    startWall INTEGER NOT NULL,
                    startOffsetMicros INTEGER NOT NULL CHECK (startOffsetMicros >= 0),
                    durationMicros INTEGER NOT NULL CHECK (durationMicros > 0),
                    PRIMARY KEY (runId, seq, kind)
                ) WITHOUT ROWID
                """)
            try db.execute(sql: "INSERT INTO gap_v3 SELECT runId, seq, kind, startWall, startOffsetMicros, durationMicros FROM gap")
            try db.execute(sql: "DROP TABLE gap")
            try db.execute(sql: "ALTER TABLE gap_v3 RENAME TO gap")
        }
        // What each strategy cost in each run (StrategyCostRow), the
        // counters as of the run's last heartbeat. Stores made before have
        // no costs for their older runs: reports show those runs without.
        migrator.registerMigration("v4-strategyCost") { db in
            try db.execute(sql: """
                CREATE TABLE strategyCost (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    strategy TEXT NOT NULL,
                    wakeups INTEGER NOT NULL CHECK (wakeups >= 0),
                    systemWakes INTEGER NOT NULL CHECK (systemWakes >= 0),
                    sleepHeldMicros INTEGER NOT NULL CHECK (sleepHeldMicros >= 0),
                    idleHeldMicros INTEGER NOT NULL CHECK (idleHeldMicros >= 0),
                    childCPUMicros INTEGER NOT NULL CHECK (childCPUMicros >= 0),
                    bytesSent INTEGER NOT NULL CHECK (bytesSent >= 0),
                    bytesReceived INTEGER NOT NULL CHECK (bytesReceived >= 0),
                    PRIMARY KEY (runId, strategy)
                ) WITHOUT ROWID
                """)
            // Runs recorded before this migration kept no costs; later ones do.
            try db.execute(sql: "ALTER TABLE run ADD COLUMN costsRecorded INTEGER NOT NULL DEFAULT 1 CHECK (costsRecorded IN (0, 1))")
            try db.execute(sql: "UPDATE run SET costsRecorded = 0")
        }
        // Each app's refused requests and expired leases in each run (issue
        // 45), as of the run's last heartbeat. Older runs have none.
        migrator.registerMigration("v5-appCount") { db in
            try db.execute(sql: """
                CREATE TABLE appCount (
                    runId INTEGER NOT NULL REFERENCES run(id) ON DELETE CASCADE,
                    app TEXT NOT NULL,
                    refused INTEGER NOT NULL CHECK (refused >= 0),
                    expired INTEGER NOT NULL CHECK (expired >= 0),
                    PRIMARY KEY (runId, app)
                ) WITHOUT ROWID
                """)
        }
        return migrator
    }
}
