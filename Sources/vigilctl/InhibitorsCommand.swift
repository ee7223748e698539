import ArgumentParser
import Foundation
import VigilDBus
import VigilCommon
import VigilClient
import VigilKit

/// `vigilctl inhibitors`: everything holding the machine awake, in one list:
/// vigild's leases (its strategies', clients' and apps' inhibits through the
/// freedesktop APIs) and logind's other inhibitors.
struct InhibitorsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inhibitors",
        abstract: "Show everything holding the machine awake: vigild's leases and logind's other inhibitors.",
        discussion: """
            vigild's leases come from ListLeases on org.vigil.Vigil1, with who asked, why and what \
            they hold (apps' inhibits through org.freedesktop.PowerManagement, org.freedesktop.ScreenSaver \
            or the Inhibit portal show the app, its uid and pid). Where logind runs, its inhibitors \
            (org.freedesktop.login1.Manager.ListInhibitors: who, why, what, mode, uid, pid) are listed \
            too, except those vigild itself holds for its leases. Without logind the list says so on \
            stderr and shows vigild's leases alone.

            Per app lease (an inhibit or a BeginBackgroundTask lease), RULE names the [host] app_max \
            and app_budget rules that apply, CAP LEFT the time left under the cap and BUDGET LEFT what \
            is left of the app's rolling 24-hour budget. Rules added live are listed below the table.

            Live control (root or vigild's uid only, like Reload): --release LEASE ends an app's \
            inhibit or a client's lease now; --deny PATTERN releases every held lease whose app name or \
            executable matches the shell pattern and refuses the app's next requests, for --for DURATION \
            or until vigild restarts; --allow PATTERN lifts a live deny of PATTERN and lets matching apps \
            in even where the config's inhibit_deny or inhibit_allow would not. Live rules last until \
            vigild restarts: to keep one, write it into [host] inhibit_deny or inhibit_allow.

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus or it refused.
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Option(name: .customLong("logind-bus"), help: ArgumentHelp(
        "The bus logind is on: system (the default: $DBUS_SYSTEM_BUS_ADDRESS, else the standard socket) or a D-Bus address.",
        valueName: "bus"))
    var logindBus: String = "system"

    @Flag(help: "Print a JSON array instead of text.")
    var json = false

    @Option(help: ArgumentHelp("End this lease (an app's inhibit or a client's lease) now.", valueName: "lease"))
    var release: UInt64?

    @Option(help: ArgumentHelp("Deny apps whose name or executable matches this shell pattern, releasing what they hold.", valueName: "pattern"))
    var deny: String?

    @Option(name: .customLong("for"), help: ArgumentHelp("With --deny: how long the deny lasts (e.g. 30m); default until vigild restarts.", valueName: "duration"))
    var denyFor: String?

    @Option(help: ArgumentHelp("Allow apps matching this shell pattern again (lifts a live --deny of it).", valueName: "pattern"))
    var allow: String?

    /// One holder, also the JSON form.
    struct Holder: Codable, Equatable {
        /// "vigil" or "logind".
        var source: String
        /// The lease id, for vigild's leases.
        var lease: UInt64?
        /// The strategy, app or program that holds it.
        var who: String
        var what: String
        var why: String
        /// logind's mode ("block", "delay"); vigild's leases block.
        var mode: String
        var uid: UInt32?
        var pid: UInt32?
        /// How it came to vigild: a strategy kind, "client" or "inhibit" (with the interface).
        var via: String
        /// The app_max and app_budget rules that apply to an app's lease.
        var rule: String? = nil
        /// Microseconds left under the cap and of the app's budget.
        var capLeftUsec: Int64? = nil
        var budgetLeftUsec: Int64? = nil

        enum CodingKeys: String, CodingKey {
            case source, lease, who, what, why, mode, uid, pid, via, rule
            case capLeftUsec = "cap_left_usec", budgetLeftUsec = "budget_left_usec"
        }
    }

    func validate() throws {
        guard logindBus == "system" || BusSelection.isValidAddress(logindBus) else {
            throw ValidationError("--logind-bus must be system or a D-Bus address, got \"\(logindBus)\"")
        }
        let actions = [release != nil, deny != nil, allow != nil].filter { $0 }.count
        guard actions <= 1 else { throw ValidationError("give one of --release, --deny and --allow at a time") }
        if denyFor != nil, deny == nil { throw ValidationError("--for goes with --deny") }
        if let denyFor, case .failure(let error) = DurationSyntax.parse(denyFor) {
            throw ValidationError("--for: \(error.message)")
        }
        if let denyFor, case .success(let value) = DurationSyntax.parse(denyFor), value < .seconds(1) {
            throw ValidationError("--for must be at least 1s, got \"\(TerminalText.escaped(denyFor))\"")
        }
    }

    /// --release, --deny or --allow, when given: what vigild did, as one line.
    func control(_ client: VigilBusClient) async throws -> String? {
        if let release {
            try await client.mapped(VigilAPI.Host.releaseLease.name) { try await client.client.releaseLease(release) }
            return "released lease \(release)"
        }
        if let deny {
            var micros: UInt64 = 0
            if let denyFor, case .success(let value) = DurationSyntax.parse(denyFor) { micros = UInt64(value.microseconds) }
            let released = try await client.mapped(VigilAPI.Host.denyApp.name) { try await client.client.denyApp(deny, forMicros: micros) }
            let span = denyFor.flatMap { if case .success(let d) = DurationSyntax.parse($0) { return "for \(d.vigilDescription)" } else { return nil } }
                ?? "until vigild restarts"
            return "denied \"\(deny)\" \(span); released \(released) held lease\(released == 1 ? "" : "s")"
        }
        if let allow {
            let lifted = try await client.mapped(VigilAPI.Host.allowApp.name) { try await client.client.allowApp(allow) }
            return "allowed \"\(allow)\" until vigild restarts\(lifted ? " (its deny is lifted)" : "")"
        }
        return nil
    }

    func run() async throws {
        try await runReporting("inhibitors") {
            if let done = try await VigilBusClient.with(busOptions, control) {
                printLine(TerminalText.escaped(done))
                return
            }
            let (leases, hostPID, policy) = try await VigilBusClient.with(busOptions) { client in
                (try await client.leases(), try? await client.hostPID(), try? await client.client.appPolicy())
            }
            let limits = Dictionary((policy?.leases ?? []).map { ($0.lease, $0) }, uniquingKeysWith: { a, _ in a })
            var holders = leases.sorted { $0.id < $1.id }.map { lease in
                var holder = Self.holder(lease)
                if let limit = limits[lease.id] {
                    holder.rule = limit.rule
                    holder.capLeftUsec = limit.capLeftUsec >= 0 ? limit.capLeftUsec : nil
                    holder.budgetLeftUsec = limit.budgetLeftUsec >= 0 ? limit.budgetLeftUsec : nil
                }
                return holder
            }
            do {
                holders += try await Self.logindInhibitors(bus: logindBus == "system" ? .system : .address(logindBus))
                    .filter { hostPID == nil || $0.pid != hostPID }
            } catch {
                FileHandle.standardError.write(Data("vigilctl inhibitors: logind's inhibitors are not listed: \(error)\n".utf8))
            }
            if json {
                printLine(try jsonText(holders))
            } else {
                printLine(Self.table(holders), terminator: "")
                if let rules = policy?.rules, !rules.isEmpty {
                    printLine(Self.liveRules(rules), terminator: "")
                }
            }
        }
    }

    static func holder(_ lease: ListedLease) -> Holder {
        let status = lease.status ?? [:]
        var via = lease.kind
        if let interface = status["Interface"] { via += " (\(interface))" }
        return Holder(
            source: "vigil", lease: lease.id, who: status["App"] ?? lease.strategy, what: lease.holds, why: lease.reason, mode: "block",
            uid: status["Uid"].flatMap { UInt32($0) }, pid: status["Pid"].flatMap { UInt32($0) }, via: via)
    }

    /// logind's `ListInhibitors`: `a(ssssuu)` what, who, why, mode, uid, pid.
    static func logindInhibitors(bus: DBusConnection.Bus) async throws -> [Holder] {
        let connection = try await DBusConnection.connect(to: bus)
        // Unstructured task: not cancelled: one close, which ends by itself (a defer cannot await).
        defer { Task { await connection.close() } }
        let reply = try await connection.call(
            destination: "org.freedesktop.login1", path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
            member: "ListInhibitors", arguments: [], timeout: .seconds(10))
        guard case .array(_, let rows)? = reply.body.first else { throw VigilctlFailure("logind's ListInhibitors answered \(reply.signature)") }
        return rows.compactMap { row -> Holder? in
            guard case .structure(let f) = row, f.count == 6, case .string(let what) = f[0], case .string(let who) = f[1],
                  case .string(let why) = f[2], case .string(let mode) = f[3], case .uint32(let uid) = f[4], case .uint32(let pid) = f[5]
            else { return nil }
            return Holder(source: "logind", lease: nil, who: who, what: what, why: why, mode: mode, uid: uid, pid: pid, via: "logind")
        }
    }

    static func table(_ holders: [Holder]) -> String {
        guard !holders.isEmpty else { return "Nothing holds the machine awake.\n" }
        typealias C = TableFormat.Column
        func left(_ usec: Int64?) -> String { usec.map { Duration.microseconds($0).vigilDescription } ?? "-" }
        let rows = holders.map { h -> [String] in
            let lease: String = h.lease.map { String($0) } ?? "-"
            let uid: String = h.uid.map { String($0) } ?? "-"
            let pid: String = h.pid.map { String($0) } ?? "-"
            let rule: String = TableFormat.cell(h.rule ?? "")
            var row: [String] = [h.source, lease, TableFormat.cell(h.who), TableFormat.cell(h.what), h.mode, uid, pid]
            row += [TableFormat.cell(h.via), rule, left(h.capLeftUsec), left(h.budgetLeftUsec), TableFormat.cell(h.why)]
            return row
        }
        return TableFormat.table(
            [C("SOURCE"), C("LEASE", .right), C("WHO"), C("WHAT"), C("MODE"), C("UID", .right), C("PID", .right), C("VIA"),
             C("RULE"), C("CAP LEFT", .right), C("BUDGET LEFT", .right), C("WHY")], rows)
    }

    /// The rules added live, one line each.
    static func liveRules(_ rules: [AppRuleRow]) -> String {
        var out = "\nLive rules (until vigild restarts unless timed):\n"
        for rule in rules {
            let span = rule.leftUsec >= 0 ? " (\(Duration.microseconds(rule.leftUsec).vigilDescription) left)" : ""
            out += "  \(rule.action) \"\(TerminalText.escaped(TableFormat.cell(rule.pattern)))\"\(span)\n"
        }
        return out
    }
}

extension VigilBusClient {
    /// The pid of the process that owns org.vigil.Vigil1.
    func hostPID() async throws -> UInt32 {
        try await connection.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "GetConnectionUnixProcessID", arguments: [Self.busName], returning: UInt32.self, timeout: timeout)
    }
}
