import Foundation
import GRDB
import VigilKit

/// The `strategyRecord` table: each strategy instance's own key → value
/// records (``StrategyStore``), in the survival store's database.
enum StrategyRecordSchema {
    static func register(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v2-strategyRecord") { db in
            try db.execute(sql: """
                CREATE TABLE strategyRecord (
                    strategy TEXT NOT NULL,
                    key TEXT NOT NULL,
                    value BLOB NOT NULL,
                    PRIMARY KEY (strategy, key)
                ) WITHOUT ROWID
                """)
        }
    }
}

extension SurvivalStore {
    /// Stores one record of `strategy` (one committed transaction).
    public func putStrategyRecord(strategy: String, key: String, value: [UInt8]) throws {
        do {
            try database.write { db in
                try db.cachedStatement(sql: "INSERT OR REPLACE INTO strategyRecord (strategy, key, value) VALUES (?, ?, ?)")
                    .execute(arguments: [strategy, key, Data(value)])
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "storing record \"\(key)\" of strategy \(strategy)")
        }
    }

    public func strategyRecord(strategy: String, key: String) throws -> [UInt8]? {
        do {
            return try database.read { db in
                try Data.fetchOne(db, sql: "SELECT value FROM strategyRecord WHERE strategy = ? AND key = ?", arguments: [strategy, key]).map { [UInt8]($0) }
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading record \"\(key)\" of strategy \(strategy)")
        }
    }

    public func deleteStrategyRecord(strategy: String, key: String) throws {
        do {
            try database.write { db in
                try db.execute(sql: "DELETE FROM strategyRecord WHERE strategy = ? AND key = ?", arguments: [strategy, key])
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "deleting record \"\(key)\" of strategy \(strategy)")
        }
    }

    public func strategyRecords(strategy: String) throws -> [String: [UInt8]] {
        do {
            return try database.read { db in
                var out: [String: [UInt8]] = [:]
                for row in try Row.fetchAll(db, sql: "SELECT key, value FROM strategyRecord WHERE strategy = ?", arguments: [strategy]) {
                    let key: String = try row.decode(forColumn: "key")
                    let value: Data = try row.decode(forColumn: "value")
                    out[key] = [UInt8](value)
                }
                return out
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading the records of strategy \(strategy)")
        }
    }
}

/// A strategy's ``StrategyStore`` on the host's survival store.
public struct HostStrategyStore: StrategyStore {
    public let store: SurvivalStore
    public let strategy: String

    public init(store: SurvivalStore, strategy: String) {
        self.store = store
        self.strategy = strategy
    }

    public func put(_ key: String, _ value: [UInt8]) async throws {
        do { try await store.putStrategyRecord(strategy: strategy, key: key, value: value) } catch { throw StrategyStoreError("\(error)") }
    }

    public func get(_ key: String) async throws -> [UInt8]? {
        do { return try await store.strategyRecord(strategy: strategy, key: key) } catch { throw StrategyStoreError("\(error)") }
    }

    public func delete(_ key: String) async throws {
        do { try await store.deleteStrategyRecord(strategy: strategy, key: key) } catch { throw StrategyStoreError("\(error)") }
    }

    public func all() async throws -> [String: [UInt8]] {
        do { return try await store.strategyRecords(strategy: strategy) } catch { throw StrategyStoreError("\(error)") }
    }
}
