import ServiceLifecycle
import Foundation
import Testing
import VigilClient
import VigilDBus
import VigilTestSupport
@testable import VigilHost
import VigilKit
import VigilKitTesting

/// A private dbus-daemon for one test (Tests/TestSupport).
typealias HostBusDaemon = TestDBusDaemon

/// Test kinds: each waits for one second of the manual clock first, so a
/// test can subscribe to signals before the strategy does anything.
enum HostBusKinds {
    static let all: [any StrategyKind] = [Script(), Idle(), Fail(), Status()]

    /// Acquires one lease and sets its status three times at once (count 1,
    /// 2, 3), then once more two seconds later (count 4).
    struct Status: StrategyKind {
        var name: String { "test-status" }
        var summary: String { "a lease with a live status" }
        func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy { Run() }

        struct Run: KeepAliveStrategy {
            func run(in context: StrategyContext) async throws {
                try await context.clock.sleep(for: .seconds(1))
                let lease = try await context.leases.acquire(LeaseRequest(holds: "stream", reason: "status test"))
                for count in 1...3 {
                    await lease.setStatus(["State": .string("up"), "Count": .uint(UInt64(count)), "Level": .double(-0.5),
                                           "Delta": .int(-2), "Ok": .bool(true)])
                }
                try await context.clock.sleep(for: .seconds(2))
                await lease.setStatus(["State": .string("down"), "Count": .uint(4)])
                try await context.clock.sleep(for: .seconds(1_000_000))
            }
        }
    }

    /// Acquires leases a (10 s budget), b (5 s budget, with an expiration
    /// handler) and c (no budget); renews a after 2 s; b expires at 5 s;
    /// releases c at 8 s; then holds a.
    struct Script: StrategyKind {
        var name: String { "test-script" }
        var summary: String { "leases for the D-Bus tests" }
        func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy { Run() }

        struct Run: KeepAliveStrategy {
            func run(in context: StrategyContext) async throws {
                let clock = context.clock
                try await clock.sleep(for: .seconds(1))
                let a = try await context.leases.acquire(LeaseRequest(holds: "a", reason: "script a", budget: .seconds(10)))
                _ = try await context.leases.acquire(LeaseRequest(
                    holds: "b", reason: "script b", budget: .seconds(5), grace: .seconds(2), onExpire: { _ in }))
                let c = try await context.leases.acquire(LeaseRequest(holds: "c", reason: "script c"))
                try await clock.sleep(for: .seconds(2))
                try await a.renew(budget: .seconds(10))
                try await clock.sleep(for: .seconds(6))
                await c.release()
                try await clock.sleep(for: .seconds(1_000_000))
            }
        }
    }

    /// Holds one lease (`holds`, default "idle") without a budget.
    struct Idle: StrategyKind {
        var name: String { "test-idle" }
        var summary: String { "one lease, forever" }
        func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
            Run(holds: config.string("holds", default: "idle"))
        }

        struct Run: KeepAliveStrategy {
            let holds: String
            func run(in context: StrategyContext) async throws {
                try await context.clock.sleep(for: .seconds(1))
                _ = try await context.leases.acquire(LeaseRequest(holds: holds, reason: "idle \(context.name)"))
                try await context.clock.sleep(for: .seconds(1_000_000))
            }
        }
    }

    /// Throws "boom" after the first second.
    struct Fail: StrategyKind {
        var name: String { "test-fail" }
        var summary: String { "fails" }
        func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy { Run() }

        struct Run: KeepAliveStrategy {
            func run(in context: StrategyContext) async throws {
                try await context.clock.sleep(for: .seconds(1))
                throw DescribedError("boom")
            }
        }
    }
}

/// A host runtime on a manual clock with a config file in a temp dir, its
/// API exported on a private bus, and a client connection.
final class HostBusFixture: @unchecked Sendable {
    // Invariant: all stored properties are immutable after init.
    let clock: ManualClock
    let logs: WaitableLog<LogLine>
    let directory: String
    let configPath: String
    let bus: HostBusDaemon
    let runtime: HostRuntime
    /// The runtime's services, as vigild runs them (without the bus: `api`).
    let services: RunningHostServices
    let api: HostBusAPI
    let host: DBusConnection
    let client: DBusConnection
    let hostName: String

