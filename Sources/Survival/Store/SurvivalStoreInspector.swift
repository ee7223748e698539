import GRDB

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
