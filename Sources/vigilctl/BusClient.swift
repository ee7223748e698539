import ArgumentParser
import Foundation
import VigilClient
import VigilDBus
import VigilCommon
import VigilKit

/// Options of every command that talks to a running vigild over D-Bus.
struct BusOptions: ParsableArguments {
    @Option(help: ArgumentHelp(
        "The bus vigild is on: session, system, or a D-Bus address.",
        discussion: """
            session is $DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus, else the private bus \
            vigild started and wrote to $XDG_RUNTIME_DIR/vigil/bus (or <state-dir>/bus). Without \
            --bus: the session bus, or the system bus when no vigild answers on a session bus and \
            one does there (the packaged vigild.service). An address looks like \
            unix:path=/run/user/0/bus.
            """,
        valueName: "bus"))
    var bus: String?

    @Option(name: .customLong("state-dir"), help: ArgumentHelp(
        "vigild's state directory, where it writes the address of a private bus it started.",
        valueName: "dir"))
    var stateDir: String = HostPaths.defaultStateDir()

    @Option(help: ArgumentHelp("Seconds to wait for each reply.", valueName: "seconds"))
    var timeout: Double = 10

    func validate() throws {
        if let bus, BusSelection(parsing: bus) == nil {
            throw ValidationError("--bus must be session, system or a D-Bus address such as unix:path=/run/vigil/bus, got \"\(bus)\"")
        }
        guard timeout > 0, timeout <= 3_600 else { throw ValidationError("--timeout must be between 0 and 3600 seconds, got \(timeout)") }
    }
}

/// A problem to show the user as one clear sentence (no D-Bus error stacks).
struct VigilctlFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Runs a command body, printing a `VigilctlFailure` or any other error as
/// one line on stderr and exiting 1.
func runReporting(_ command: String, _ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let exit as ExitCode {
        throw exit
    } catch {
        // Errors quote vigild's replies, which may quote its clients.
        FileHandle.standardError.write(Data("vigilctl \(command): \(TerminalText.escaped("\(error)"))\n".utf8))
        throw ExitCode(1)
    }
}

/// A connection to vigild's `org.vigil.Vigil1` API.
struct VigilBusClient {
    static let busName = VigilAPI.busName
    static let rootPath = VigilAPI.rootPath
    static let hostInterface = VigilAPI.hostInterface
    static let strategyInterface = VigilAPI.strategyInterface
    static let leaseInterface = VigilAPI.leaseInterface
    static let propertiesInterface = VigilAPI.propertiesInterface

    /// The typed client of the API: every call goes through it.
    let client: VigilClient
    /// "the session bus", "the system bus" or "the bus at ADDRESS", for messages.
    let busDescription: String
    var connection: DBusConnection { client.connection }
    var timeout: Duration { client.timeout }

    /// The hint printed whenever no host answers.
    static let startHint = "start it with Scripts/run or vigild --config FILE"

    /// Finds the bus, connects, and checks that vigild owns its name.
    static func connect(_ options: BusOptions) async throws -> VigilBusClient {
        guard options.bus == nil else { return try await connect(options, on: BusSelection(parsing: options.bus ?? "") ?? .session) }
        // No --bus: the session bus, else the system bus's vigild (the
        // packaged system service), which root on a server most often means.
        do {
            return try await connect(options, on: .session)
        } catch let onSession as VigilctlFailure {
            guard let client = try? await connect(options, on: .system) else {
                throw VigilctlFailure("\(onSession.description); none answers on the system bus either")
            }
            return client
        }
    }

    private static func connect(_ options: BusOptions, on selection: BusSelection) async throws -> VigilBusClient {
        let (bus, description) = try locate(options, selection)
        let connection: DBusConnection
        do {
            connection = try await DBusConnection.connect(to: bus)
        } catch let error as DBusError {
            throw VigilctlFailure("no vigild is running on \(description): cannot connect to it (\(error.message)); \(startHint)")
        }
        let client = VigilBusClient(client: VigilClient(connection: connection, timeout: .milliseconds(Int(options.timeout * 1000))),
                                    busDescription: description)
        let hasOwner = try await client.nameHasOwner()
        guard hasOwner else {
            await connection.close()
            throw VigilctlFailure("no vigild is running on \(description) (\(busName) has no owner); \(startHint)")
        }
        return client
    }

    /// Connects, runs `body`, and closes the connection whatever happens.
    static func with<T>(_ options: BusOptions, _ body: (VigilBusClient) async throws -> T) async throws -> T {
        let client = try await connect(options)
        do {
            let result = try await body(client)
            await client.close()
            return result
        } catch {
            await client.close()
            throw error
        }
    }

