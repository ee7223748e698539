import Foundation
import GRDB
import VigilKit

/// Reads runs from inside vigild (the D-Bus `Survival` method): a read-only
/// connection to the survival store, opened on first use and kept for the
/// life of the reader.
///
/// Kept open on purpose: a short-lived GRDB queue is released on
/// libdispatch's default queue, which starts its 1 Hz worker monitor for the
/// life of the process (see Sources/CExecutor), so `SurvivalReport.load`,
/// which opens and closes a queue per call, must not run inside vigild.
public final class SurvivalRunReader: Sendable {
    /// The connection once opened (nil before, and while the store is empty).
    private let reader = Lock<DatabaseQueue?>(nil)
    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// Runs that started at or after `sinceWallMicros` (all for 0), newest first.
    public func runs(startedSince sinceWallMicros: Int64) throws -> [RunSummary] {
        let queue: DatabaseQueue? = try reader.withLock { reader in
            if let reader { return reader }
            reader = try SurvivalReport.openReader(path: path)
            return reader
        }
        guard let queue else { return [] }
        do {
            return try queue.read { db in
                let records = try RunRecord.fetchAll(db, sql: """
                    SELECT * FROM run WHERE startWall >= ? ORDER BY id DESC
                    """, arguments: [sinceWallMicros])
                return try SurvivalReport.summaries(records, db)
            }
        } catch {
            throw SurvivalStoreError.wrap(error, path: path, doing: "reading the runs")
        }
    }
}
