import ArgumentParser
import Foundation
import VigilCommon
import VigilDBus

/// `vigilctl status`: the running host at a glance, from its D-Bus properties.
struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show the running vigild: version, run, uptime, backends, strategies and leases.",
        discussion: """
            Reads the properties of org.vigil.Vigil1.Host on /org/vigil/Vigil1 and the \
            strategy list. Alive is this run's survival time (SurvivalSeconds: boottime since \
            the run started, suspends included).

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus.
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Flag(help: "Print one JSON object instead of text.")
    var json = false

    /// The figures `status` shows, also its JSON form.
    struct Status: Codable {
        var version: String
        var runId: String
        /// Microseconds since the Unix epoch.
        var startedAt: UInt64
        var survivalSeconds: UInt64
        var powerBackend: String
        var powerBackendReason: String
        var wakeClock: String
        var wakeClockReason: String
        var canWakeSystem: Bool
        var configPath: String
        var strategies: Int
        /// Strategy count per state (`running`, `backoff`, ...).
        var strategyStates: [String: Int]
        var leases: Int
        var bus: String
        /// False while vigild cannot write its survival store (full or failing disk).
        var storeWritable: Bool
        /// Log lines vigild could not write (stderr full or closed) since it started.
        var droppedLogLines: UInt64
    }

    func run() async throws {
        try await runReporting("status") {
            let (host, strategies, bus) = try await VigilBusClient.with(busOptions) { client in
                (try await client.host(), try await client.strategies(), client.busDescription)
            }
            let status = Status(
                version: host.version,
                runId: host.runId,
                startedAt: host.startedAt,
                survivalSeconds: host.survivalSeconds,
                powerBackend: host.powerBackend,
                powerBackendReason: host.powerBackendReason,
                wakeClock: host.wakeClock,
                wakeClockReason: host.wakeClockReason,
                canWakeSystem: host.canWakeSystem,
                configPath: host.configPath,
                strategies: strategies.count,
                strategyStates: Dictionary(strategies.map { ($0.state, 1) }, uniquingKeysWith: +),
                leases: host.leases.count,
                bus: bus,
                storeWritable: host.storeWritable,
                droppedLogLines: host.droppedLogLines
            )
            if json {
                print(try jsonText(status))
            } else {
                print(Self.text(status, now: TableFormat.nowMicros()), terminator: "")
            }
        }
    }

    static func text(_ s: Status, now: UInt64) -> String {
        let states = s.strategyStates.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
        func withReason(_ value: String, _ reason: String) -> String { reason.isEmpty ? value : "\(value) (\(reason))" }
        var rows: [(String, String)] = [
            ("run id", s.runId),
            ("started", s.startedAt == 0 ? "-" : "\(TableFormat.wallClock(micros: s.startedAt)) (\(TableFormat.relative(micros: s.startedAt, now: now)))"),
            ("alive", TableFormat.duration(micros: s.survivalSeconds * 1_000_000)),
            ("power backend", withReason(s.powerBackend, s.powerBackendReason)),
            ("wake clock", withReason(s.wakeClock, s.wakeClockReason)),
            ("can wake system", s.canWakeSystem ? "yes" : "no"),
            ("config", s.configPath),
            ("strategies", s.strategies == 0 ? "0" : "\(s.strategies) (\(states))"),
            ("leases", "\(s.leases) active"),
            ("survival store", s.storeWritable ? "writable" : "UNWRITABLE: heartbeats are not being recorded (see vigild's log)"),
        ]
        if s.droppedLogLines > 0 { rows.append(("log", "\(s.droppedLogLines) line\(s.droppedLogLines == 1 ? "" : "s") dropped (stderr full or closed)")) }
        if let note = TableFormat.displayZone.note { rows.append(("note", note)) }
        return "vigild \(TerminalText.escaped(s.version)) on \(TerminalText.escaped(s.bus))\n" + TableFormat.fields(rows)
    }
}
