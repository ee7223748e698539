import Foundation

/// What makes a file a Vigil survival store, for the reader and the writer
/// alike: its `application_id`, and the migrations this build knows.
package enum SurvivalStoreIdentity {
    /// `PRAGMA application_id` of a Vigil survival store ("Vigl"): tells our
    /// file apart from any other SQLite database.
    package static let applicationID: Int32 = 0x5669_676C

    /// Every migration this build knows, in order: the writer's migrator
    /// registers exactly these (a test holds them equal), and the reader
    /// warns about any other it finds (a newer Vigil wrote the store).
    package static let knownMigrations = [
        "v1-run-heartbeat-gap-leaseSpan-event", "v2-strategyRecord", "v3-gap-unwritable", "v4-strategyCost", "v5-appCount",
    ]

    /// The file's `application_id` (0 for a new or foreign database).
    static func applicationID(_ store: StoreConnection) throws -> Int32 {
        Int32(truncatingIfNeeded: try store.row("PRAGMA application_id") { try $0.int64(0) } ?? 0)
    }

    /// Checks that the database is a Vigil survival store, or an empty
    /// database that may become one. Throws `.notAVigilStore` otherwise.
    static func check(_ store: StoreConnection, path: String) throws {
        let appID = try applicationID(store)
        if appID == applicationID { return }
        let tables = try store.rows("""
            SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name
            """) { try $0.string(0) }
        if appID != 0 {
            throw SurvivalStoreError(.notAVigilStore, path: path, String(
                format: "an SQLite database with application_id 0x%08X, expected 0x%08X (a Vigil survival store)",
                UInt32(bitPattern: appID), UInt32(bitPattern: applicationID)))
        }
        if !tables.isEmpty {
            throw SurvivalStoreError(.notAVigilStore, path: path,
                "an SQLite database that is not a Vigil survival store (it has tables \(tables.joined(separator: ", ")) and no Vigil application_id)")
        }
    }

    /// ``check(_:path:)`` through the writer's open connection (a GRDB
    /// `Database.sqliteConnection`), before it changes anything.
    package static func check(connection: OpaquePointer, path: String) throws {
        try check(StoreConnection(borrowing: connection), path: path)
    }

    /// Applied migrations this build does not know, sorted (GRDB's
    /// migrator keeps them in `grdb_migrations`).
    static func unknownMigrations(_ store: StoreConnection) throws -> [String] {
        guard try store.tableExists("grdb_migrations") else { return [] }
        let applied = try store.rows("SELECT identifier FROM grdb_migrations") { try $0.string(0) }
        return Set(applied).subtracting(knownMigrations).sorted()
    }
}
