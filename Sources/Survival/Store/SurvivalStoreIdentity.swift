import Foundation
import GRDB

/// What makes a file a Vigil survival store, for the reader and the writer
/// alike: its `application_id`, and the migrations this build knows
/// (``SurvivalSchema``).
enum SurvivalStoreIdentity {
    /// `PRAGMA application_id` of a Vigil survival store ("Vigl"): tells our
    /// file apart from any other SQLite database.
    static let applicationID: Int32 = 0x5669_676C

    /// The file's `application_id` (0 for a new or foreign database).
    static func applicationID(_ db: Database) throws -> Int32 {
        Int32(truncatingIfNeeded: try db.row("PRAGMA application_id") { try $0.int64(0) } ?? 0)
    }

    /// Checks that the database is a Vigil survival store, or an empty
    /// database that may become one. Throws `.notAVigilStore` otherwise.
    static func check(_ db: Database, path: String) throws {
        let appID = try applicationID(db)
        if appID == applicationID { return }
        let tables = try db.rows("""
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

    /// Applied migrations this build does not know, sorted: a newer Vigil
    /// migrated the store (GRDB's migrator keeps them in `grdb_migrations`).
    static func unknownMigrations(_ db: Database) throws -> [String] {
        guard try db.tableExists("grdb_migrations") else { return [] }
        let applied = try db.rows("SELECT identifier FROM grdb_migrations") { try $0.string(0) }
        return Set(applied).subtracting(SurvivalSchema.migrationNames).sorted()
    }
}
