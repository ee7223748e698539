import ArgumentParser
import Foundation

/// `vigilctl strategies`: each configured strategy and how it is doing.
struct StrategiesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "strategies",
        abstract: "Show each strategy vigild runs: kind, state, restarts, last error and what it cost.",
        discussion: """
            States: running; backoff (its run failed and it waits to be restarted); finished \
            (its run returned, so it is not restarted); stopped (the host stopped it); waiting \
            (its when conditions do not hold; WAITING FOR names the false ones). \
            Restarts counts restarts after failures; the last error is the newest error of the strategy or one of its leases, and how long ago it was set, until the strategy recovers.

            What each strategy cost since vigild started (its D-Bus cost properties): SLEEP HELD and \
            IDLE HELD, the time its leases held sleep and idle off; WAKEUPS, the wake scheduler's timer \
            expirations that fired its requests; SYS WAKES, system resumes by its alarms; CPU, user plus \
            system time of its commands and hooks; SENT and RECEIVED, the bytes of its connections and \
            downloads. Over past runs: vigilctl cost.

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus.
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Flag(help: "Print a JSON array instead of a table.")
    var json = false

    func run() async throws {
        try await runReporting("strategies") {
            let strategies = try await VigilBusClient.with(busOptions) { try await $0.strategies() }
            if json {
                printLine(try jsonText(strategies))
            } else {
                printLine(Self.table(strategies), terminator: "")
            }
        }
    }

    static func table(_ strategies: [ListedStrategy]) -> String {
        guard !strategies.isEmpty else { return "No strategies configured.\n" }
        typealias C = TableFormat.Column
        // The column appears only when a strategy waits for its conditions.
        guard strategies.contains(where: { !($0.waitingFor ?? "").isEmpty }) else {
            return TableFormat.table(
                [C("NAME"), C("KIND"), C("STATE"), C("RESTARTS", .right)] + CostColumns.columns + [C("LAST ERROR")],
                strategies.map { [$0.name, $0.kind, $0.state, String($0.restarts)] + CostColumns.cells($0.cost) + [$0.lastErrorCell] })
        }
        return TableFormat.table(
            [C("NAME"), C("KIND"), C("STATE"), C("RESTARTS", .right)] + CostColumns.columns + [C("LAST ERROR"), C("WAITING FOR")],
            strategies.map {
                [$0.name, $0.kind, $0.state, String($0.restarts)] + CostColumns.cells($0.cost)
                    + [$0.lastErrorCell, TableFormat.cell($0.waitingFor ?? "")]
            })
    }
}
