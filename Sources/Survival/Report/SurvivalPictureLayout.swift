import Foundation

/// Where things go in the survival picture: the shared wall-time axis, the
/// resolution it is drawn at, and the per-column sums of the binned
/// resolutions. Pure arithmetic, no text.
struct SurvivalPictureLayout {
    /// How the runs are drawn.
    enum Resolution: Hashable {
        /// Every segment, wake and held span its own element.
        case exact
        /// Columns of this many µs from local midnight: each column shows the
        /// share of its time per kind, its wakes counted per cause.
        case columns(Int64)
    }

    static let hour: Int64 = 3_600_000_000
    static let day: Int64 = 24 * hour
    /// Up to this span (a week and a day) each thing is drawn as it happened...
    static let exactSpanLimit: Int64 = 8 * day
    /// ...unless there are more things than this (then hours are columns).
    static let exactItemLimit = 5_000
    /// Column lengths for longer spans: the shortest that gives each column
    /// at least `minimumColumnWidth` pixels. A year gets days.
    static let columnLengths: [Int64] = [hour, 3 * hour, 6 * hour, day, 7 * day]
    static let minimumColumnWidth = 2.0

    /// Left edge of the plot (run and strategy labels go left of it) and its width.
    static let plotX = 190.0
    static let plotWidth = 940.0
    /// Room right of the plot for how the last run ended.
    static let rightMargin = 90.0
    static var width: Double { plotX + plotWidth + rightMargin }

    let resolution: Resolution
    /// The axis: wall µs at the plot's left and right edges.
    let startWall: Int64
    let endWall: Int64

    init(_ picture: SurvivalPicture, timeZone: TimeZone) {
        let runs = picture.runs.map(\.summary)
        let oldest = runs.map(\.startWall).min() ?? 0
        let last = max(oldest + 1, runs.map { $0.startWall + $0.aliveMicros }.max() ?? 1)
        let first = min(last - 1, max(oldest, picture.sinceWallMicros ?? oldest))
        let span = last - first
        let items = picture.runs.reduce(0) { sum, run in
            sum + run.summary.timeline.count + (run.summary.wakes?.count ?? 0) + run.strategies.reduce(0) { $0 + $1.spans.count }
        }
        if span <= Self.exactSpanLimit && items <= Self.exactItemLimit {
            resolution = .exact
            // A little room either side, so the first start and last end show.
            let pad = max(span / 100, 1)
            startWall = first - pad
            endWall = last + pad
        } else {
            let length = Self.columnLengths.first { Double(span) / Double($0) <= Self.plotWidth / Self.minimumColumnWidth }
                ?? Self.columnLengths[Self.columnLengths.count - 1]
            resolution = .columns(length)
            // Columns start at a local midnight, so days are days.
            let midnight = Self.localMidnight(before: first, timeZone: timeZone)
            startWall = midnight + (first - midnight) / length * length
            let count = (last - startWall + length - 1) / length
            endWall = startWall + max(1, count) * length
        }
    }

    /// x of a wall time on the plot.
    func x(_ wall: Int64) -> Double {
        Self.plotX + Double(wall - startWall) / Double(endWall - startWall) * Self.plotWidth
    }

    static func localMidnight(before wall: Int64, timeZone: TimeZone) -> Int64 {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let date = Date(timeIntervalSince1970: Double(wall) / 1_000_000)
        return Int64((calendar.startOfDay(for: date).timeIntervalSince1970 * 1_000_000).rounded())
    }

    // MARK: columns

    /// Sums of one run's time per column: µs of each timeline kind (awake,
    /// suspended, stalled, unwritable) falling into each column.
    struct ColumnSums {
        /// Index of the first column the run touches.
        var firstColumn: Int
        var micros: [[TimelineSegment.Kind: Int64]]
    }

    /// Index of the column holding `wall` (columns resolution only).
    func column(of wall: Int64, length: Int64) -> Int {
        let offset = wall - startWall
        // Floor division: times left of the axis (runs cut by --since) fall in negative columns.
        return Int(offset >= 0 ? offset / length : -((-offset + length - 1) / length))
    }

