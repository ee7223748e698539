import Foundation
import VigilKit

/// One `time` window such as `"mon-fri 09:00-18:00"`: weekdays (optional:
/// every day) and a local start and end time. An end before the start runs
/// past midnight into the next day; the window belongs to the day it starts.
public struct TimeWindow: Sendable, Hashable {
    /// Weekdays the window starts on, 1 = Monday ... 7 = Sunday.
    public var days: Set<Int>
    /// Minutes after local midnight.
    public var start: Int
    public var end: Int
    /// As written in the config.
    public var written: String

    static let dayNames = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

    /// Parses a window, or says precisely what is wrong with it.
    public static func parse(_ text: String) -> Result<TimeWindow, TimeWindowError> {
        let parts = text.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 1 || parts.count == 2 else {
            return .failure(TimeWindowError("expected \"[days ]HH:MM-HH:MM\" such as \"mon-fri 09:00-18:00\", found \"\(text)\""))
        }
        var days = Set(1...7)
        if parts.count == 2 {
            switch parseDays(String(parts[0])) {
            case .success(let d): days = d
            case .failure(let e): return .failure(e)
            }
        }
        let range = parts[parts.count - 1].split(separator: "-", omittingEmptySubsequences: false)
        guard range.count == 2 else {
            return .failure(TimeWindowError("expected a time range \"HH:MM-HH:MM\", found \"\(parts[parts.count - 1])\""))
        }
        guard let start = parseTime(String(range[0]), allow24: false) else {
            return .failure(TimeWindowError("bad start time \"\(range[0])\": expected HH:MM from 00:00 to 23:59"))
        }
        guard let end = parseTime(String(range[1]), allow24: true) else {
            return .failure(TimeWindowError("bad end time \"\(range[1])\": expected HH:MM from 00:00 to 24:00"))
        }
        guard start != end else {
            return .failure(TimeWindowError("empty time range \"\(parts[parts.count - 1])\": start and end are the same"))
        }
        return .success(TimeWindow(days: days, start: start, end: end, written: text))
    }

    private static func parseDays(_ text: String) -> Result<Set<Int>, TimeWindowError> {
        var days: Set<Int> = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let ends = item.split(separator: "-", omittingEmptySubsequences: false).map { $0.lowercased() }
            var numbers: [Int] = []
            for name in ends {
                guard let i = dayNames.firstIndex(of: name) else {
                    let hint = Spelling.suggestion(for: name, among: dayNames).map { " (did you mean \"\($0)\"?)" } ?? ""
                    return .failure(TimeWindowError("unknown day \"\(name)\"\(hint); days are \(dayNames.joined(separator: ", "))"))
                }
                numbers.append(i + 1)
            }
            guard numbers.count == 1 || numbers.count == 2 else {
                return .failure(TimeWindowError("bad day range \"\(item)\": expected a day or two days joined by \"-\""))
            }
            var d = numbers[0]
            days.insert(d)
            // "fri-mon" wraps over the weekend.
            while numbers.count == 2 && d != numbers[1] {
                d = d % 7 + 1
                days.insert(d)
            }
        }
        return .success(days)
    }

    private static func parseTime(_ text: String, allow24: Bool) -> Int? {
        let hm = text.split(separator: ":", omittingEmptySubsequences: false)
        guard hm.count == 2, hm[0].count == 2, hm[1].count == 2,
              let h = Int(hm[0]), let m = Int(hm[1]), (0...59).contains(m) else { return nil }
        if h == 24 && m == 0 && allow24 { return 24 * 60 }
        guard (0...23).contains(h) else { return nil }
        return h * 60 + m
    }
}

public struct TimeWindowError: Error, Sendable, Hashable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// Where wall-clock time stands against a list of windows, in one time zone.
struct TimeWindowSchedule: Sendable {
    let windows: [TimeWindow]
    let calendar: Calendar

    init(windows: [TimeWindow], timeZone: TimeZone) {
        self.windows = windows
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        self.calendar = calendar
    }

    /// Whether `wall` (seconds since the epoch) lies in a window, and the
    /// next instant at which that changes (nil: never, e.g. every day 00:00-24:00).
    ///
    /// Each window's start and end are placed on local calendar days through
    /// the zone's rules, so a day of 23 or 25 hours (a DST change) moves them
    /// with the local clock; a start in the skipped hour begins when the
    /// clock leaves the gap.
    func state(at wall: Double) -> (inside: Bool, next: Double?) {
        let now = Date(timeIntervalSince1970: wall)
        let today = calendar.startOfDay(for: now)
        var inside = false
        var next: Double?
        func consider(_ t: Double) {
            if t > wall, t < (next ?? .infinity) { next = t }
        }
        for offset in -1...8 {
            guard let day = calendar.date(byAdding: .day, value: offset, to: today) else { continue }
            let parts = calendar.dateComponents([.year, .month, .day, .weekday], from: day)
            // Calendar weekdays: 1 = Sunday; ours: 1 = Monday.
            guard let weekday = parts.weekday else { continue }
            let ours = (weekday + 5) % 7 + 1
            for w in windows where w.days.contains(ours) {
                guard let s = localTime(parts, minutes: w.start),
                      let e = localTime(parts, minutes: w.end > w.start ? w.end : w.end + 24 * 60) else { continue }
                if s <= wall && wall < e { inside = true }
                consider(s)
                consider(e)
            }
        }
        return (inside, next)
    }

    /// The instant of local `minutes` after midnight of the day `parts` names
    /// (minutes may exceed a day: the following days).
    private func localTime(_ parts: DateComponents, minutes: Int) -> Double? {
        var c = DateComponents()
        c.year = parts.year
        c.month = parts.month
        c.day = (parts.day ?? 1) + minutes / (24 * 60)
        c.hour = (minutes % (24 * 60)) / 60
        c.minute = minutes % 60
        return calendar.date(from: c)?.timeIntervalSince1970
    }
}
