import CSQLite
import Foundation

/// An SQLite failure: its primary result code and SQLite's message.
public struct SQLiteError: Error, CustomStringConvertible, Sendable {
    /// The primary result code (`SQLITE_CORRUPT`, `SQLITE_NOTADB`, ...).
    public var code: Int32
    public var message: String

    public var description: String { "SQLite error \(code): \(message)" }
}

/// A column that does not hold what the schema promises: a NULL where it
/// says NOT NULL, text where it says INTEGER. The file may be damaged or not
/// ours, so this is an error to report, never a trap.
public struct StoreColumnError: Error, CustomStringConvertible, Sendable {
    public var description: String
}

/// A value bound to a statement's parameter.
enum StoreValue {
    case null
    case integer(Int64)
    case text(String)

    static func optional(_ value: Int64?) -> StoreValue { value.map(StoreValue.integer) ?? .null }
}

/// One connection to a survival store through libsqlite3, for reading: the
/// reader's only way to the file (docs/survival.md). Its own connection is
/// opened read-only; the writer lends its GRDB connection to read what it
/// just wrote in the same transaction (``init(borrowing:)``).
///
/// Not Sendable: the `sqlite3*` handle is used by one thread at a time. An
/// owned connection is local to one call or kept inside a lock
/// (``SurvivalRunReader``); a borrowed one lives only inside the writer's
/// serialized database access.
package final class StoreConnection {
    private let handle: OpaquePointer
    private let owned: Bool

    /// Opens `name` read-only (a path, or a `file:` URI).
    init(readOnly name: String) throws(SQLiteError) {
        var db: OpaquePointer?
        let status = sqlite3_open_v2(name, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nil)
        guard status == SQLITE_OK, let db else {
            let error = SQLiteError(code: status & 0xFF, message: db.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(status)))
            sqlite3_close_v2(db)
            throw error
        }
        handle = db
        owned = true
    }

    /// Reads through a connection someone else owns and keeps open (the
    /// writer's, inside its transaction): never closed here.
    init(borrowing handle: OpaquePointer) {
        self.handle = handle
        owned = false
    }

    deinit {
        if owned { sqlite3_close_v2(handle) }
    }

    /// Runs `body` in one read transaction, so it sees one state of the
    /// file. A borrowed connection is already inside its owner's.
    func read<T>(_ body: () throws -> T) throws -> T {
        guard owned else { return try body() }
        try execute("BEGIN")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
    }

    /// Each row `sql` returns, decoded by `decode`.
    func rows<T>(_ sql: String, _ arguments: [StoreValue] = [], _ decode: (StoreRow) throws -> T) throws -> [T] {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_finalize(statement) }
        var out: [T] = []
        while try step(statement) {
            out.append(try decode(StoreRow(statement: statement)))
        }
        return out
    }

    /// The first row `sql` returns, decoded, or nil when there is none.
    func row<T>(_ sql: String, _ arguments: [StoreValue] = [], _ decode: (StoreRow) throws -> T) throws -> T? {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_finalize(statement) }
        return try step(statement) ? try decode(StoreRow(statement: statement)) : nil
    }

    /// A statement prepared once for many lookups (``StoreStatement``).
    func statement(_ sql: String) throws -> StoreStatement {
        StoreStatement(statement: try prepare(sql, []), connection: self)
    }

    /// Whether the table exists.
    func tableExists(_ name: String) throws -> Bool {
        try row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(name)]) { _ in true } ?? false
    }

    private func execute(_ sql: String) throws(SQLiteError) {
        let status = sqlite3_exec(handle, sql, nil, nil, nil)
        guard status == SQLITE_OK else { throw failure(status) }
    }

    private func prepare(_ sql: String, _ arguments: [StoreValue]) throws(SQLiteError) -> OpaquePointer {
        var statement: OpaquePointer?
        let status = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard status == SQLITE_OK, let statement else { throw failure(status) }
        do {
            try bind(arguments, to: statement)
        } catch {
            sqlite3_finalize(statement)
            throw error
        }
        return statement
    }

    fileprivate func bind(_ arguments: [StoreValue], to statement: OpaquePointer) throws(SQLiteError) {
        for (index, value) in zip(Int32(1)..., arguments) {
            let bound: Int32
            switch value {
            case .null: bound = sqlite3_bind_null(statement, index)
            case .integer(let number): bound = sqlite3_bind_int64(statement, index, number)
            case .text(let text): bound = vigil_sqlite_bind_text(statement, index, text)
            }
            guard bound == SQLITE_OK else { throw failure(bound) }
        }
    }

    /// True when a row is ready, false when done.
    fileprivate func step(_ statement: OpaquePointer) throws(SQLiteError) -> Bool {
        switch sqlite3_step(statement) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let status: throw failure(status)
        }
    }

    private func failure(_ status: Int32) -> SQLiteError {
        SQLiteError(code: status & 0xFF, message: String(cString: sqlite3_errmsg(handle)))
    }
}

