import Foundation
import VigilCommon
import VigilSurvival

/// Plain-text tables and the time formats vigilctl prints.
enum TableFormat {
    /// How a column's cells line up.
    enum Alignment { case left, right }

    /// One column: its header and alignment.
    struct Column {
        var header: String
        var alignment: Alignment = .left

        init(_ header: String, _ alignment: Alignment = .left) {
            self.header = header
            self.alignment = alignment
        }
    }

    /// Aligned columns separated by two spaces, a header line first. The last
    /// column is not padded, so lines carry no trailing blanks.
    static func table(_ columns: [Column], _ rows: [[String]]) -> String {
        let rows = rows.map { $0.map(TerminalText.escaped) }
        var widths = columns.map { $0.header.count }
        for row in rows {
            for (i, cell) in row.enumerated() where i < widths.count {
                widths[i] = max(widths[i], cell.count)
            }
        }
        func line(_ cells: [String]) -> String {
            var out = ""
            for (i, column) in columns.enumerated() {
                let cell = i < cells.count ? cells[i] : ""
                let pad = String(repeating: " ", count: widths[i] - cell.count)
                let isLast = i == columns.count - 1
                if i > 0 { out += "  " }
                switch column.alignment {
                case .left: out += isLast ? cell : cell + pad
                case .right: out += pad + cell
                }
            }
            return out
        }
        var lines = [line(columns.map(\.header))]
        lines += rows.map(line)
        return lines.joined(separator: "\n") + "\n"
    }

    /// "key:  value" lines with the values aligned (values escaped: they
    /// come from vigild and its clients).
    static func fields(_ pairs: [(String, String)]) -> String {
        let width = pairs.map { $0.0.count }.max() ?? 0
        return pairs.map { key, value in
            "  " + key + ":" + String(repeating: " ", count: width - key.count + 2) + TerminalText.escaped(value)
        }.joined(separator: "\n") + "\n"
    }

    /// A duration for people: "850ms", "12s", "4m12s", "3h04m", "2d05h"
    /// (the one format of logs, vigilctl and the docs).
    static func duration(micros: UInt64) -> String {
        SurvivalReportFormat.duration(Int64(clamping: micros))
    }

    /// A signed offset from now: "in 4m12s" or "4m12s ago".
    static func relative(micros: UInt64, now: UInt64) -> String {
        micros >= now ? "in " + duration(micros: micros - now) : duration(micros: now - micros) + " ago"
    }

    /// The zone wall times are shown in (UTC when the system has no time
    /// zone data; `displayZone.note` says so).
    static let displayZone = DisplayTimeZone.resolve()

    /// Wall-clock time in the local zone, "2025-11-21 13:52:03".
    static func wallClock(micros: UInt64, timeZone: TimeZone = displayZone.zone) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
        return formatter.string(from: Date(timeIntervalSince1970: Double(micros) / 1_000_000))
    }

    /// Time of day only, "13:52:03", for event lines.
    static func timeOfDay(_ date: Date = Date(), timeZone: TimeZone = displayZone.zone) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        formatter.dateFormat = "HH:mm:ss"
        return formatter.string(from: date)
    }

    /// Microseconds since the Unix epoch, now (the D-Bus API's time unit).
    static func nowMicros() -> UInt64 {
        UInt64(max(0, Date().timeIntervalSince1970 * 1_000_000))
    }

    /// A table cell: "-" for an empty string.
    static func cell(_ text: String) -> String {
        text.isEmpty ? "-" : text
    }
}
