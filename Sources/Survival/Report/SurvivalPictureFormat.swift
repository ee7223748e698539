import Foundation
import VigilDBus
import VigilKit

/// Draws the survival log (`vigilctl survival --svg/--html`): one lane per
/// run on a shared wall-time axis, oldest at the top, coloured by what the
/// run was doing (awake, suspended, frozen or stalled, store unwritable);
/// each wake a mark coloured by its cause; how the run ended at its right
/// end; under each run a lane per strategy showing when it held leases.
/// Every element says what it is in a `<title>` (a tooltip in browsers).
/// Up to eight days everything is drawn as it happened; longer spans are
/// drawn in columns (``SurvivalPictureLayout``): a year, one column a day.
///
/// Pure functions of the picture: no clock or time zone is read here.
/// Outside strings (run ids, strategy names, notes) go through ``XMLText``.
public enum SurvivalPictureFormat {
    /// The picture alone: a standalone SVG document.
    public static func svg(_ picture: SurvivalPicture, timeZone: TimeZone, nowWall: Int64) -> String {
        #"<?xml version="1.0" encoding="UTF-8"?>"# + "\n" + drawing(picture, timeZone: timeZone, nowWall: nowWall)
    }

    /// One self-contained HTML page: a heading, the picture inline, the
    /// totals table of the text report, and how to read it. No scripts,
    /// no outside resources; CSS is inline.
    public static func html(_ picture: SurvivalPicture, timeZone: TimeZone, nowWall: Int64, note: String? = nil) -> String {
        let dates = wallFormatter(timeZone, "yyyy-MM-dd HH:mm")
        let runs = Array(picture.runs.reversed())
        var out = """
            <!DOCTYPE html>
            <html lang="en">
            <head>
            <meta charset="utf-8">
            <title>Vigil survival log</title>
            <style>
            body { font-family: sans-serif; margin: 16px; color: #222; background: #fff; }
            p { margin: 4px 0 10px; font-size: 13px; }
            table { border-collapse: collapse; font-size: 11px; margin-top: 8px; }
            th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: right; white-space: nowrap; }
            th:first-child, td:first-child, td.text { text-align: left; }
            tr.total td { font-weight: bold; background: #f3f3f3; }
            td.killed, td.rebooted, td.failed { color: #b52a25; }
            </style>
            </head>
            <body>

            """
        let first = max(runs.map(\.summary.startWall).min() ?? 0, picture.sinceWallMicros ?? .min)
        let last = dates(runs.map { $0.summary.startWall + $0.summary.aliveMicros }.max() ?? 0)
        let span = runs.isEmpty ? "No runs"
            : picture.sinceWallMicros == nil ? "Runs from \(dates(first)) to \(last)"
            : "Shown from \(dates(first)) to \(last) (the table counts whole runs)"
        out += "<p>\(XMLText.escaped(span)) (\(XMLText.escaped(timeZone.identifier))).\(note.map { " Note: " + XMLText.escaped($0) + "." } ?? "")</p>\n"
        out += drawing(picture, timeZone: timeZone, nowWall: nowWall) + "\n"
        out += totalsTable(runs.map(\.summary), dates: dates)
        out += """
            <p>A run's lane goes from its start to its last heartbeat. Awake, suspended, frozen or stalled, and store \
            unwritable come from the gaps between heartbeats; marks above a lane are the system's wakes, coloured by \
            what woke it; a bar along a lane's top is a wake by vigild's own alarm, dark blue until it returned the \
            system to sleep, orange until it decided to stay awake; a red cross is a sleep that broke leases; \
            the thin lanes under a run show when each strategy held leases (seen at heartbeats). \
            Hover over anything for its times. See docs/survival.md.</p>
            </body>
            </html>

            """
        return out
    }

    // MARK: the drawing