/// A prepared statement run again and again with new arguments (one
/// heartbeat looked up per end of a held span), finalized when released.
/// Used only where its connection is, and while it is open.
final class StoreStatement {
    private let statement: OpaquePointer
    private let connection: StoreConnection

    fileprivate init(statement: OpaquePointer, connection: StoreConnection) {
        self.statement = statement
        self.connection = connection
    }

    deinit { sqlite3_finalize(statement) }

    /// The first row for `arguments`, decoded, or nil when there is none.
    func row<T>(_ arguments: [StoreValue], _ decode: (StoreRow) throws -> T) throws -> T? {
        sqlite3_reset(statement)
        sqlite3_clear_bindings(statement)
        try connection.bind(arguments, to: statement)
        return try connection.step(statement) ? try decode(StoreRow(statement: statement)) : nil
    }
}

/// The current row of a statement. Every read checks the column's type and
/// throws on a mismatch; none traps.
struct StoreRow {
    let statement: OpaquePointer

    private func name(_ index: Int32) -> String {
        sqlite3_column_name(statement, index).map { String(cString: $0) } ?? "column \(index)"
    }

    private func typeName(_ type: Int32) -> String {
        switch type {
        case SQLITE_NULL: "NULL"
        case SQLITE_INTEGER: "an integer"
        case SQLITE_FLOAT: "a real"
        case SQLITE_TEXT: "text"
        default: "a blob"
        }
    }

    /// An integer column; nil for NULL.
    func optionalInt64(_ index: Int32) throws(StoreColumnError) -> Int64? {
        switch sqlite3_column_type(statement, index) {
        case SQLITE_NULL: return nil
        case SQLITE_INTEGER: return sqlite3_column_int64(statement, index)
        case SQLITE_FLOAT:
            // A whole real (SUM over integers never gives one, but a damaged
            // file may): kept when it is exactly an Int64.
            let value = sqlite3_column_double(statement, index)
            if let exact = Int64(exactly: value) { return exact }
            throw StoreColumnError(description: "\(name(index)) holds \(value), expected an integer")
        case let type:
            throw StoreColumnError(description: "\(name(index)) holds \(typeName(type)), expected an integer")
        }
    }

    /// An integer column that must not be NULL.
    func int64(_ index: Int32) throws(StoreColumnError) -> Int64 {
        guard let value = try optionalInt64(index) else {
            throw StoreColumnError(description: "\(name(index)) is NULL, expected an integer")
        }
        return value
    }

    /// A text column; nil for NULL.
    func optionalString(_ index: Int32) throws(StoreColumnError) -> String? {
        switch sqlite3_column_type(statement, index) {
        case SQLITE_NULL: return nil
        case SQLITE_TEXT:
            guard let text = sqlite3_column_text(statement, index) else { return "" }
            let count = Int(sqlite3_column_bytes(statement, index))
            return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
        case let type:
            throw StoreColumnError(description: "\(name(index)) holds \(typeName(type)), expected text")
        }
    }

    /// A text column that must not be NULL.
    func string(_ index: Int32) throws(StoreColumnError) -> String {
        guard let value = try optionalString(index) else {
            throw StoreColumnError(description: "\(name(index)) is NULL, expected text")
        }
        return value
    }

    /// An integer column as an `Int`, which must not be NULL.
    func int(_ index: Int32) throws(StoreColumnError) -> Int { Int(truncatingIfNeeded: try int64(index)) }
}
