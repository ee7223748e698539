import ArgumentParser
import Foundation
import VigilCommon
import VigilKit
import VigilDBus

/// `vigilctl leases`: the active leases, once or followed live.
struct LeasesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "leases",
        abstract: "Show the leases vigild holds now, or follow them as they change.",
        discussion: """
            A lease is something a strategy holds to keep the system up (a command run, a \
            stream, a connection). The table shows, per active lease: its id, strategy, what \
            it holds, why, how long it has been held, its deadline (a lease with a budget must \
            be renewed before it, or it expires), how often it was renewed, and its state \
            (active, or expiring while its expiration handler runs). Below the table, \
            the live status each strategy reports for its lease (an audio stream's sink and \
            state, a socket's peer and round-trip time) as KEY=VALUE pairs.

            --watch prints the table, then one line per lease signal (LeaseAcquired, \
            LeaseRenewed, LeaseExpiring, LeaseExpired, LeaseReleased) as vigild emits it; it \
            subscribes to the signals and never polls. It ends with status 1 when vigild leaves \
            the bus. With --json it prints one JSON object per line instead.

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus.
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Flag(help: "Follow lease signals and print each as it happens.")
    var watch = false

    @Flag(help: "Print JSON: an array of leases (with --watch, one object per line).")
    var json = false

    /// A lease in `--json` output: the ListLeases fields plus figures
    /// computed when printed.
    struct LeaseJSON: Codable {
        var lease: ListedLease
        /// Microseconds from acquisition to now.
        var ageUsec: UInt64
        /// Microseconds to the deadline (negative: overdue); nil without a budget.
        var remainingUsec: Int64?
        /// "listed" for the leases `--watch --json` prints before the events.
        var event: String?

        init(_ lease: ListedLease, now: UInt64, event: String? = nil) {
            self.lease = lease
            self.event = event
            ageUsec = now > lease.acquiredAt ? now - lease.acquiredAt : 0
            remainingUsec = lease.deadline == 0 ? nil : Int64(clamping: lease.deadline) - Int64(clamping: now)
        }

        func encode(to encoder: any Encoder) throws {
            try lease.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(ageUsec, forKey: .ageUsec)
            try container.encode(remainingUsec, forKey: .remainingUsec)
            try container.encodeIfPresent(event, forKey: .event)
        }

        init(from decoder: any Decoder) throws {
            lease = try ListedLease(from: decoder)
            let container = try decoder.container(keyedBy: Keys.self)
            ageUsec = try container.decode(UInt64.self, forKey: .ageUsec)
            remainingUsec = try container.decodeIfPresent(Int64.self, forKey: .remainingUsec)
            event = try container.decodeIfPresent(String.self, forKey: .event)
        }

        private enum Keys: String, CodingKey { case ageUsec, remainingUsec, event }
    }

    func run() async throws {
        try await runReporting("leases") {
            try await VigilBusClient.with(busOptions) { client in
                if watch {
                    try await follow(client)
                } else {
                    let leases = try await client.leases()
                    printListing(leases)
                }
            }
        }
    }

    private func printListing(_ leases: [ListedLease]) {
        let now = TableFormat.nowMicros()
        if json {
            let text = (try? jsonText(leases.map { LeaseJSON($0, now: now) })) ?? "[]"
            printLine(text)
        } else {
            printLine(Self.table(leases, now: now), terminator: "")
        }
    }

    static func table(_ leases: [ListedLease], now: UInt64) -> String {
        guard !leases.isEmpty else { return "No active leases.\n" }
        typealias C = TableFormat.Column
        let rows = leases.sorted { $0.id < $1.id }.map { lease -> [String] in
            [
                String(lease.id), lease.strategy, TableFormat.cell(lease.holds), TableFormat.cell(lease.reason),
                TableFormat.duration(micros: now > lease.acquiredAt ? now - lease.acquiredAt : 0),
                lease.deadline == 0 ? "-" : TableFormat.relative(micros: lease.deadline, now: now),
                String(lease.renewals), lease.state,
            ]
        }
        let table = TableFormat.table(
            [C("ID", .right), C("STRATEGY"), C("HOLDS"), C("REASON"), C("AGE", .right), C("DEADLINE"), C("RENEWALS", .right), C("STATE")],
            rows)
        // Each lease's live status (what its strategy reports), one line per lease.
        let statuses = leases.sorted { $0.id < $1.id }.compactMap { lease -> String? in
            guard let status = lease.status, !status.isEmpty else { return nil }
            return "  \(lease.id): " + status.keys.sorted().map { "\($0)=\(TableFormat.cell(status[$0] ?? ""))" }.joined(separator: " ")
        }
        return statuses.isEmpty ? table : table + "\nStatus:\n" + statuses.joined(separator: "\n") + "\n"
    }

    // MARK: - Watching

    /// One lease signal, as printed by `--watch --json`.
    struct LeaseEventJSON: Codable {
        var event: String
        /// Microseconds since the Unix epoch when vigilctl received it.
        var receivedAt: UInt64
        var lease: String
        var id: UInt64?
        var strategy: String?
        var holds: String?
        var reason: String?
        var deadline: UInt64?
        var remainingUsec: UInt64?
        var forced: Bool?
    }

    private func follow(_ client: VigilBusClient) async throws {
        // Subscribe before listing, so no change falls between the two.
        let leaseSignals = try await client.connection.signals(matching: DBusMatchRule(
            sender: VigilBusClient.busName, path: VigilBusClient.rootPath, interface: VigilBusClient.hostInterface))
        let ownerChanges = try await client.connection.signals(matching: DBusMatchRule(
            sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        let leases = try await client.leases()
        if json {
            for lease in leases.sorted(by: { $0.id < $1.id }) {
                printLine((try? jsonLine(LeaseJSON(lease, now: TableFormat.nowMicros(), event: "listed"))) ?? "{}")
            }
        } else {
            printListing(leases)
            printLine("Watching lease signals on \(client.busDescription) (Ctrl-C to stop).")
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await signal in ownerChanges {
                    guard signal.body.first == .string(VigilBusClient.busName),
                          signal.body.count == 3, signal.body[2] == .string("") else { continue }
                    throw VigilctlFailure("vigild left \(client.busDescription)")
                }
            }
            group.addTask {
                for await signal in leaseSignals {
                    guard let member = signal.member, member.hasPrefix("Lease") else { continue }
                    let event = await describe(member, signal.body, client: client)
                    if json {
                        printLine((try? jsonLine(event)) ?? "{}")
                    } else {
                        printLine(Self.line(event))
                    }
                }
                throw VigilctlFailure("lost the connection to \(client.busDescription)")
            }
            try await group.next()
            group.cancelAll()
        }
    }

    /// A lease signal as the contract's row (``HostSignal``); one whose
    /// arguments are not the declared ones shows only its name.
    private func describe(_ member: String, _ body: [BusValue], client: VigilBusClient) async -> LeaseEventJSON {
        let signal = try? HostSignal(member: member, body: body)
        var event = LeaseEventJSON(event: member.dropFirst("Lease".count).lowercased(), receivedAt: TableFormat.nowMicros(), lease: "")
        switch signal {
        case .leaseAcquired(let acquired)?:
            event.lease = acquired.lease
            event.strategy = acquired.strategy
            event.holds = acquired.holds
            // The reason and deadline are lease properties; the object may
            // already be gone for a very short lease.
            if let lease = try? await client.client.properties(of: acquired.lease, interface: VigilBusClient.leaseInterface,
                                                               as: LeaseObjectRow.self) {
                event.reason = lease.lease.reason
                if lease.lease.deadline != 0 { event.deadline = lease.lease.deadline }
            }
        case .leaseRenewed(let renewed)?: (event.lease, event.deadline) = (renewed.lease, renewed.deadline)
        case .leaseExpiring(let expiring)?: (event.lease, event.remainingUsec) = (expiring.lease, expiring.remainingUsec)
        case .leaseExpired(let expired)?: (event.lease, event.forced) = (expired.lease, expired.forced)
        case .leaseReleased(let released)?: (event.lease, event.reason) = (released.lease, released.reason)
        case .strategyStateChanged?, nil: break
        }
        event.id = event.lease.split(separator: "/").last.flatMap { UInt64($0) }
        return event
    }

    /// One event line: time, event, lease id, then its details.
    static func line(_ e: LeaseEventJSON, timeZone: TimeZone = .current) -> String {
        let time = TableFormat.timeOfDay(Date(timeIntervalSince1970: Double(e.receivedAt) / 1_000_000), timeZone: timeZone)
        var parts = [time, e.event.padding(toLength: 8, withPad: " ", startingAt: 0), "lease \(e.id.map(String.init) ?? e.lease)"]
        if let strategy = e.strategy { parts.append("strategy \(strategy)") }
        if let holds = e.holds { parts.append("holds \"\(holds)\"") }
        if let reason = e.reason, !reason.isEmpty { parts.append(e.event == "released" ? "because \"\(reason)\"" : "for \"\(reason)\"") }
        if let deadline = e.deadline { parts.append("deadline \(TableFormat.relative(micros: deadline, now: e.receivedAt))") }
        if let remaining = e.remainingUsec { parts.append("\(TableFormat.duration(micros: remaining)) of grace left") }
        if e.forced == true { parts.append("force-released: its expiration handler overran") }
        return TerminalText.escaped(parts.joined(separator: "  "))
    }
}

/// Prints and flushes at once, so a pipe sees each line as it happens.
func printLine(_ text: String, terminator: String = "\n") {
    print(text, terminator: terminator)
    fflush(nil)
}
