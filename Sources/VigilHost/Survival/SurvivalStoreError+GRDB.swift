import GRDB

extension SurvivalStoreError {
    /// ``wrap(_:path:doing:)`` for the writer, which meets SQLite's errors
    /// as GRDB's `DatabaseError`: mapped by the same result codes.
    static func wrapGRDB(_ error: any Error, path: String, doing action: String) -> SurvivalStoreError {
        guard let error = error as? DatabaseError else { return wrap(error, path: path, doing: action) }
        return SurvivalStoreError(sqliteCode: error.resultCode.primaryResultCode.rawValue, message: error.message, path: path, doing: action)
    }
}
