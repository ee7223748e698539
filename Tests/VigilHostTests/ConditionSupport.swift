import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// Holds one lease for as long as it runs.
struct LeaseHoldingStrategy: KeepAliveStrategy {
    func run(in context: StrategyContext) async throws {
        _ = try await context.leases.acquire(LeaseRequest(holds: "held by \(context.name)", reason: "test"))
        try await context.clock.sleep(for: .seconds(1_000_000))
    }
}

/// A supervisor whose strategies are gated by a real ``ConditionMonitor``,
/// on a test clock.
struct GatedSupervisor {
    let clock: any VigilClock
    let registry: LeaseRegistry
    let scheduler: WakeScheduler
    let monitor: ConditionMonitor
    let supervisor: Supervisor
    let logs = WaitableLog<LogLine>()

    /// On `clock` (a test clock by default), or on the system clock and
    /// its timerfd scheduler when `realTime` (strategies that talk to real
    /// servers time their own I/O).
    init(settings: ConditionMonitor.Settings = ConditionMonitor.Settings(), clock: ManualClock = ManualClock(), realTime: Bool = false) throws {
        let clock: any VigilClock = realTime ? SystemClock() : clock
        self.clock = clock
        registry = LeaseRegistry(clock: clock)
        scheduler = realTime ? try WakeScheduler.system(clock: clock) : WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock))
        monitor = ConditionMonitor(settings: settings, registry: registry, scheduler: scheduler, clock: clock, logging: logs.logging)
        var services = StrategyServices(
            registry: registry, scheduler: scheduler, clock: clock, logging: logs.logging,
            hooks: { name, log in HookRunner(strategy: name, log: log) },
            events: { _ in RecordingEvents() }
        )
        services.conditions = monitor
        supervisor = Supervisor(services: services)
    }

    /// Starts a lease-holding strategy gated by `conditions`, and returns
    /// its status changes from before the start.
    func start(_ name: String, _ conditions: StrategyConditions, strategy: any KeepAliveStrategy = LeaseHoldingStrategy()) async -> StatusWaiter {
        let waiter = StatusWaiter(await supervisor.changes(), name: name)
        await supervisor.start([SupervisedStrategy(name: name, kind: "test", strategy: strategy, conditions: conditions)])
        return waiter
    }

    func stop() async {
        await supervisor.stopAll()
        await monitor.stop()
    }

    func activeLeases(of strategy: String) async -> Int {
        await registry.active.filter { $0.strategy == strategy }.count
    }
}

/// Awaits a strategy's status changes in order.
final class StatusWaiter: @unchecked Sendable {
    // Invariant: only the test's task iterates `iterator`, one call at a time.
    private var iterator: AsyncStream<StrategyStatus>.Iterator
    private let name: String

    init(_ stream: AsyncStream<StrategyStatus>, name: String) {
        iterator = stream.makeAsyncIterator()
        self.name = name
    }

    /// The next status of the strategy in `state`, skipping others; throws
    /// after `timeout` of real time (a bound for a broken run, not a measure).
    @discardableResult
    func next(_ state: StrategyRunState, timeout: Duration = .seconds(30)) async throws -> StrategyStatus {
        // A gated strategy starts as waiting before its first verdict names
        // what it waits for.
        try await next(state.rawValue, timeout: timeout) { s in s.state == state && (state != .waiting || !s.waitingFor.isEmpty) }
    }

    /// The next status of the strategy that satisfies `condition` (`what`
    /// says what it is, for the error), skipping others; throws after
    /// `timeout` of real time.
    @discardableResult
    func next(_ what: String, timeout: Duration = .seconds(30), where condition: @escaping @Sendable (StrategyStatus) -> Bool) async throws -> StrategyStatus {
        let box = self
        let name = self.name
        return try await withThrowingTaskGroup(of: StrategyStatus?.self) { group in
            group.addTask {
                while let s = await box.step() {
                    if s.name == name && condition(s) { return s }
                }
                return nil
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw DescribedError("timed out after \(timeout) waiting for \(name) to be \(what)")
            }
            guard let found = try await group.next(), let status = found else {
                throw DescribedError("status stream of \(name) ended before \(what)")
            }
            group.cancelAll()
            return status
        }
    }

    private func step() async -> StrategyStatus? { await iterator.next() }
}

/// A temporary directory removed when the value goes away.
final class ConditionTempDir: @unchecked Sendable {
    // Invariant: `path` never changes.
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "vigil-conditions-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// Writes `text` to `relative` (creating directories) the way sysfs
    /// changes look to inotify: one write, then close.
    func write(_ relative: String, _ text: String) throws {
        let url = URL(fileURLWithPath: path + "/" + relative)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        let fd = open(url.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw DescribedError("cannot open \(url.path)") }
        defer { close(fd) }
        let bytes = Array((text + "\n").utf8)
        guard Glibc.write(fd, bytes, bytes.count) == bytes.count else { throw DescribedError("cannot write \(url.path)") }
    }
}