    private init(clock: ManualClock, logs: WaitableLog<LogLine>, directory: String, configPath: String, bus: HostBusDaemon,
                 runtime: HostRuntime, services: RunningHostServices, api: HostBusAPI, host: DBusConnection, client: DBusConnection, hostName: String) {
        self.clock = clock
        self.logs = logs
        self.directory = directory
        self.configPath = configPath
        self.bus = bus
        self.runtime = runtime
        self.services = services
        self.api = api
        self.host = host
        self.client = client
        self.hostName = hostName
    }

    /// Runs `body` with a fixture and always stops it afterwards (the bus,
    /// the runtime and the temp dir), also when `body` throws.
    /// The typed client of the API (the contract's rows), on `client`.
    var typed: VigilClient { VigilClient(connection: client, destination: hostName) }

    static func with(strategies: String, host: String = "", hostUID: UInt32 = getuid(), stateDir: String? = nil,
                     _ body: (HostBusFixture) async throws -> Void) async throws {
        let fixture = try await make(strategies: strategies, host: host, hostUID: hostUID, stateDir: stateDir)
        do {
            try await body(fixture)
        } catch {
            await fixture.stop()
            throw error
        }
        await fixture.stop()
    }

    /// `strategies` is the `[[strategy]]` part of the config.
    /// `stateDir`: the host's state_dir (default: `state` in the temp dir).
    /// Writes the config (`config(directory:...)`) to `directory`/vigil.toml and
    /// opens a host on it, with the test kinds, a manual clock and a waitable log.
    static func openRuntime(directory: String, _ strategies: String, host hostKeys: String = "",
                            stateDir: String? = nil) async throws -> (HostRuntime, WaitableLog<LogLine>, ManualClock) {
        let configPath = directory + "/vigil.toml"
        try config(directory: directory, strategies, host: hostKeys, stateDir: stateDir).write(toFile: configPath, atomically: true, encoding: .utf8)
        let plugins = PluginLoader(searchPath: [])
        try plugins.register(HostBusKinds.all, from: "HostBusKinds")
        let loaded = try ConfigLoader.load(path: configPath, resolver: plugins)
        let clock = ManualClock()
        let logs = WaitableLog<LogLine>()
        let runtime = try await HostRuntime.open(config: loaded, environment: HostRuntime.Environment(
            clock: clock, scheduler: WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock)),
            logging: logs.logging, version: "9.9.9-test", plugins: plugins
        ))
        return (runtime, logs, clock)
    }

    static func make(strategies: String, host hostKeys: String = "", hostUID: UInt32 = getuid(), stateDir: String? = nil) async throws -> HostBusFixture {
        var template = Array("/tmp/vigil-hostbus-state-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw POSIXError(.EIO) }
        let directory = String(cString: dir)
        let configPath = directory + "/vigil.toml"
        let (runtime, logs, clock) = try await openRuntime(directory: directory, strategies, host: hostKeys, stateDir: stateDir)
        let services = await RunningHostServices(runtime, logs: logs)
        let bus: HostBusDaemon
        do { bus = try await offPool { try HostBusDaemon() } } catch {
            await services.stop()
            throw error
        }
        // Anything failing from here on must not leave the bus or the runtime behind.
        var host: DBusConnection?
        var client: DBusConnection?
        do {
            let started = ContinuousClock.now
            do { host = try await bus.connect() } catch {
                FileHandle.standardError.write(Data("HostBusFixture: the host connection failed after \(ContinuousClock.now - started): \(error)\n".utf8))
                throw error
            }
            let hostConnection = try #require(host)
            let api = HostBusAPI(runtime: runtime, connection: hostConnection, hostUID: hostUID)
            try await api.export()
            do { client = try await bus.connect() } catch {
                FileHandle.standardError.write(Data("HostBusFixture: the client connection failed after \(ContinuousClock.now - started): \(error)\n".utf8))
                throw error
            }
            return HostBusFixture(clock: clock, logs: logs, directory: directory, configPath: configPath, bus: bus,
                                  runtime: runtime, services: services, api: api, host: hostConnection, client: try #require(client),
                                  hostName: await hostConnection.uniqueName)
        } catch {
            await services.stop()
            await client?.close()
            await host?.close()
            await offPool { bus.stop() }
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    static func config(directory: String, _ strategies: String, host: String = "", stateDir: String? = nil) -> String {
        """
        [host]
        state_dir = "\(stateDir ?? directory + "/state")"
        \(host)

        \(strategies)
        """
    }

    /// Rewrites the config file.
    func writeConfig(_ strategies: String, host: String = "") throws {
        try Self.config(directory: directory, strategies, host: host).write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    /// Every signal the host connection sends from now on.
    func record() async throws -> SignalRecorder {
        SignalRecorder(try await client.signals(matching: DBusMatchRule(sender: hostName)))
    }

    /// Calls a method of org.vigil.Vigil1.Host on the root object.
    @discardableResult
    func hostCall(_ member: String, _ arguments: [any BusEncodable] = []) async throws -> DBusMessage {
        try await call(VigilAPI.rootPath, VigilAPI.hostInterface, member, arguments)
    }

    @discardableResult
    func call(_ path: String, _ interface: String, _ member: String,
              _ arguments: [any BusEncodable] = []) async throws -> DBusMessage {
        try await client.call(destination: hostName, path: path, interface: interface, member: member,
                              arguments: arguments.map(\.busValue), timeout: .seconds(10))
    }

    func getAll(_ path: String, _ interface: String) async throws -> [String: BusValue] {
        let reply = try await call(path, VigilAPI.propertiesInterface, "GetAll", [interface])
        return try reply.argument(0, as: [String: DBusVariant].self).mapValues(\.value)
    }

    func get(_ path: String, _ interface: String, _ name: String) async throws -> BusValue {
        let reply = try await call(path, VigilAPI.propertiesInterface, "Get", [interface, name])
        guard case .variant(let value) = reply.body.first else { throw DBusError.failed("no variant") }
        return value
    }

    /// Waits until some task sleeps on the manual clock with a deadline
    /// within `seconds` from now (a strategy that just failed has to record
    /// the failure before it sleeps through its backoff); throws
    /// `ManualClock.Timeout` if none does within the clock's bound of real time.
    func waitForSleeper(within seconds: Int64) async throws {
        try await clock.settle(until: "a task asleep on the test clock until at most \(seconds) s from now") {
            clock.sleeperCount(dueBy: clock.now + .seconds(seconds)) > 0
        }
    }

    /// Moves the manual clock and lets woken tasks run.
    func advance(_ seconds: Int64) async {
        await clock.advance(by: .seconds(seconds))
    }

    func stop() async {
        await api.stop()
        await services.stop()
        await client.close()
        await host.close()
        let bus = self.bus
        await offPool { bus.stop() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// One received signal, reduced to what the tests compare.
struct SeenSignal: CustomStringConvertible, Equatable, Sendable {
    var path: String
    var interface: String
    var member: String
    var body: [BusValue]

    /// `Member path [args]` with PropertiesChanged and ObjectManager
    /// signals shortened to what matters: property names, interface names.
    var description: String {
        switch member {
        case "PropertiesChanged":
            guard body.count == 3, case .dict(_, _, let entries) = body[1] else { return "PropertiesChanged \(path) ?" }
            let names = entries.compactMap { entry -> String? in
                if case .string(let name) = entry.key { return name }
                return nil
            }
            var invalidated: [String] = []
            if case .array(_, let items) = body[2] {
                invalidated = items.compactMap { if case .string(let s) = $0 { return s } else { return nil } }
            }
            return "PropertiesChanged \(path) \(names.joined(separator: ","))" + (invalidated.isEmpty ? "" : " -\(invalidated.joined(separator: ","))")
        case "InterfacesAdded", "InterfacesRemoved":
            guard body.count == 2, case .objectPath(let object) = body[0] else { return "\(member) ?" }
            return "\(member) \(object)"
        default:
            return "\(member) " + body.map(Self.short).joined(separator: " ")
        }
    }

    static func short(_ value: BusValue) -> String {
        switch value {
        case .string(let s): "\"\(s)\""
        case .objectPath(let p): p
        case .bool(let b): "\(b)"
        case .uint64(let t): "\(t)"
        case .uint32(let u): "\(u)"
        default: value.description
        }
    }

    /// The changed properties of a PropertiesChanged signal.
    var changedProperties: [String: BusValue] {
        guard member == "PropertiesChanged", body.count == 3, case .dict(_, _, let entries) = body[1] else { return [:] }
        var out: [String: BusValue] = [:]
        for entry in entries {
            if case .string(let name) = entry.key, case .variant(let value) = entry.value { out[name] = value }
        }
        return out
    }
}

/// Collects signals from a stream; tests await a condition with a timeout.
final class SignalRecorder: @unchecked Sendable {
    typealias Condition = @Sendable ([SeenSignal]) -> Bool
    // Invariant: `task` is set once in init and only cancelled in deinit.
    private let seen = WaitableLog<SeenSignal>()
    private var task: Task<Void, Never>?

    init(_ stream: AsyncStream<DBusMessage>) {
        let seen = self.seen
        task = Task {
            for await message in stream {
                seen.append(SeenSignal(path: message.path ?? "", interface: message.interface ?? "", member: message.member ?? "", body: message.body))
            }
        }
    }

    deinit { task?.cancel() }

    var all: [SeenSignal] { seen.all }

    /// Waits until at least `count` signals arrived (or the timeout passed)
    /// and returns everything received so far.
    @discardableResult
    func wait(for count: Int, timeout: Duration = .seconds(10)) async -> [SeenSignal] {
        await wait(timeout: timeout) { $0.count >= count }
    }

    /// Waits until `condition` holds for the signals received so far (or
    /// the timeout passed) and returns them.
    @discardableResult
    func wait(timeout: Duration = .seconds(10), until condition: @escaping Condition) async -> [SeenSignal] {
        if await !seen.wait(timeout: timeout, until: condition) {
            FileHandle.standardError.write(Data("SignalRecorder: wait timed out with \(all.count) signals\n".utf8))
        }
        return all
    }

    /// Descriptions of the signals received so far, from `start`.
    func descriptions(from start: Int = 0) -> [String] {
        Array(all.dropFirst(start).map(\.description))
    }
}

/// Runs blocking work (starting or reaping a process) on its own thread,
/// so that it never holds one of the few cooperative threads the host
/// under test needs.
func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

func offPool(_ work: @escaping @Sendable () -> Void) async {
    await withCheckedContinuation { continuation in
        Thread {
            work()
            continuation.resume()
        }.start()
    }
}

/// The services the host makes of its parts (the survival record, the
/// metrics endpoint, the sleep cycle, the strategies) running in a
/// `ServiceGroup`, in vigild's order (without the bus: the fixture exports
/// the API itself); ``stop()`` shuts the group down gracefully, and the
/// survival record writes the end of the run as it stops.
final class RunningHostServices: Sendable {
    let runtime: HostRuntime
    /// How the run ends: a test may fail it, as vigild's bus does.
    let outcome = RunOutcome()
    private let group: ServiceGroup
    private let running: Task<Void, any Error>

    /// Starts the group; returns once the strategies have started.
    init(_ runtime: HostRuntime, logs: WaitableLog<LogLine>) async {
        self.runtime = runtime
        let sleepCycle = runtime.sleepCycle()
        let strategies = await runtime.strategies(after: sleepCycle.started)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: runtime.survivalRecorder(outcome: outcome), serviceName: "survival record"),
        ]
        if let metrics = runtime.metricsEndpoint() { services.append(.init(service: metrics, serviceName: "metrics listener")) }
        services += [
            .init(service: sleepCycle, serviceName: "sleep cycle"),
            .init(service: strategies, serviceName: "strategies"),
        ]
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: logs.logger("vigild")))
        self.group = group
        running = Task { try await group.run() }
        _ = await strategies.started.wait()
    }

    /// Stops the services in reverse order; the run ends as ``outcome`` says.
    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await running.value
    }
}
