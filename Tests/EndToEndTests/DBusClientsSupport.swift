import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// A private dbus-daemon for one test (Tests/TestSupport).
typealias PrivateBusDaemon = TestDBusDaemon

/// Every signal seen on a connection, kept in order and awaitable.
final class SignalLog: Sendable {
    private let messages = WaitableLog<DBusMessage>()

    var all: [DBusMessage] { messages.all }

    func append(_ message: DBusMessage) {
        messages.append(message)
    }

    /// The first signal (seen already or yet to come) that satisfies
    /// `predicate`, which sees each signal once, in order (callers count
    /// matches in it). `timeout` only bounds a broken run.
    func first(timeout: Duration = .seconds(20), where predicate: @escaping @Sendable (DBusMessage) -> Bool) async throws -> DBusMessage {
        let scan = Scan()
        // The log checks conditions one at a time, under its lock.
        let met = await messages.wait(timeout: timeout) { all in
            scan.state.withLock { state in
                while state.found == nil, state.next < all.count {
                    if predicate(all[state.next]) { state.found = all[state.next] }
                    state.next += 1
                }
                return state.found != nil
            }
        }
        guard met, let found = scan.state.withLock({ $0.found }) else {
            throw DaemonError("no matching signal within \(timeout); seen: \(all.map { $0.member ?? "?" })")
        }
        return found
    }

    /// How far one `first` has looked, and what it found.
    private final class Scan: Sendable {
        let state = Lock<(next: Int, found: DBusMessage?)>((0, nil))
    }
}

/// A vigild serving org.vigil.Vigil1 on its own private bus, with real
/// periodic-wake strategies, and a watcher connection that records every
/// Host signal and name change from before vigild started.
final class BusHost: Sendable {
    static let name = VigilAPI.busName
    static let root = VigilAPI.rootPath
    static let hostInterface = VigilAPI.hostInterface

    /// Two strategies: `mail-sync` holds one lease for minutes (a long
    /// command started at once), `tick` takes and releases a lease every
    /// 250 ms, so lease signals keep coming.
    static let defaultStrategies = """
        [[strategy]]
        name = "mail-sync"
        kind = "periodic-wake"
        every = "1h"
        run_at_start = true
        run = ["/bin/sleep", "300"]
        run_timeout = "300s"

        [[strategy]]
        name = "tick"
        kind = "periodic-wake"
        every = "250ms"
        tolerance = "10ms"
        run = ["/bin/true"]
        """

    /// The default strategies and a download-session named `dl` saving in `dir`.
    static func withDownloads(in dir: String) -> String {
        defaultStrategies + """


            [[strategy]]
            name = "dl"
            kind = "download-session"
            dir = "\(dir)"
            """
    }

    let bus: PrivateBusDaemon
    let dir: TempDir
    let configPath: String
    let daemon: Daemon
    let watcher: DBusConnection
    let signals: SignalLog
    private let consumers: [Task<Void, Never>]

    var address: String { bus.address }
    var stateDir: String { dir.file("state") }

    private init(bus: PrivateBusDaemon, dir: TempDir, configPath: String, daemon: Daemon, watcher: DBusConnection, signals: SignalLog, consumers: [Task<Void, Never>]) {
        self.bus = bus
        self.dir = dir
        self.configPath = configPath
        self.daemon = daemon
        self.watcher = watcher
        self.signals = signals
        self.consumers = consumers
    }

    /// Starts the bus, the watcher and vigild, and waits until vigild owns
    /// its name and (with the default strategies) `mail-sync` holds its lease.
    /// `executable`: a wrapper argv that ends by exec'ing vigild (``Daemon``).
    static func start(strategies: String = defaultStrategies, executable: [String]? = nil) async throws -> BusHost {
        let bus = try PrivateBusDaemon()
        do {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: """
                bus = "\(bus.address)"

                \(strategies)
                """))
            let watcher = try await DBusConnection.connect(to: .address(bus.address))
            let signals = SignalLog()
            let hostSignals = try await watcher.signals(matching: DBusMatchRule(sender: name, interface: hostInterface))
            let ownerChanges = try await watcher.signals(matching: DBusMatchRule(
                sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
            let objectManager = try await watcher.signals(matching: DBusMatchRule(
                sender: name, interface: "org.freedesktop.DBus.ObjectManager"))
            let consumers = [hostSignals, ownerChanges, objectManager].map { stream in
                Task { for await message in stream { signals.append(message) } }
            }
            let daemon = try Daemon(arguments: ["--config", config], environment: ["DBUS_SESSION_BUS_ADDRESS": ""],
                                    executable: executable.map { $0 + [Build.vigild] })
            let host = BusHost(bus: bus, dir: dir, configPath: config, daemon: daemon, watcher: watcher, signals: signals, consumers: consumers)
            do {
                _ = try await signals.first { $0.member == "NameOwnerChanged" && $0.body.first == .string(name) && $0.body.last != .string("") }
                if strategies == defaultStrategies {
                    _ = try await host.leasePath(strategy: "mail-sync")
                }
            } catch {
                await host.stop()
                throw DaemonError("\(error)\nvigild output:\n\(daemon.output.joined(separator: "\n"))")
            }
            return host
        } catch {
            bus.stop()
            throw error
        }
    }

