import ArgumentParser
import Foundation
import VigilCommon
import VigilSurvivalReport
import VigilKit
import VigilClient

/// `vigilctl cost`: what each strategy cost over a period, from the survival
/// log (no running host needed): "what kept this machine awake".
struct CostCommand: AsyncParsableCommand {
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

            --apps adds, from the running vigild (on --bus, as other commands find it), how many \
            requests of each app were refused (a deny rule, an allow list, a spent app_budget) and how \
            many of its leases expired at their cap or budget since that vigild started.
            """
    )

    @OptionGroup var storeOptions: StoreOptions

    @Option(help: ArgumentHelp("Only runs alive at or after this time, or this long ago (24h, 7d); default: every run.", valueName: "when"))
    var since: String?

    @Flag(help: "Print the report as JSON instead of a table.")
    var json = false

    @Flag(help: "Also show refused requests and expired leases per app, from the running vigild.")
    var apps = false

    @Option(help: ArgumentHelp("With --apps: the bus vigild is on: session, system, or a D-Bus address.", valueName: "bus"))
    var bus: String?

    /// The report with `--apps`, as JSON.
    struct WithApps: Encodable {
        var report: CostReport
        var apps: [AppCountRow]
    }

    func validate() throws {
        if let since { _ = try Self.sinceWallMicros(since, nowMicros: 0) }
    }

    func run() async throws {
        let sinceMicros = try since.map { try Self.sinceWallMicros($0, nowMicros: Int64(clamping: TableFormat.nowMicros())) }
        let report = try storeOptions.read(for: "cost") { path in try CostReport.load(path: path, sinceWallMicros: sinceMicros) }
        var appCounts: [AppCountRow]?
        if apps {
            try await runReporting("cost") {
                let options = try BusOptions.parse((bus.map { ["--bus", $0] } ?? []) + ["--state-dir", storeOptions.stateDir])
                appCounts = try await VigilBusClient.with(options) { client in
                    try await client.mapped("AppPolicy") { try await client.client.appPolicy() }.apps
                }
            }
        }
        if json {
            if let appCounts {
                print(try jsonText(WithApps(report: report, apps: appCounts)))
            } else {
                print(try jsonText(report))
            }
        } else {
            print(Self.text(report), terminator: "")
            if let appCounts { print(Self.appsText(appCounts), terminator: "") }
        }
    }

    /// Refusals and expiries per app since the running vigild started.
    static func appsText(_ apps: [AppCountRow]) -> String {
        let title = "\nApps since vigild started: refused requests and expired leases\n"
        guard !apps.isEmpty else { return title + "No app was refused and no app lease expired.\n" }
        return title + TableFormat.table(
            [TableFormat.Column("APP"), TableFormat.Column("REFUSED", .right), TableFormat.Column("EXPIRED", .right)],
            apps.map { [TableFormat.cell($0.app), String($0.refused), String($0.expired)] })
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
