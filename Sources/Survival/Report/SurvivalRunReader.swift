import Foundation
import GRDB
import VigilKit

/// Reads runs from inside vigild (the D-Bus `Survival` method): a read-only
/// connection to the survival store, opened on first use and kept for the
/// life of the reader, so a call costs no open and no schema read.
public final class SurvivalRunReader: Sendable {
    /// The read-only connection once opened (nil before, and while the
    /// store is empty).
    private let reader = Lock<DatabaseQueue?>(nil)
    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// Runs that started at or after `sinceWallMicros` (all for 0), newest first.
    public func runs(startedSince sinceWallMicros: Int64) throws -> [RunSummary] {
        try reader.withLock { reader in
            if reader == nil { reader = try SurvivalReport.openReader(path: path) }
            guard let reader else { return [] }
            do {
                return try reader.read { db in
                    try SurvivalReport.summaries(SurvivalReport.runs(startedSince: sinceWallMicros, db), db)
                }
            } catch {
                throw SurvivalStoreError.wrap(error, path: path, doing: "reading the runs")
            }
        }
    }
}