    /// Resolves `--bus` through `BusLocator`, the way vigild finds its own
    /// bus, and describes it for messages.
    static func locate(_ options: BusOptions, _ selection: BusSelection) throws -> (DBusConnection.Bus, String) {
        let environment = ProcessInfo.processInfo.environment
        let addressFile = BusLocator.addressFile(stateDir: options.stateDir, environment: environment)
        guard let bus = BusLocator.clientBus(selection: selection, stateDir: options.stateDir, environment: environment) else {
            throw VigilctlFailure("""
                no vigild is running on the session bus: there is no session bus \
                (DBUS_SESSION_BUS_ADDRESS is unset, no $XDG_RUNTIME_DIR/bus) and no private bus \
                address in \(addressFile); \(startHint), or pass --bus ADDRESS
                """)
        }
        switch selection {
        case .system: return (bus, "the system bus")
        case let .address(address): return (bus, "the bus at \(address)")
        case .session:
            if case let .address(address) = bus,
               let written = try? String(contentsOfFile: addressFile, encoding: .utf8),
               written.trimmingCharacters(in: .whitespacesAndNewlines) == address,
               environment["DBUS_SESSION_BUS_ADDRESS"] != address {
                return (bus, "vigild's private bus (\(address), from \(addressFile))")
            }
            return (bus, "the session bus")
        }
    }

    private func nameHasOwner() async throws -> Bool {
        do {
            return try await client.hostIsRunning()
        } catch let error as DBusError {
            throw VigilctlFailure("\(busDescription) does not answer (\(error.name): \(error.message))")
        }
    }

    /// Calls a method of vigild, turning "vigild went away" errors into the
    /// same clear message as at connect time.
    func call(_ member: String, path: String = rootPath, interface: String = hostInterface, arguments: [BusValue] = []) async throws -> DBusMessage {
        try await mapped(member) { try await client.call(member, path: path, interface: interface, arguments: arguments) }
    }

    /// Runs one call of `client`'s: "vigild went away" errors become the
    /// same clear message as at connect time, and a reply that is not the
    /// contract's one sentence.
    func mapped<T>(_ member: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as APIDecodingError {
            throw VigilctlFailure("\(error.description); are vigild and vigilctl the same version?")
        } catch let error as DBusError {
            switch error.name {
            case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
                throw VigilctlFailure("no vigild is running on \(busDescription) (\(Self.busName) has no owner); \(Self.startHint)")
            case DBusError.Name.noReply:
                throw VigilctlFailure("vigild did not answer \(member) within \(timeout) (\(error.message))")
            case DBusError.Name.disconnected:
                throw VigilctlFailure("lost the connection to \(busDescription) during \(member)")
            default:
                throw VigilctlFailure("\(member) failed: \(error.message) (\(error.name))")
            }
        }
    }

    /// Every Host property (`GetAll`), as the contract's row.
    func host() async throws -> HostRow {
        try await mapped("GetAll") { try await client.host() }
    }

    /// The active leases, each with its `Status` property (a lease that
    /// ends between the list and the read keeps an empty status).
    func leases() async throws -> [ListedLease] {
        var rows = try await mapped(VigilAPI.Host.listLeases.name) { try await client.leases() }.map { ListedLease(row: $0) }
        for index in rows.indices {
            if let status = try? await client.get(VigilAPI.Lease.status, at: rows[index].path),
               !status.isEmpty {
                rows[index].status = status.mapValues(\.description)
            }
        }
        return rows
    }

    /// The strategies; a waiting one with the conditions it waits for
    /// (its `WaitingFor` property; empty if it started meanwhile).
    func strategies() async throws -> [ListedStrategy] {
        var rows = try await mapped(VigilAPI.Host.listStrategies.name) { try await client.strategies() }.map { ListedStrategy(row: $0) }
        // Each a strategy that may be gone meanwhile (nil then).
        for index in rows.indices where rows[index].state == "waiting" {
            rows[index].waitingFor = (try? await client.get(VigilAPI.Strategy.waitingFor, at: rows[index].path)) ?? ""
        }
        for index in rows.indices where !rows[index].lastError.isEmpty {
            if let at = try? await client.get(VigilAPI.Strategy.lastErrorAt, at: rows[index].path) {
                rows[index].lastErrorAt = at
            }
        }
        // What each costs: its cost properties, in one GetAll.
        for index in rows.indices {
            rows[index].cost = try? await client.properties(of: rows[index].path, interface: Self.strategyInterface, as: StrategyCostRow.self)
        }
        return rows
    }