    /// Wall range of column `index`.
    func columnRange(_ index: Int, length: Int64) -> Range<Int64> {
        let start = startWall + Int64(index) * length
        return start..<(start + length)
    }

    /// Spreads wall-time intervals over the columns they cross.
    func sums<Key: Hashable>(_ intervals: [(key: Key, start: Int64, duration: Int64)], length: Int64) -> (first: Int, micros: [[Key: Int64]]) {
        guard let lowest = intervals.map(\.start).min() else { return (0, []) }
        let highest = intervals.map { $0.start + $0.duration }.max() ?? lowest
        let first = column(of: lowest, length: length)
        let last = column(of: max(lowest, highest - 1), length: length)
        var micros = [[Key: Int64]](repeating: [:], count: last - first + 1)
        for interval in intervals where interval.duration > 0 {
            var cursor = interval.start
            let end = interval.start + interval.duration
            while cursor < end {
                let index = column(of: cursor, length: length)
                let columnEnd = columnRange(index, length: length).upperBound
                let piece = min(end, columnEnd) - cursor
                micros[index - first][interval.key, default: 0] += piece
                cursor += piece
            }
        }
        return (first, micros)
    }

    // MARK: axis

    /// Tick marks of the axis: wall times and their labels, at least about
    /// 100 pixels apart, on round local times.
    func ticks(timeZone: TimeZone) -> [(wall: Int64, label: String)] {
        let span = endWall - startWall
        let minute: Int64 = 60_000_000
        let steps: [Int64] = [minute, 5 * minute, 15 * minute, 30 * minute, Self.hour, 3 * Self.hour, 6 * Self.hour,
                              12 * Self.hour, Self.day, 2 * Self.day, 7 * Self.day, 14 * Self.day]
        let most = max(2, Int(Self.plotWidth / 100))
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        func date(_ wall: Int64) -> Date { Date(timeIntervalSince1970: Double(wall) / 1_000_000) }
        func wall(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1_000_000).rounded()) }

        if let step = steps.first(where: { span / $0 <= most }) {
            formatter.dateFormat = step >= Self.day ? "yyyy-MM-dd" : span > Self.day ? "MM-dd HH:mm" : "HH:mm"
            var tick = Self.localMidnight(before: startWall, timeZone: timeZone)
            if step < Self.day {
                tick += (startWall - tick + step - 1) / step * step
            } else {
                while tick < startWall { tick = wall(calendar.date(byAdding: .day, value: 1, to: date(tick)) ?? date(tick + Self.day)) }
            }
            var out: [(Int64, String)] = []
            while tick <= endWall, out.count <= most + 1 {
                out.append((tick, formatter.string(from: date(tick))))
                if step < Self.day {
                    tick += step
                } else {
                    // Calendar days, so a DST change does not shift midnights.
                    tick = wall(calendar.date(byAdding: .day, value: Int(step / Self.day), to: date(tick)) ?? date(tick + step))
                }
            }
            return out
        }
        // Months, or several, for spans of months and years.
        formatter.dateFormat = "yyyy-MM"
        let months = [1, 2, 3, 6, 12, 24, 60].first { span / (30 * Self.day * Int64($0)) <= most } ?? 120
        let startDate = date(startWall)
        var parts = calendar.dateComponents([.year, .month], from: startDate)
        parts.day = 1
        var tickDate = calendar.date(from: parts) ?? startDate
        var out: [(Int64, String)] = []
        while wall(tickDate) <= endWall, out.count <= most + 1 {
            if wall(tickDate) >= startWall, (calendar.component(.month, from: tickDate) - 1) % min(months, 12) == 0 {
                out.append((wall(tickDate), formatter.string(from: tickDate)))
            }
            guard let next = calendar.date(byAdding: .month, value: 1, to: tickDate) else { break }
            tickDate = next
        }
        return out
    }
}
