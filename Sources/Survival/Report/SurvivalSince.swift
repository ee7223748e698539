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
        if let local = localDate(trimmed) {
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = timeZone
            if let date = calendar.date(from: DateComponents(
                year: local.year, month: local.month, day: local.day,
                hour: local.hour, minute: local.minute, second: local.second)) {
                return Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
            }
        }
        throw Invalid(description: "expected a duration back from now such as \"7d\" or \"36h\", or a local date such as 2026-11-21 or \"2026-11-21 09:00\", found \"\(text)\"")
    }

    /// "YYYY-MM-DD", optionally followed by " " or "T" and "HH:MM" or
    /// "HH:MM:SS" (one or two digits each but the year), read byte by
    /// byte: Foundation's `DateFormatter.date(from:)` stops the process on
    /// some non-ASCII input (a fatal "Incorrect range" error), such as
    /// "2026-11-2\u{07B0} 09:00". Nil unless the date and time exist.
    static func localDate(_ text: String) -> (year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int)? {
        var bytes = Array(text.utf8)[...]
        func number(_ digits: ClosedRange<Int>) -> Int? {
            let run = bytes.prefix(while: { (48...57).contains($0) })
            guard digits.contains(run.count) else { return nil }
            bytes = bytes.dropFirst(run.count)
            return run.reduce(0) { $0 * 10 + Int($1 - 48) }
        }
        func take(_ byte: Character) -> Bool {
            guard let ascii = byte.asciiValue, bytes.first == ascii else { return false }
            bytes = bytes.dropFirst()
            return true
        }
        guard let year = number(4...4), year >= 1, take("-"), let month = number(1...2), take("-"),
              let day = number(1...2), (1...12).contains(month) else { return nil }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let lengths = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard (1...lengths[month - 1]).contains(day) else { return nil }
        if bytes.isEmpty { return (year, month, day, 0, 0, 0) }
        guard take(" ") || take("T"), let hour = number(1...2), hour < 24, take(":"),
              let minute = number(1...2), minute < 60 else { return nil }
        var second = 0
        if take(":") {
            guard let s = number(1...2), s < 60 else { return nil }
            second = s
        }
        return bytes.isEmpty ? (year, month, day, hour, minute, second) : nil
    }
}
