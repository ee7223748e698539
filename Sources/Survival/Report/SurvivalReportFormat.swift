import Foundation
import VigilCommon
import VigilKit

/// Renders survival summaries for a terminal (`text`) or for tools (`json`).
public enum SurvivalReportFormat {
    /// Bar characters of the timeline, also printed as its legend.
    public static func symbol(_ kind: TimelineSegment.Kind) -> Character {
        switch kind {
        case .awake: "="
        case .suspended: "z"
        case .stalled: "!"
        case .unwritable: "#"
        }
    }

    /// A report for people: per run, a header, the figures, and a one-line
    /// timeline bar scaled to the run's alive time, followed by how it ended.
    /// `width` is the terminal width in columns (at least 40 is used).
    public static func text(_ runs: [RunSummary], width: Int) -> String {
        let display = DisplayTimeZone.resolve()
        return text(runs, width: width, nowWall: Int64(Date().timeIntervalSince1970 * 1_000_000), timeZone: display.zone, note: display.note)
    }

    /// `text` with the clock and time zone given (for tests).
    public static func text(_ runs: [RunSummary], width: Int, nowWall: Int64, timeZone: TimeZone, note: String? = nil) -> String {
        let width = max(width, 40)
        guard !runs.isEmpty else { return "No runs recorded in the survival log.\n" }
        let noteLine = note.map { "Note: \($0).\n" } ?? ""
        let dates = DateFormatter()
        dates.locale = Locale(identifier: "en_US_POSIX")
        dates.timeZone = timeZone
        dates.dateFormat = "yyyy-MM-dd HH:mm:ss"
        func wall(_ micros: Int64) -> String {
            dates.string(from: Date(timeIntervalSince1970: Double(micros) / 1_000_000))
        }

        var out = "Survival log: \(runs.count) run\(runs.count == 1 ? "" : "s"), newest first.\n" + noteLine
        out += "Timeline: [\(symbol(.awake))] awake  [\(symbol(.suspended))] suspended  [\(symbol(.stalled))] frozen/stalled  [\(symbol(.unwritable))] store unwritable; one bar per run, scaled to its alive time.\n"
        for run in runs {
            out += "\n"
            out += "run \(run.runId)  pid \(run.pid)  vigil \(run.version)  heartbeat every \(interval(run.intervalMicros))\n"
            let ending: String
            switch run.endReason {
            case .running:
                let silent = nowWall - run.lastHeartbeatWall
                ending = isSilent(run, nowWall: nowWall)
                    ? "now  running? no heartbeat since \(wall(run.lastHeartbeatWall)) (\(duration(silent)) ago)"
                    : "now  running (last heartbeat \(wall(run.lastHeartbeatWall)))"
            default:
                ending = "\(wall(run.endWall ?? run.lastHeartbeatWall))  \(run.endReason.rawValue)"
            }
            out += "  \(wall(run.startWall)) → \(ending)\n"
            if let note = run.endNote { out += "  \(note)\n" }
            var figures = "  alive \(duration(run.aliveMicros))  awake \(duration(run.awakeMicros))"
            figures += "  suspended \(duration(run.suspendedMicros))"
            if run.suspends > 0 { figures += " (\(run.suspends)×)" }
            figures += run.stalls == 0
                ? "  stalls 0"
                : "  stalls \(run.stalls), longest \(duration(run.longestStallMicros))"
            figures += "  heartbeats \(run.heartbeats)"
            if run.events > 0 { figures += "  events \(run.events)" }
            if run.unwritableGaps > 0 {
                figures += "  store unwritable \(duration(run.unwritableMicros)) (\(run.unwritableGaps)×)"
            }
            out += figures + "\n"
            let label = run.endReason.rawValue
            let cells = max(10, width - 5 - label.count)
            out += "  [\(bar(run.timeline, aliveMicros: run.aliveMicros, cells: cells))] \(label)\n"
            let wakes = run.wakes ?? []
            for wake in wakes.suffix(maxWakeLines) {
                out += "  woke \(wall(wake.wall)) after \(duration(wake.suspendedMicros)) suspended: \(wakeCause(wake))\n"
            }
            if wakes.count > maxWakeLines {
                out += "  (\(wakes.count - maxWakeLines) earlier wake\(wakes.count - maxWakeLines == 1 ? "" : "s") not shown; --json lists all)\n"
            }
            let dark = run.darkWakes ?? []
            for wake in dark.suffix(maxWakeLines) {
                out += "  dark wake \(wall(wake.wall)): \(darkWake(wake))\n"
            }
            if dark.count > maxWakeLines {
                out += "  (\(dark.count - maxWakeLines) earlier dark wake\(dark.count - maxWakeLines == 1 ? "" : "s") not shown; --json lists all)\n"
            }
            let broken = run.brokenSleeps ?? []
            for sleep in broken.suffix(maxWakeLines) {
                out += "  SLEEP BROKE LEASES \(wall(sleep.wall)): \(brokenSleep(sleep))\n"
            }
            if broken.count > maxWakeLines {
                out += "  (\(broken.count - maxWakeLines) earlier broken sleep\(broken.count - maxWakeLines == 1 ? "" : "s") not shown; --json lists all)\n"
            }
        }
        return out
    }