    /// Runs `body` with a started host and stops everything afterwards.
    static func with<T>(strategies: String = defaultStrategies, executable: [String]? = nil, _ body: (BusHost) async throws -> T) async throws -> T {
        let host = try await start(strategies: strategies, executable: executable)
        do {
            let result = try await body(host)
            await host.stop()
            return result
        } catch {
            await host.stop()
            throw error
        }
    }

    /// The first LeaseAcquired of `strategy` (past or future); returns the lease path.
    func leaseAcquired(strategy: String, after skip: Int = 0) async throws -> String {
        let seen = Counter()
        let message = try await signals.first { m in
            m.member == "LeaseAcquired" && m.body.count == 3 && m.body[1] == .string(strategy) && seen.next() > skip
        }
        guard case let .objectPath(path) = message.body[0] else { throw DaemonError("LeaseAcquired without a path: \(message.body)") }
        return path
    }

    /// The path of an active lease of `strategy`: one already listed by
    /// ListLeases (acquired before vigild was on the bus), else the next
    /// LeaseAcquired (the watcher subscribed before vigild started, so none
    /// is missed).
    func leasePath(strategy: String) async throws -> String {
        let reply = try await watcher.call(destination: Self.name, path: Self.root, interface: Self.hostInterface, member: "ListLeases")
        if case let .array(_, rows) = reply.body.first {
            for case let .structure(fields) in rows where fields.count == 10 && fields[2] == .string(strategy) {
                if case let .objectPath(path) = fields[0] { return path }
            }
        }
        return try await leaseAcquired(strategy: strategy)
    }

    /// Stops vigild with SIGTERM (it must exit 0), then the watcher and the bus.
    func stop() async {
        if daemon.process.isRunning {
            daemon.signal(SIGTERM)
            let status = await daemon.waitForExit()
            #expect(status == 0, "vigild exit status; output:\n\(daemon.output.suffix(30).joined(separator: "\n"))")
        }
        for consumer in consumers { consumer.cancel() }
        await watcher.close()
        bus.stop()
    }

    /// `busctl --address=<bus> ARGS...`.
    func busctl(_ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/bin/busctl", ["--address=\(address)"] + arguments)
    }

    /// vigilctl with `--bus <this bus>` after the subcommand.
    func vigilctl(_ subcommand: String, _ arguments: [String] = []) throws -> CommandResult {
        try ProcessRunner.run(Build.vigilctl, [subcommand, "--bus", address] + arguments)
    }
}

/// A counter a `@Sendable` predicate can bump.
final class Counter: Sendable {
    private let value = Lock(0)
    func next() -> Int { value.withLock { $0 += 1; return $0 } }
}

/// A long-running tool (busctl monitor, dbus-monitor, vigilctl --watch)
/// whose stdout lines can be awaited; SIGKILLed when done.
final class StreamingTool: @unchecked Sendable {
    // Invariant: `process` and `errorPipe` are set in init and only read
    // afterwards; `partial` is only touched under its lock.
    /// Each stdout line, then nil when stdout ends.
    private let lines = WaitableLog<String?>()
    private let partial = Lock(Data())
    let process: Process
    private let errorPipe = Pipe()

    init(_ program: String, _ arguments: [String]) throws {
        process = ProcessRunner.process(program)
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = errorPipe
        try process.run()
        readUntilEnd(out.fileHandleForReading) { [weak self] data in self?.received(data) }
    }

    var output: [String] { lines.all.compactMap { $0 } }

    private func received(_ data: Data) {
        let complete: [String] = partial.withLock { partial in
            partial.append(data)
            var complete: [String] = []
            while let nl = partial.firstIndex(of: 0x0A) {
                complete.append(String(decoding: partial[partial.startIndex..<nl], as: UTF8.self))
                partial.removeSubrange(partial.startIndex...nl)
            }
            return complete
        }
        for line in complete { lines.append(line) }
        if data.isEmpty { lines.append(nil) }
    }

    /// Waits until a stdout line contains `text`; returns that line.
    @discardableResult
    func waitForLine(containing text: String, timeout: Duration = .seconds(20)) async throws -> String {
        await lines.wait(timeout: timeout) { $0.contains { $0 == nil || $0?.contains(text) == true } }
        guard let line = output.first(where: { $0.contains(text) }) else {
            throw DaemonError("\(process.executableURL?.lastPathComponent ?? "tool") printed no line containing \"\(text)\"; output:\n\(output.joined(separator: "\n"))")
        }
        return line
    }

    /// Stops the tool and returns what it printed on stderr.
    @discardableResult
    func stop() -> String {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        return String(decoding: errorPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// Runs a python3 script (written to a temp file) with /usr/bin/python3,
/// which has the Debian python3-dbus module.
func runPythonScript(_ script: String, _ arguments: [String]) throws -> CommandResult {
    let dir = try TempDir("vigil-e2e-py")
    let path = try dir.write("client.py", script)
    return try ProcessRunner.run("/usr/bin/python3", [path] + arguments)
}

/// The members the contract (VigilKit's ``VigilAPI``) declares, checked
/// against what every client sees.
enum APIContract {
    static var hostProperties: [String] { VigilAPI.host.properties.map(\.name) }
    static var hostMethods: [String] { VigilAPI.host.methods.map(\.name) }
    static var hostSignals: [String] { VigilAPI.host.signals.map(\.name) }
    static var strategyProperties: [String] { VigilAPI.strategy.properties.map(\.name) }
    static var leaseProperties: [String] { VigilAPI.lease.properties.map(\.name) }
}
