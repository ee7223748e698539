import Foundation
import GRDB

/// An error from the survival store or its report. `code` says what kind of
/// failure it is; `description` says which file and what was expected.
public struct SurvivalStoreError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, as a value callers can match on. New codes may be
    /// added without breaking callers (a struct, not an enum).
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Value: String, Hashable, Sendable {
            case missing, notAVigilStore, corrupt, newerSchema, unreadable
            case noActiveRun, runAlreadyActive, invalidArgument, database, unwritable
        }
        private let value: Value
        private init(_ value: Value) { self.value = value }

        /// The store file does not exist (report side: nothing has been recorded).
        public static let missing = Code(.missing)
        /// The file exists but is not a Vigil survival store (not SQLite, or
        /// an SQLite database belonging to something else).
        public static let notAVigilStore = Code(.notAVigilStore)
        /// SQLite reports the file as damaged.
        public static let corrupt = Code(.corrupt)
        /// The store was migrated by a newer Vigil; this one will not write to it.
        public static let newerSchema = Code(.newerSchema)
        /// The file could not be opened (permissions, directory missing, ...).
        public static let unreadable = Code(.unreadable)
        /// `heartbeat`, `recordEvent` or `endRun` was called with no run begun.
        public static let noActiveRun = Code(.noActiveRun)
        /// `beginRun` was called while a run is active in this store object.
        public static let runAlreadyActive = Code(.runAlreadyActive)
        /// An argument was out of range (interval, end reason, run id).
        public static let invalidArgument = Code(.invalidArgument)
        /// Any other SQLite failure.
        public static let database = Code(.database)
        /// The store cannot be written for now: its filesystem is full or
        /// failing (SQLITE_FULL, SQLITE_IOERR). Heartbeats resume by
        /// themselves once it is writable again.
        public static let unwritable = Code(.unwritable)

        public var description: String { value.rawValue }
    }

    public let code: Code
    /// The store file concerned.
    public let path: String
    /// What happened and what was expected, for people.
    public let message: String

    public init(_ code: Code, path: String, _ message: String) {
        self.code = code
        self.path = path
        self.message = message
    }

    public var description: String { "survival store \(path): \(message)" }

    /// Maps an error met while using the store to a store error with a
    /// message that names the file: SQLite's (GRDB's `DatabaseError`) by its
    /// primary result code, a damaged column as corrupt.
    static func wrap(_ error: any Error, path: String, doing action: String) -> SurvivalStoreError {
        switch error {
        case let error as SurvivalStoreError: error
        case let error as DatabaseError:
            SurvivalStoreError(error.resultCode.primaryResultCode, message: error.message, path: path, doing: action)
        case let error as StoreColumnError:
            SurvivalStoreError(.corrupt, path: path, "a damaged row (\(action)): \(error); move the store aside and a new one will be created")
        default: SurvivalStoreError(.database, path: path, "\(action): \(error)")
        }
    }

    /// A store error for an SQLite primary result code and its message.
    init(_ code: ResultCode, message: String?, path: String, doing action: String) {
        // GRDB gives no message for a failed open: SQLite's text for the code.
        let message = message ?? "SQLite error \(code)"
        switch code {
        case .SQLITE_NOTADB:
            self.init(.notAVigilStore, path: path, "not an SQLite database, so not a Vigil survival store (\(action))")
        case .SQLITE_CORRUPT:
            self.init(.corrupt, path: path, "the database is corrupt (\(action)): \(message); move it aside and a new store will be created")
        case .SQLITE_CANTOPEN, .SQLITE_PERM, .SQLITE_READONLY, .SQLITE_AUTH:
            self.init(.unreadable, path: path, "cannot open (\(action)): \(message)")
        case .SQLITE_FULL:
            let directory = (path as NSString).deletingLastPathComponent
            self.init(.unwritable, path: path, "cannot write (\(action)): the filesystem of \(directory) is full; free some space there (writing resumes by itself)")
        case .SQLITE_IOERR:
            self.init(.unwritable, path: path, "cannot write (\(action)): I/O error (\(message)); check the disk under \((path as NSString).deletingLastPathComponent)")
        default:
            self.init(.database, path: path, "\(action): \(message)")
        }
    }
}
