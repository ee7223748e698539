import ArgumentParser
import Foundation
import VigilDBus
import VigilCommon

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

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus.
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Option(name: .customLong("logind-bus"), help: ArgumentHelp(
        "The bus logind is on: system (the default: $DBUS_SYSTEM_BUS_ADDRESS, else the standard socket) or a D-Bus address.",
        valueName: "bus"))
    var logindBus: String = "system"

    @Flag(help: "Print a JSON array instead of text.")
    var json = false

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
    }

    func validate() throws {
        guard logindBus == "system" || BusSelection.isValidAddress(logindBus) else {
            throw ValidationError("--logind-bus must be system or a D-Bus address, got \"\(logindBus)\"")
        }
    }

    func run() async throws {
        try await runReporting("inhibitors") {
            let (leases, hostPID) = try await VigilBusClient.with(busOptions) { client in
                (try await client.leases(), try? await client.hostPID())
            }
            var holders = leases.sorted { $0.id < $1.id }.map(Self.holder)
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
        let rows = holders.map { h in
            [h.source, h.lease.map(String.init) ?? "-", TableFormat.cell(h.who), TableFormat.cell(h.what), h.mode,
             h.uid.map(String.init) ?? "-", h.pid.map(String.init) ?? "-", TableFormat.cell(h.via), TableFormat.cell(h.why)]
        }
        return TableFormat.table(
            [C("SOURCE"), C("LEASE", .right), C("WHO"), C("WHAT"), C("MODE"), C("UID", .right), C("PID", .right), C("VIA"), C("WHY")], rows)
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