    /// Colours and shapes, defined once as classes.
    static let style = """
        text{font-family:sans-serif;font-size:11px;fill:#222}\
        .small{font-size:10px;fill:#555}.head{font-size:13px;font-weight:bold}\
        .grid{stroke:#e4e4e4;stroke-width:1}.axis{stroke:#888;stroke-width:1}\
        .aw{fill:#a3d69b}.su{fill:#5b84c4}.st{fill:#d9413b}.un{fill:#f0a030}\
        .held{fill:#9467bd}.lane{fill:#f6f6f6}\
        .wa{fill:#14306b;stroke:#fff;stroke-width:0.8}.wo{fill:#222;stroke:#fff;stroke-width:0.8}\
        .wm{fill:#c2185b;stroke:#fff;stroke-width:0.8}\
        .dk{fill:#0d47a1}.dka{fill:#ef6c00}.bk{stroke:#b00020;stroke-width:2.2;fill:none}\
        .end-stopped{fill:#555}.end-rebooted{fill:#e07b00}\
        .end-running{fill:#2e7d32}\
        .cross-killed{stroke:#d9413b;stroke-width:2.5;fill:none}.cross-failed{stroke:#8b0000;stroke-width:2.5;fill:none}
        """

    static let laneHeight = 20.0
    static let wakeRow = 10.0
    static let strategyHeight = 9.0
    static let strategyGap = 3.0
    static let runGap = 16.0
    /// Strategy lanes per run; the rest share one lane.
    static let maxStrategyLanes = 8

    /// The `<svg>` element.
    static func drawing(_ picture: SurvivalPicture, timeZone: TimeZone, nowWall: Int64) -> String {
        let layout = SurvivalPictureLayout(picture, timeZone: timeZone)
        let dates = wallFormatter(timeZone, "yyyy-MM-dd HH:mm:ss")
        let columnLabel = columnLabeler(layout, timeZone: timeZone)
        var body = SVGText()
        var labels = SVGText()
        let top = 64.0
        var y = top
        let runs = Array(picture.runs.reversed())
        if runs.isEmpty {
            body.text(x: 10, y: y + 14, "No runs recorded in the survival log.", cls: nil)
            y += 30
        }
        for run in runs {
            y = drawRun(run, at: y, layout: layout, dates: dates, columnLabel: columnLabel, nowWall: nowWall, into: &body, labels: &labels)
            y += runGap
        }
        let height = y + 4

        var head = SVGText()
        head.text(x: 10, y: 16, "Vigil survival log", cls: "head")
        let resolution: String
        switch layout.resolution {
        case .exact: resolution = "drawn as it happened"
        case .columns(let length): resolution = "one column per \(length == SurvivalPictureLayout.day ? "day" : length == 7 * SurvivalPictureLayout.day ? "week" : DurationSyntax.human(.microseconds(length)))"
        }
        head.text(x: 150, y: 16, "\(runs.count) run\(runs.count == 1 ? "" : "s"), oldest at the top; \(resolution); times in \(timeZone.identifier)", cls: "small")
        legend(into: &head, y: 32)
        // Axis and grid.
        head.line(x1: SurvivalPictureLayout.plotX, y1: top - 6, x2: SurvivalPictureLayout.plotX + SurvivalPictureLayout.plotWidth, y2: top - 6, cls: "axis")
        for tick in layout.ticks(timeZone: timeZone) {
            let x = layout.x(tick.wall)
            guard x >= SurvivalPictureLayout.plotX - 0.5, x <= SurvivalPictureLayout.plotX + SurvivalPictureLayout.plotWidth + 0.5 else { continue }
            head.line(x1: x, y1: top - 6, x2: x, y2: height - 4, cls: "grid")
            head.text(x: x + 2, y: top - 10, tick.label, cls: "small")
        }

        var out = #"<svg xmlns="http://www.w3.org/2000/svg" width="\#(Int(SurvivalPictureLayout.width))" height="\#(Int(height.rounded(.up)))" viewBox="0 0 \#(Int(SurvivalPictureLayout.width)) \#(Int(height.rounded(.up)))" role="img">"#
        out += "\n<title>Vigil survival log</title>\n<style>\(style)</style>\n"
        out += ##"<rect x="0" y="0" width="100%" height="100%" fill="#fff"/>"## + "\n"
        // The plot is clipped at its left edge: runs cut by --since.
        out += #"<defs><clipPath id="plot"><rect x="\#(n(SurvivalPictureLayout.plotX))" y="0" width="\#(n(SurvivalPictureLayout.plotWidth + SurvivalPictureLayout.rightMargin))" height="\#(n(height))"/></clipPath></defs>"# + "\n"
        out += head.out + labels.out + #"<g clip-path="url(#plot)">"# + "\n" + body.out + "</g>\n</svg>"
        return out
    }

