import GRDB

/// A column that does not hold what the schema promises: a NULL where it
/// says NOT NULL, text where it says INTEGER. The file may be damaged or not
/// ours, so this is an error to report, never a trap.
public struct StoreColumnError: Error, CustomStringConvertible, Sendable {
    public var description: String
}

extension Database {
    /// Each row `sql` returns, decoded by `decode`: the reader's raw SQL
    /// (reports, picture, costs), on the writer's GRDB as on a read-only one.
    func rows<T>(_ sql: String, _ arguments: StatementArguments = [], _ decode: (StoreRow) throws -> T) throws -> [T] {
        var out: [T] = []
        let cursor = try Row.fetchCursor(self, sql: sql, arguments: arguments)
        while let row = try cursor.next() {
            out.append(try decode(StoreRow(row: row)))
        }
        return out
    }

    /// The first row `sql` returns, decoded, or nil when there is none.
    func row<T>(_ sql: String, _ arguments: StatementArguments = [], _ decode: (StoreRow) throws -> T) throws -> T? {
        try Row.fetchOne(self, sql: sql, arguments: arguments).map { try decode(StoreRow(row: $0)) }
    }
}

/// A row the reader decodes column by column. Every read checks the
/// column's type and throws on a mismatch; none traps (GRDB's subscripts
/// would stop the process on a NULL where a value is expected).
struct StoreRow {
    let row: Row

    private func name(_ index: Int) -> String {
        let names = Array(row.columnNames)
        return names.indices.contains(index) ? names[index] : "column \(index)"
    }

    private func kind(_ value: DatabaseValue) -> String {
        switch value.storage {
        case .null: "NULL"
        case .int64: "an integer"
        case .double: "a real"
        case .string: "text"
        case .blob: "a blob"
        }
    }

    /// An integer column; nil for NULL.
    func optionalInt64(_ index: Int) throws(StoreColumnError) -> Int64? {
        let value: DatabaseValue = row[index]
        switch value.storage {
        case .null: return nil
        case .int64(let number): return number
        // A whole real (SUM over integers never gives one, but a damaged
        // file may): kept when it is exactly an Int64.
        case .double(let real) where Int64(exactly: real) != nil: return Int64(real)
        case .double(let real): throw StoreColumnError(description: "\(name(index)) holds \(real), expected an integer")
        default: throw mismatch(value, index, expected: "an integer")
        }
    }

    /// A text column; nil for NULL.
    func optionalString(_ index: Int) throws(StoreColumnError) -> String? {
        let value: DatabaseValue = row[index]
        switch value.storage {
        case .null: return nil
        case .string(let text): return text
        default: throw mismatch(value, index, expected: "text")
        }
    }

    /// An integer column that must not be NULL.
    func int64(_ index: Int) throws(StoreColumnError) -> Int64 { try required(optionalInt64(index), index, expected: "an integer") }

    /// A text column that must not be NULL.
    func string(_ index: Int) throws(StoreColumnError) -> String { try required(optionalString(index), index, expected: "text") }

    private func required<T>(_ value: T?, _ index: Int, expected: String) throws(StoreColumnError) -> T {
        guard let value else { throw StoreColumnError(description: "\(name(index)) is NULL, expected \(expected)") }
        return value
    }

    private func mismatch(_ value: DatabaseValue, _ index: Int, expected: String) -> StoreColumnError {
        StoreColumnError(description: "\(name(index)) holds \(kind(value)), expected \(expected)")
    }

    /// An integer column as an `Int`, which must not be NULL.
    func int(_ index: Int) throws(StoreColumnError) -> Int { Int(truncatingIfNeeded: try int64(index)) }
}
