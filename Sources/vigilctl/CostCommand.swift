import ArgumentParser
import Foundation
import VigilCommon
import VigilSurvival
import VigilKit

/// `vigilctl cost`: what each strategy cost over a period, from the survival
/// log (no running host needed): "what kept this machine awake".
struct CostCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cost",
        abstract: "Show what each strategy cost over a period: what kept this machine awake.",
        discussion: """
            Reads the survival log (SQLite, opened read-only), where each run keeps what each \
            strategy cost in it as of its last heartbeat, and sums the runs alive in the period. \
            Most time holding sleep off first.

            SLEEP HELD and IDLE HELD: the time the strategy's leases held sleep and idle off (block \
            holds; with power backend none, the time they asked to). WAKEUPS: the wake scheduler's \
            timer expirations that fired its requests (one shared by two strategies counts for \
            each). SYS WAKES: system resumes by its wake_system alarms. CPU: user plus system time \
            of its commands and hooks. SENT and RECEIVED: bytes of its connections (voip-socket) and \
            downloads (download-session). RUNS: runs in which it cost anything. `client` is the \
            leases of D-Bus clients (vigilctl hold, BeginBackgroundTask), `inhibit` apps' inhibit requests.

            --since takes a time ("2026-11-20", "2026-11-20 09:00", local time) or how long ago \
            ("24h", "7d"). Runs recorded by a vigild that kept no costs are counted and left out. \
            See docs/vigilctl.md and docs/metrics.md.

            APPS: per app (an inhibit's application name, a client lease's name), requests refused \
            (a deny rule, an allow list, a spent app_budget) and leases that expired at their cap or \
            budget, summed over the same runs (docs/desktop-integration.md).
            """
    )

    @OptionGroup var storeOptions: StoreOptions

    @Option(help: ArgumentHelp("Only runs alive at or after this time, or this long ago (24h, 7d); default: every run.", valueName: "when"))
    var since: String?

    @Flag(help: "Print the report as JSON instead of a table.")
    var json = false


    func validate() throws {
        if let since { _ = try Self.sinceWallMicros(since, nowMicros: 0) }
    }

    func run() throws {
        let sinceMicros = try since.map { try Self.sinceWallMicros($0, nowMicros: Int64(clamping: TableFormat.nowMicros())) }
        let report = try storeOptions.read(for: "cost") { path in try CostReport.load(path: path, sinceWallMicros: sinceMicros) }
        if json {
            print(try jsonText(report))
        } else {
            print(Self.text(report), terminator: "")
            if !report.apps.isEmpty { print(Self.appsText(report.apps), terminator: "") }
        }
    }

    /// Refusals and expiries per app over the period.
    static func appsText(_ apps: [CostReport.App]) -> String {
        "\nApps refused and expired:\n" + TableFormat.table(
            [TableFormat.Column("APP"), TableFormat.Column("REFUSED", .right), TableFormat.Column("EXPIRED", .right), TableFormat.Column("RUNS", .right)],
            apps.map { [TableFormat.cell($0.app), String($0.refused), String($0.expired), String($0.runs)] })
    }

    static func text(_ report: CostReport) -> String {
        let period = report.sinceWallMicros.map { "since \(TableFormat.wallClock(micros: UInt64(clamping: $0)))" } ?? "over every run"
        var out = "What each strategy cost \(period): \(report.runs) run\(report.runs == 1 ? "" : "s")"
        if report.runsWithoutCost > 0 {
            out += " (\(report.runsWithoutCost) recorded before costs were kept, not counted)"
        }
        out += "\n"
        guard !report.strategies.isEmpty else { return out + "No strategy cost anything.\n" }
        return out + TableFormat.table(
            [TableFormat.Column("STRATEGY")] + CostColumns.columns + [TableFormat.Column("RUNS", .right)],
            report.strategies.map { [$0.strategy] + CostColumns.cells($0.cost) + [String($0.runs)] })
    }

    /// `--since` as `vigilctl survival` reads it (``SurvivalSince``), in the display zone.
    static func sinceWallMicros(_ text: String, nowMicros: Int64) throws -> Int64 {
        do {
            return try SurvivalSince.wallMicros(text, nowWall: nowMicros, timeZone: TableFormat.displayZone.zone)
        } catch {
            throw ValidationError("--since: \(error)")
        }
    }
}