    static func legend(into svg: inout SVGText, y: Double) {
        var x = 10.0
        for (cls, label) in [("aw", "awake"), ("su", "suspended"), ("st", "frozen or stalled"), ("un", "store unwritable"), ("held", "strategy held leases")] {
            svg.rect(x: x, y: y - 8, width: 12, height: 10, cls: cls)
            svg.text(x: x + 16, y: y + 1, label, cls: "small")
            x += 28 + Double(label.count) * 5.6
        }
        for (cause, label) in [(WakeClass.alarm, "woken by a Vigil alarm"), (.other, "woken by something else"), (.missed, "a Vigil alarm missed its wake")] {
            wakeMark(cause, x: x + 5, y: y - 3, radius: 4, into: &svg)
            svg.text(x: x + 13, y: y + 1, label, cls: "small")
            x += 24 + Double(label.count) * 5.6
        }
    }

    /// One run: its lane, wakes, end, and strategy lanes. Returns the y below it.
    static func drawRun(_ run: SurvivalPicture.Run, at top: Double, layout: SurvivalPictureLayout,
                        dates: (Int64) -> String, columnLabel: (Int) -> String, nowWall: Int64,
                        into svg: inout SVGText, labels: inout SVGText) -> Double {
        let summary = run.summary
        let laneTop = top + wakeRow
        let startX = layout.x(summary.startWall)
        let endX = max(startX + 1, layout.x(summary.startWall + summary.aliveMicros))
        labels.text(x: 10, y: laneTop + 9, "run " + String(summary.runId.prefix(18)), cls: nil)
        labels.text(x: 10, y: laneTop + 19, "pid \(summary.pid) · \(SurvivalReportFormat.duration(summary.aliveMicros)) alive", cls: "small")
        svg.open("g", title: runTitle(summary, dates: dates))
        svg.rect(x: startX, y: laneTop, width: endX - startX, height: laneHeight, cls: "aw")
        svg.close("g")

        switch layout.resolution {
        case .exact:
            for segment in summary.timeline where segment.kind != .awake {
                let x = layout.x(summary.startWall + segment.startOffsetMicros)
                let width = max(1, layout.x(summary.startWall + segment.startOffsetMicros + segment.durationMicros) - x)
                svg.rect(x: x, y: laneTop, width: width, height: laneHeight, cls: kindClass(segment.kind),
                         title: "\(kindName(segment.kind)) \(dates(summary.startWall + segment.startOffsetMicros)) → \(dates(summary.startWall + segment.startOffsetMicros + segment.durationMicros)) (\(SurvivalReportFormat.duration(segment.durationMicros)))")
            }
            for wake in summary.wakes ?? [] {
                var title = "woke \(dates(wake.wall)) after \(SurvivalReportFormat.duration(wake.suspendedMicros)) suspended: \(SurvivalReportFormat.wakeCause(wake))"
                if let strategy = wake.alarmStrategy { title += "; strategy \(strategy)" + (wake.alarmKind.map { " (\($0))" } ?? "") }
                wakeMark(WakeClass(wake), x: layout.x(summary.startWall + wake.startOffsetMicros), y: top + wakeRow / 2, radius: 4, title: title, into: &svg)
            }
            // A dark wake: a bar along the lane's top from the wake to the
            // return to sleep (dark blue) or to the decision to stay awake (orange).
            for dark in summary.darkWakes ?? [] {
                let x = layout.x(summary.startWall + dark.startOffsetMicros)
                let width = max(2, layout.x(summary.startWall + dark.startOffsetMicros + dark.awakeMicros) - x)
                svg.rect(x: x, y: laneTop, width: width, height: 4, cls: dark.outcome == .asleepAgain ? "dk" : "dka",
                         title: "dark wake \(dates(dark.wall)): \(SurvivalReportFormat.darkWake(dark))")
            }
            // A sleep that broke leases: a red cross above the lane where it began.
            for broken in summary.brokenSleeps ?? [] {
                let x = layout.x(summary.startWall + broken.startOffsetMicros), y = top + wakeRow / 2
                svg.open("g", title: "sleep broke leases \(dates(broken.wall)): \(SurvivalReportFormat.brokenSleep(broken))")
                svg.path("M\(n(x - 4)) \(n(y - 4))l8 8m0 -8l-8 8", cls: "bk")
                svg.close("g")
            }
        case .columns(let length):
            drawColumns(summary, layout: layout, length: length, laneTop: laneTop, columnLabel: columnLabel, wakeRowY: top + wakeRow / 2, into: &svg)
        }

        // How it ended, right of the lane.
        let ending = endLabel(summary, nowWall: nowWall)
        let cls = "end-" + summary.endReason.rawValue
        let middle = laneTop + laneHeight / 2
        let endTitle = "\(ending) \(dates(summary.endWall ?? summary.lastHeartbeatWall))" + (summary.endNote.map { "; \($0)" } ?? "")
        svg.open("g", title: endTitle)
        switch summary.endReason {
        case .killed, .failed:
            svg.path("M\(n(endX + 1)) \(n(middle - 5))l9 10m0 -10l-9 10", cls: "cross-" + summary.endReason.rawValue)
        case .rebooted:
            svg.circle(cx: endX + 6, cy: middle, r: 5, cls: cls)
        case .running:
            svg.path("M\(n(endX + 1)) \(n(middle - 6))l9 6l-9 6z", cls: cls)
        case .stopped:
            svg.rect(x: endX + 1, y: middle - 5, width: 9, height: 10, cls: cls)
        }
        svg.text(x: endX + 13, y: middle + 4, ending, cls: "small")
        svg.close("g")

        var y = laneTop + laneHeight + strategyGap
        let shown = run.strategies.prefix(maxStrategyLanes)
        var lanes: [(label: String, title: String, held: [StrategyHeld])] = shown.map { ($0.strategy, "\($0.strategy) (\($0.holds.joined(separator: ", ")))", [$0]) }
        let rest = run.strategies.dropFirst(maxStrategyLanes)
        if !rest.isEmpty {
            let names = rest.prefix(20).map(\.strategy).joined(separator: ", ") + (rest.count > 20 ? ", ..." : "")
            lanes.append(("\(rest.count) more strategies", names, Array(rest)))
        }
        for lane in lanes {
            labels.text(x: 22, y: y + strategyHeight - 1, truncated(lane.label, 28), cls: "small")
            svg.rect(x: startX, y: y, width: endX - startX, height: strategyHeight, cls: "lane")
            drawHeld(lane.held, title: lane.title, summary: summary, layout: layout, top: y, dates: dates, columnLabel: columnLabel, into: &svg)
            y += strategyHeight + strategyGap
        }
        return y
    }