    func reload() async throws -> ReloadReply {
        try await mapped(VigilAPI.Host.reload.name) { try await client.reload() }
    }

    func close() async { await connection.close() }
}


/// A row of the contract (``LeaseRow``, ``StrategyRow``) with one more
/// figure vigilctl reads separately; in JSON, the row's fields and the
/// figure under `Figure.name` (absent when nil).
@dynamicMemberLookup
struct Listed<Row: APIRow, Figure: ListedFigure>: Codable, Equatable {
    var row: Row
    var figure: Figure.Value?

    init(row: Row, figure: Figure.Value? = nil) {
        self.row = row
        self.figure = figure
    }

    subscript<T>(dynamicMember keyPath: KeyPath<Row, T>) -> T { row[keyPath: keyPath] }

    func encode(to encoder: any Encoder) throws {
        try row.encode(to: encoder)
        if Figure.flattened {
            try figure?.encode(to: encoder)
            return
        }
        var container = encoder.container(keyedBy: FigureKey.self)
        try container.encodeIfPresent(figure, forKey: FigureKey())
    }

    init(from decoder: any Decoder) throws {
        row = try Row(from: decoder)
        if Figure.flattened {
            figure = try Figure.Value(from: decoder)
            return
        }
        figure = try decoder.container(keyedBy: FigureKey.self).decodeIfPresent(Figure.Value.self, forKey: FigureKey())
    }

    private struct FigureKey: CodingKey {
        var stringValue: String { Figure.name }
        var intValue: Int? { nil }
        init() {}
        init?(stringValue: String) { guard stringValue == Figure.name else { return nil } }
        init?(intValue: Int) { nil }
    }
}

/// The extra figure of a ``Listed`` row: its JSON name and type; a
/// `flattened` one puts its own keys beside the row's.
protocol ListedFigure {
    associatedtype Value: Codable & Equatable
    static var name: String { get }
    static var flattened: Bool { get }
}

extension ListedFigure {
    static var flattened: Bool { false }
}

/// A lease's `Status` property, values as text.
enum LeaseStatusFigure: ListedFigure {
    typealias Value = [String: String]
    static let name = "status"
}

/// What vigilctl reads of a strategy besides its row: while it waits,
/// `WaitingFor` (the `when` conditions that are false); while it has a
/// LastError, `LastErrorAt` (microseconds since the epoch).
enum StrategyFigure: ListedFigure {
    struct Value: Codable, Equatable {
        var waitingFor: String?
        var lastErrorAt: UInt64?
        /// Its cost properties (counters since vigild started).
        var cost: StrategyCostRow?
    }
    static let name = ""
    static let flattened = true
}

typealias ListedLease = Listed<LeaseRow, LeaseStatusFigure>
typealias ListedStrategy = Listed<StrategyRow, StrategyFigure>

extension Listed where Figure == LeaseStatusFigure {
    /// The lease's `Status`; nil when empty.
    var status: [String: String]? {
        get { figure }
        set { figure = newValue }
    }
}

extension Listed where Row == StrategyRow, Figure == StrategyFigure {
    /// While waiting: the `when` conditions that are false.
    var waitingFor: String? {
        get { figure?.waitingFor }
        set { figure = StrategyFigure.Value(waitingFor: newValue, lastErrorAt: figure?.lastErrorAt, cost: figure?.cost) }
    }

    /// While it has a LastError: when it was set.
    var lastErrorAt: UInt64? {
        get { figure?.lastErrorAt }
        set { figure = StrategyFigure.Value(waitingFor: figure?.waitingFor, lastErrorAt: newValue, cost: figure?.cost) }
    }

    /// What it has cost since vigild started.
    var cost: StrategyCostRow? {
        get { figure?.cost }
        set { figure = StrategyFigure.Value(waitingFor: figure?.waitingFor, lastErrorAt: figure?.lastErrorAt, cost: newValue) }
    }

    /// LAST ERROR for people: the error and how long ago it was set.
    var lastErrorCell: String {
        guard !row.lastError.isEmpty else { return TableFormat.cell("") }
        guard let at = lastErrorAt, at > 0 else { return row.lastError }
        return "\(row.lastError) (\(TableFormat.relative(micros: at, now: TableFormat.nowMicros())))"
    }
}

/// JSON for tools: sorted keys, pretty-printed, slashes unescaped.
func jsonText(_ value: some Encodable) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    return String(decoding: try encoder.encode(value), as: UTF8.self)
}

/// One-line JSON, for event streams (one object per line).
func jsonLine(_ value: some Encodable) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return String(decoding: try encoder.encode(value), as: UTF8.self)
}
