/// An HTTP date (RFC 9110 §5.6.7) read byte by byte, as seconds since the
/// Unix epoch, in the three forms a recipient must accept:
///
///     Sun, 06 Nov 1994 08:49:37 GMT     IMF-fixdate (what servers send)
///     Sunday, 06-Nov-94 08:49:37 GMT    rfc850-date (obsolete)
///     Sun Nov  6 08:49:37 1994          asctime-date (obsolete)
///
/// Written by hand rather than with `DateFormatter`: the value comes from
/// the server, and Foundation's `DateFormatter.date(from:)` on Linux stops
/// the process (a fatal "Incorrect range" error) on some non-ASCII input,
/// such as "Wed, 21\u{07B0}ct 2015 07:28:00 WMT", found by fuzz-http.
/// Anything that is not one of the three forms, in ASCII, with a real
/// calendar date and time, is nil.
enum HTTPDate {
    static func secondsSinceEpoch(_ text: String) -> Int64? {
        var bytes = Array(text.utf8)[...]
        guard bytes.count <= 64, bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        // The day name: three letters, then ", " (IMF-fixdate), " "
        // (asctime), or the rest of a long name and ", " (rfc850).
        let name = String(decoding: bytes.prefix(while: { $0 != UInt8(ascii: ",") && $0 != UInt8(ascii: " ") }), as: UTF8.self)
        bytes = bytes.dropFirst(name.utf8.count)
        if shortDays.contains(name) {
            if bytes.first == UInt8(ascii: " ") { return asctime(bytes.dropFirst()) }
            guard take(", ", from: &bytes) else { return nil }
            return fixdate(bytes)
        }
        guard longDays.contains(name), take(", ", from: &bytes) else { return nil }
        return rfc850(bytes)
    }

    // Sun, |06 Nov 1994 08:49:37 GMT
    private static func fixdate(_ rest: ArraySlice<UInt8>) -> Int64? {
        var bytes = rest
        guard let day = digits(2, from: &bytes), take(" ", from: &bytes),
              let month = month(from: &bytes), take(" ", from: &bytes),
              let year = digits(4, from: &bytes), take(" ", from: &bytes),
              let time = time(from: &bytes), take(" GMT", from: &bytes), bytes.isEmpty else { return nil }
        return epoch(year: year, month: month, day: day, time: time)
    }

    // Sunday, |06-Nov-94 08:49:37 GMT
    private static func rfc850(_ rest: ArraySlice<UInt8>) -> Int64? {
        var bytes = rest
        guard let day = digits(2, from: &bytes), take("-", from: &bytes),
              let month = month(from: &bytes), take("-", from: &bytes),
              let twoDigits = digits(2, from: &bytes), take(" ", from: &bytes),
              let time = time(from: &bytes), take(" GMT", from: &bytes), bytes.isEmpty else { return nil }
        // 00-49 is read as 2000-2049 and 50-99 as 1950-1999. RFC 9110
        // asks for the latest such year at most 50 years ahead, which
        // differs only for dates decades away; a Retry-After that far
        // out is capped at max_retry_after, or is already past, either way.
        let year = twoDigits + (twoDigits < 50 ? 2000 : 1900)
        return epoch(year: year, month: month, day: day, time: time)
    }

    // Sun |Nov  6 08:49:37 1994
    private static func asctime(_ rest: ArraySlice<UInt8>) -> Int64? {
        var bytes = rest
        guard let month = month(from: &bytes), take(" ", from: &bytes) else { return nil }
        if bytes.first == UInt8(ascii: " ") { bytes = bytes.dropFirst() }  // " 6" or "16"
        guard let day = digits(bytes.count > 1 && isDigit(bytes[bytes.startIndex + 1]) ? 2 : 1, from: &bytes),
              take(" ", from: &bytes), let time = time(from: &bytes), take(" ", from: &bytes),
              let year = digits(4, from: &bytes), bytes.isEmpty else { return nil }
        return epoch(year: year, month: month, day: day, time: time)
    }

    private static let shortDays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let longDays = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    private static func isDigit(_ byte: UInt8) -> Bool { (48...57).contains(byte) }

    private static func take(_ literal: String, from bytes: inout ArraySlice<UInt8>) -> Bool {
        guard bytes.starts(with: literal.utf8) else { return false }
        bytes = bytes.dropFirst(literal.utf8.count)
        return true
    }

    /// Exactly `count` ASCII digits.
    private static func digits(_ count: Int, from bytes: inout ArraySlice<UInt8>) -> Int? {
        guard bytes.count >= count else { return nil }
        var value = 0
        for byte in bytes.prefix(count) {
            guard isDigit(byte) else { return nil }
            value = value * 10 + Int(byte - 48)
        }
        bytes = bytes.dropFirst(count)
        return value
    }

    /// "Jan" … "Dec", case-sensitive as the grammar is: 1 … 12.
    private static func month(from bytes: inout ArraySlice<UInt8>) -> Int? {
        guard let index = months.firstIndex(where: { bytes.starts(with: $0.utf8) }) else { return nil }
        bytes = bytes.dropFirst(3)
        return index + 1
    }

    /// "HH:MM:SS" as seconds into the day; 60 is a leap second.
    private static func time(from bytes: inout ArraySlice<UInt8>) -> Int? {
        guard let hour = digits(2, from: &bytes), take(":", from: &bytes),
              let minute = digits(2, from: &bytes), take(":", from: &bytes),
              let second = digits(2, from: &bytes),
              hour < 24, minute < 60, second <= 60 else { return nil }
        return hour * 3600 + minute * 60 + second
    }

    /// Seconds since 1970-01-01 00:00:00 UTC for a proleptic Gregorian
    /// date, or nil if there is no such day (year 0, 31 April, 29 February
    /// of a common year). Days are counted from 1 March, so that the leap
    /// day ends each cycle.
    private static func epoch(year: Int, month: Int, day: Int, time: Int) -> Int64? {
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let lengths = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard year >= 1, (1...12).contains(month), (1...lengths[month - 1]).contains(day) else { return nil }
        let y = month <= 2 ? year - 1 : year
        let era = y / 400  // y >= 0 here
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146_097 + dayOfEra - 719_468
        return Int64(days) * 86_400 + Int64(time)
    }
}