    /// A run in columns: each column shows the share of its time the run
    /// spent in each state (stacked from the top; awake is the lane's own
    /// colour), and one mark per cause of wake with the count in its title.
    static func drawColumns(_ summary: RunSummary, layout: SurvivalPictureLayout, length: Int64, laneTop: Double,
                            columnLabel: (Int) -> String, wakeRowY: Double, into svg: inout SVGText) {
        let (first, micros) = layout.sums(summary.timeline.map { ($0.kind, summary.startWall + $0.startOffsetMicros, $0.durationMicros) }, length: length)
        for (offset, column) in micros.enumerated() {
            let covered = column.values.reduce(0, +)
            let shown = TimelineSegment.Kind.allCases.filter { $0 != .awake && (column[$0] ?? 0) > 0 }
            guard covered > 0, !shown.isEmpty else { continue }
            let index = first + offset
            let range = layout.columnRange(index, length: length)
            let x = max(layout.x(range.lowerBound), layout.x(summary.startWall))
            let width = max(1, min(layout.x(range.upperBound), layout.x(summary.startWall + summary.aliveMicros)) - x)
            let parts = TimelineSegment.Kind.allCases.compactMap { kind in
                column[kind].map { "\(kindName(kind)) \(SurvivalReportFormat.duration($0))" }
            }
            svg.open("g", title: "\(columnLabel(index)): " + parts.joined(separator: ", "))
            var y = laneTop
            for kind in shown {
                // A short stall in a day still shows: at least 2 pixels.
                let height = max(kind == .suspended ? 1 : 2, laneHeight * Double(column[kind] ?? 0) / Double(covered))
                svg.rect(x: x, y: y, width: width, height: height, cls: kindClass(kind))
                y += height
            }
            svg.close("g")
        }
        // Wakes: counted per column and cause.
        var counts: [Int: [WakeClass: [SystemWake]]] = [:]
        for wake in summary.wakes ?? [] {
            counts[layout.column(of: summary.startWall + wake.startOffsetMicros, length: length), default: [:]][WakeClass(wake), default: []].append(wake)
        }
        for (index, byCause) in counts.sorted(by: { $0.key < $1.key }) {
            let range = layout.columnRange(index, length: length)
            let columnWidth = layout.x(range.upperBound) - layout.x(range.lowerBound)
            for (cause, wakes) in byCause.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                let x = layout.x(range.lowerBound) + columnWidth * (0.5 + 0.3 * Double(cause.rawValue - 1))
                var title = "\(columnLabel(index)): \(wakes.count) wake\(wakes.count == 1 ? "" : "s") \(cause.phrase)"
                let strategies = Dictionary(grouping: wakes, by: { $0.alarmStrategy ?? $0.missedAlarm ?? $0.kernelSource ?? "unknown" })
                    .map { (name: $0.key, count: $0.value.count) }
                    .sorted { ($0.count, $1.name) > ($1.count, $0.name) }
                title += " (" + strategies.prefix(6).map { "\($0.name) \($0.count)" }.joined(separator: ", ") + (strategies.count > 6 ? ", ..." : "") + ")"
                wakeMark(cause, x: x, y: wakeRowY, radius: min(5, 2.5 + Double(wakes.count).squareRoot() / 2), title: title, into: &svg)
            }
        }
    }

    /// One strategy lane: when its leases were held; in columns, each
    /// column's height is the share of the run's time in it that they were.
    static func drawHeld(_ held: [StrategyHeld], title: String, summary: RunSummary, layout: SurvivalPictureLayout,
                         top: Double, dates: (Int64) -> String, columnLabel: (Int) -> String, into svg: inout SVGText) {
        switch layout.resolution {
        case .exact:
            for strategy in held {
                for span in strategy.spans {
                    let start = summary.startWall + span.startOffsetMicros
                    let x = layout.x(start)
                    let width = max(1, layout.x(start + span.durationMicros) - x)
                    svg.rect(x: x, y: top, width: width, height: strategyHeight, cls: "held",
                             title: "\(strategy.strategy) (\(strategy.holds.joined(separator: ", "))) held leases \(dates(start)) → \(dates(start + span.durationMicros)) (\(SurvivalReportFormat.duration(span.durationMicros)); heartbeats \(span.firstSeq)–\(span.lastSeq))")
                }
            }
        case .columns(let length):
            let spans = held.flatMap(\.spans).map { (key: 0, start: summary.startWall + $0.startOffsetMicros, duration: $0.durationMicros) }
            let (first, heldMicros) = layout.sums(spans, length: length)
            let (runFirst, alive) = layout.sums([(key: 0, start: summary.startWall, duration: summary.aliveMicros)], length: length)
            for (offset, column) in heldMicros.enumerated() {
                let index = first + offset
                guard let micros = column[0], micros > 0, index - runFirst >= 0, index - runFirst < alive.count,
                      let covered = alive[index - runFirst][0], covered > 0 else { continue }
                let share = min(1, Double(micros) / Double(covered))
                let range = layout.columnRange(index, length: length)
                let x = max(layout.x(range.lowerBound), layout.x(summary.startWall))
                let width = max(1, min(layout.x(range.upperBound), layout.x(summary.startWall + summary.aliveMicros)) - x)
                let height = max(1, strategyHeight * share)
                svg.rect(x: x, y: top + strategyHeight - height, width: width, height: height, cls: "held",
                         title: "\(title) held leases \(SurvivalReportFormat.duration(micros)) of \(columnLabel(index)) (\(Int((share * 100).rounded()))%)")
            }
        }
    }

    // MARK: pieces

    enum WakeClass: Int {
        case alarm = 1, other, missed

        var phrase: String {
            switch self {
            case .alarm: "by Vigil alarms"
            case .other: "by something else"
            case .missed: "by something else, a Vigil alarm missed"
            }
        }

        init(_ wake: SystemWake) {
            switch wake.cause {
            case .vigilAlarm: self = .alarm
            case .other: self = wake.missedAlarm == nil ? .other : .missed
            }
        }
    }

    /// A circle for a Vigil alarm, a diamond for anything else, a triangle
    /// for a Vigil alarm that missed its wake.
    static func wakeMark(_ cause: WakeClass, x: Double, y: Double, radius r: Double, title: String? = nil, into svg: inout SVGText) {
        switch cause {
        case .alarm:
            svg.circle(cx: x, cy: y, r: r, cls: "wa", title: title)
        case .other:
            svg.path("M\(n(x)) \(n(y - r))l\(n(r)) \(n(r))l-\(n(r)) \(n(r))l-\(n(r)) -\(n(r))z", cls: "wo", title: title)
        case .missed:
            svg.path("M\(n(x)) \(n(y - r))l\(n(r)) \(n(2 * r))h-\(n(2 * r))z", cls: "wm", title: title)
        }
    }

    static func kindClass(_ kind: TimelineSegment.Kind) -> String {
        switch kind {
        case .awake: "aw"
        case .suspended: "su"
        case .stalled: "st"
        case .unwritable: "un"
        }
    }

    static func kindName(_ kind: TimelineSegment.Kind) -> String {
        switch kind {
        case .awake: "awake"
        case .suspended: "suspended"
        case .stalled: "frozen or stalled"
        case .unwritable: "store unwritable"
        }
    }

    /// How the run ended, as the text report says it.
    static func endLabel(_ run: RunSummary, nowWall: Int64) -> String {
        guard run.endReason == .running else { return run.endReason.rawValue }
        return SurvivalReportFormat.isSilent(run, nowWall: nowWall) ? "running?" : "running"
    }

    static func runTitle(_ run: RunSummary, dates: (Int64) -> String) -> String {
        var title = "run \(run.runId), pid \(run.pid), vigil \(run.version), heartbeat every \(SurvivalReportFormat.interval(run.intervalMicros))\n"
        title += "\(dates(run.startWall)) → \(dates(run.endWall ?? run.lastHeartbeatWall)) \(run.endReason.rawValue)\n"
        title += "alive \(SurvivalReportFormat.duration(run.aliveMicros)), awake \(SurvivalReportFormat.duration(run.awakeMicros)), suspended \(SurvivalReportFormat.duration(run.suspendedMicros)) (\(run.suspends)×), stalls \(run.stalls)"
        return title
    }

    static func truncated(_ text: String, _ count: Int) -> String {
        text.count <= count ? text : String(text.prefix(count - 1)) + "…"
    }

    /// Names column `index`: "2025-03-04" for a day, "2025-03-04 06:00–09:00"
    /// for hours, "week of 2025-03-04".
    static func columnLabeler(_ layout: SurvivalPictureLayout, timeZone: TimeZone) -> (Int) -> String {
        guard case .columns(let length) = layout.resolution else { return { "\($0)" } }
        let day = wallFormatter(timeZone, "yyyy-MM-dd")
        let hour = wallFormatter(timeZone, "yyyy-MM-dd HH:mm")
        let time = wallFormatter(timeZone, "HH:mm")
        return { index in
            let range = layout.columnRange(index, length: length)
            switch length {
            case SurvivalPictureLayout.day: return day(range.lowerBound)
            case 7 * SurvivalPictureLayout.day: return "week of " + day(range.lowerBound)
            default: return hour(range.lowerBound) + "–" + time(range.upperBound)
            }
        }
    }

    /// A formatter of wall µs in `timeZone`.
    static func wallFormatter(_ timeZone: TimeZone, _ format: String) -> (Int64) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        formatter.dateFormat = format
        return { formatter.string(from: Date(timeIntervalSince1970: Double($0) / 1_000_000)) }
    }

    /// A coordinate with at most one decimal: short files.
    static func n(_ value: Double) -> String {
        let tenths = Int((value * 10).rounded())
        return tenths % 10 == 0 ? "\(tenths / 10)" : "\(tenths < 0 && tenths > -10 ? "-" : "")\(tenths / 10).\(abs(tenths % 10))"
    }

    // MARK: totals

    /// The figures of the text report, one row per run (oldest first) and a total.
    static func totalsTable(_ runs: [RunSummary], dates: (Int64) -> String) -> String {
        let d = SurvivalReportFormat.duration
        var out = "<table>\n<tr><th>run</th><th>start</th><th>end</th><th>ended</th><th>alive</th><th>awake</th>"
        out += "<th>suspended</th><th>stalls</th><th>longest stall</th><th>store unwritable</th><th>heartbeats</th><th>events</th><th>wakes</th></tr>\n"
        func row(_ cells: [String], classes: [Int: String] = [:], rowClass: String? = nil) -> String {
            (rowClass.map { "<tr class=\"\($0)\">" } ?? "<tr>")
                + cells.enumerated().map { index, cell in
                    (classes[index].map { "<td class=\"\($0)\">" } ?? "<td>") + XMLText.escaped(cell) + "</td>"
                }.joined() + "</tr>\n"
        }
        func wakes(_ run: RunSummary) -> Int { run.wakes?.count ?? 0 }
        for run in runs {
            out += row([
                String(run.runId.prefix(18)), dates(run.startWall), run.endWall.map(dates) ?? "now",
                run.endReason.rawValue, d(run.aliveMicros), d(run.awakeMicros),
                "\(d(run.suspendedMicros)) (\(run.suspends)×)", "\(run.stalls)", d(run.longestStallMicros),
                run.unwritableGaps == 0 ? "0s" : "\(d(run.unwritableMicros)) (\(run.unwritableGaps)×)",
                "\(run.heartbeats)", "\(run.events)", "\(wakes(run))",
            ], classes: [1: "text", 2: "text", 3: "text " + run.endReason.rawValue])
        }
        func sum(_ value: (RunSummary) -> Int64) -> Int64 { runs.reduce(0) { $0 + value($1) } }
        func count(_ value: (RunSummary) -> Int) -> Int { runs.reduce(0) { $0 + value($1) } }
        let ends = RunEndReason.allCases.compactMap { reason -> String? in
            let n = runs.filter { $0.endReason == reason }.count
            return n == 0 ? nil : "\(n) \(reason.rawValue)"
        }
        out += row([
            "total: \(runs.count) run\(runs.count == 1 ? "" : "s")", runs.map(\.startWall).min().map(dates) ?? "",
            runs.map { $0.endWall ?? $0.lastHeartbeatWall }.max().map(dates) ?? "", ends.joined(separator: ", "),
            d(sum(\.aliveMicros)), d(sum(\.awakeMicros)), "\(d(sum(\.suspendedMicros))) (\(count(\.suspends))×)",
            "\(count(\.stalls))", d(runs.map(\.longestStallMicros).max() ?? 0),
            count(\.unwritableGaps) == 0 ? "0s" : "\(d(sum(\.unwritableMicros))) (\(count(\.unwritableGaps))×)",
            "\(count(\.heartbeats))", "\(count(\.events))", "\(count(wakes))",
        ], classes: [1: "text", 2: "text", 3: "text"], rowClass: "total")
        return out + "</table>\n"
    }
}