    /// A running run whose last heartbeat is older than the stall
    /// threshold: it most likely died.
    static func isSilent(_ run: RunSummary, nowWall: Int64) -> Bool {
        nowWall - run.lastHeartbeatWall > GapRule(intervalMicros: run.intervalMicros).stallThresholdMicros
    }

    /// Wake lines shown per run (the newest); `--json` has all.
    static let maxWakeLines = 5

    /// What woke the system, for people: "Vigil alarm of tick periodic-wake,
    /// 400ms late" or "something else (pm_wakeup_irq 8)".
    public static func wakeCause(_ wake: SystemWake) -> String {
        switch wake.cause {
        case .vigilAlarm:
            let late = wake.latenessMicros ?? 0
            let when = late >= 0 ? "\(duration(late)) late" : "\(duration(-late)) early"
            return "Vigil alarm of \(wake.alarm ?? "?"), \(when)"
        case .other:
            var text = "woken by something else"
            if let source = wake.kernelSource { text += " (\(source))" }
            if let missed = wake.missedAlarm {
                text += "; Vigil alarm of \(missed) was due \(duration(wake.missedByMicros ?? 0)) earlier and did not wake it"
            }
            return text
        }
    }

    /// A dark wake for people: "woke for sync, asleep again after 9.2s" or
    /// "woke for sync, stayed awake: keys pressed". Stored strings are
    /// escaped for the terminal.
    public static func darkWake(_ wake: DarkWake) -> String {
        let what = TerminalText.escaped(wake.alarmStrategy ?? wake.alarm ?? "?")
        switch wake.outcome {
        case .asleepAgain:
            let work = wake.workEndedAfterMicros.map { ", work done after \(duration($0))" } ?? ""
            return "woke for \(what), asleep again after \(duration(wake.awakeMicros))\(work)"
        case .stayedAwake:
            return "woke for \(what), stayed awake: \(TerminalText.escaped(wake.reason ?? "?"))"
        }
    }

    /// A sleep that broke leases, for people.
    public static func brokenSleep(_ sleep: BrokenSleep) -> String {
        let leases = sleep.leases.prefix(4).map { "lease \($0.id) \(TerminalText.escaped($0.holder)) (\(TerminalText.escaped($0.name)))" }
            .joined(separator: ", ") + (sleep.leases.count > 4 ? ", …" : "")
        return "slept \(duration(sleep.sleptMicros)) (woken by \(TerminalText.escaped(sleep.wakeCause))) although \(leases) held sleep"
    }

    /// The runs as a JSON array of `RunSummary` (pretty, keys sorted).
    public static func json(_ runs: [RunSummary]) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        // Invariant: RunSummary holds only strings, integers, arrays and
        // enums with string raw values, which always encode.
        let data = (try? encoder.encode(runs)) ?? Data("[]".utf8)
        return String(decoding: data, as: UTF8.self) + "\n"
    }

    /// One character per cell; a suspension or stall takes at least one cell
    /// so short ones stay visible, and a stall wins a cell it shares.
    static func bar(_ timeline: [TimelineSegment], aliveMicros: Int64, cells: Int) -> String {
        var kinds = [TimelineSegment.Kind](repeating: .awake, count: cells)
        guard aliveMicros > 0 else { return String(repeating: symbol(.awake), count: cells) }
        let total = Int64(cells)
        for segment in timeline where segment.kind != .awake {
            let first = Int(min(total - 1, segment.startOffsetMicros * total / aliveMicros))
            let endCell = (segment.startOffsetMicros + segment.durationMicros) * total
            let last = Int(min(total - 1, max(Int64(first), (endCell + aliveMicros - 1) / aliveMicros - 1)))
            for i in first...last where kinds[i] != .stalled {
                kinds[i] = segment.kind
            }
        }
        return String(kinds.map { symbol($0) })
    }

    /// The heartbeat interval as configured: "60s", "1.5s", "2h 0m".
    static func interval(_ micros: Int64) -> String {
        guard micros < 3_600_000_000 else { return duration(micros) }
        if micros % 1_000_000 == 0 { return "\(micros / 1_000_000)s" }
        return "\(Double(micros) / 1_000_000)s"
    }

    /// A duration for people, as logs and vigilctl write it: "3d04h",
    /// "2h05m", "4m10s", "42s", "2.5s" (``DurationSyntax/human(_:)``).
    public static func duration(_ micros: Int64) -> String {
        DurationSyntax.human(.microseconds(micros))
    }
}
