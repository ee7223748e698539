import Foundation
import VigilKit

/// The `--since` of `vigilctl survival`: a duration back from now ("7d",
/// "36h") or a local date and time ("2026-11-21", "2026-11-21 09:00",
/// "2026-11-21T09:00:30"), as wall µs since the epoch.
public enum SurvivalSince {
    public struct Invalid: Error, CustomStringConvertible {
        public var description: String
    }

    public static func wallMicros(_ text: String, nowWall: Int64, timeZone: TimeZone) throws -> Int64 {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if let first = trimmed.first, first.isNumber, trimmed.count < 10 || !trimmed.contains("-") {
            switch DurationSyntax.parse(trimmed) {
            case .success(let duration): return nowWall - duration.nanoseconds / 1_000
            case .failure(let error): throw Invalid(description: "\(error.message), or a local date such as 2026-11-21 or \"2026-11-21 09:00\"")
            }
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        for format in ["yyyy-MM-dd", "yyyy-MM-dd HH:mm", "yyyy-MM-dd HH:mm:ss", "yyyy-MM-dd'T'HH:mm", "yyyy-MM-dd'T'HH:mm:ss"] {
            formatter.dateFormat = format
            if let date = formatter.date(from: trimmed) {
                return Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
            }
        }
        throw Invalid(description: "expected a duration back from now such as \"7d\" or \"36h\", or a local date such as 2026-11-21 or \"2026-11-21 09:00\", found \"\(text)\"")
    }
}