/// An SVG body being written; every string that goes in is escaped here.
struct SVGText {
    var out = ""

    mutating func rect(x: Double, y: Double, width: Double, height: Double, cls: String, title: String? = nil) {
        element("rect", #"x="\#(SurvivalPictureFormat.n(x))" y="\#(SurvivalPictureFormat.n(y))" width="\#(SurvivalPictureFormat.n(width))" height="\#(SurvivalPictureFormat.n(height))" class="\#(cls)""#, title: title)
    }

    mutating func circle(cx: Double, cy: Double, r: Double, cls: String, title: String? = nil) {
        element("circle", #"cx="\#(SurvivalPictureFormat.n(cx))" cy="\#(SurvivalPictureFormat.n(cy))" r="\#(SurvivalPictureFormat.n(r))" class="\#(cls)""#, title: title)
    }

    mutating func path(_ d: String, cls: String, title: String? = nil) {
        element("path", #"d="\#(d)" class="\#(cls)""#, title: title)
    }

    mutating func line(x1: Double, y1: Double, x2: Double, y2: Double, cls: String) {
        element("line", #"x1="\#(SurvivalPictureFormat.n(x1))" y1="\#(SurvivalPictureFormat.n(y1))" x2="\#(SurvivalPictureFormat.n(x2))" y2="\#(SurvivalPictureFormat.n(y2))" class="\#(cls)""#, title: nil)
    }

    mutating func text(x: Double, y: Double, _ content: String, cls: String?) {
        out += #"<text x="\#(SurvivalPictureFormat.n(x))" y="\#(SurvivalPictureFormat.n(y))""# + (cls.map { #" class="\#($0)""# } ?? "") + ">" + XMLText.escaped(content) + "</text>\n"
    }

    mutating func open(_ name: String, title: String?) {
        out += "<\(name)>"
        if let title { out += "<title>" + XMLText.escaped(title) + "</title>" }
    }

    mutating func close(_ name: String) {
        out += "</\(name)>\n"
    }

    private mutating func element(_ name: String, _ attributes: String, title: String?) {
        if let title {
            out += "<\(name) \(attributes)><title>" + XMLText.escaped(title) + "</title></\(name)>\n"
        } else {
            out += "<\(name) \(attributes)/>\n"
        }
    }
}
