import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// Records the order in which things happen across tasks.
final class OrderLog: Sendable {
    private let items = Lock<[String]>([])
    func add(_ s: String) { items.withLock { $0.append(s) } }
    var all: [String] { items.withLock { $0 } }
}

struct FailingStrategy: KeepAliveStrategy {
    let failures: Int
    let attempts: Counter
    let log: OrderLog
    func run(in context: StrategyContext) async throws {
        await attempts.increment()
        let n = await attempts.value
        log.add("\(context.clock.now.nanoseconds)")
        // Hold a lease, then fail: the supervisor must release it.
        _ = try await context.leases.acquire(LeaseRequest(holds: "work", reason: "attempt \(n)"))
        if n <= failures { throw DescribedError("boom \(n)") }
        try await context.clock.sleep(for: .seconds(1_000_000))
    }
}

struct WaitingStrategy: KeepAliveStrategy {
    let log: OrderLog
    func run(in context: StrategyContext) async throws {
        _ = try await context.leases.acquire(LeaseRequest(holds: "held by \(context.name)", reason: "test"))
        do { try await context.clock.sleep(for: .seconds(1_000_000)) } catch {
            log.add("stopped \(context.name)")
            throw error
        }
    }
}

@Suite struct SupervisorTests {
    func makeSupervisor(_ clock: ManualClock, _ registry: LeaseRegistry, backoff: Backoff) -> Supervisor {
        let scheduler = WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock))
        let logs = WaitableLog<LogLine>()
        return Supervisor(services: StrategyServices(
            registry: registry, scheduler: scheduler, clock: clock, logging: logs.logging,
            hooks: { name, log in HookRunner(strategy: name, log: log) },
            events: { _ in RecordingEvents() }
        ), backoff: backoff)
    }

    /// A lease's error (its status's LastError) is its strategy's, with
    /// when it was set, until it clears or the lease ends.
    @Test func aLeasesErrorIsItsStrategysUntilItClears() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let supervisor = makeSupervisor(clock, registry, backoff: Backoff(initial: .seconds(10), maximum: .seconds(300), jitter: false))
        await registry.observe(supervisor.errors)
        let follow = Task { await supervisor.followErrors() }
        defer { follow.cancel() }
        let changes = StatusWaiter(await supervisor.changes(), name: "held")
        await supervisor.start([SupervisedStrategy(name: "held", kind: "test", strategy: LeaseHoldingStrategy())])
        try await clock.settle(until: "the strategy holds its lease") { await registry.active.contains { $0.strategy == "held" } }
        let lease = try #require(await registry.active.first { $0.strategy == "held" })
        await registry.setStatus(lease.id, ["LastError": .string("the peer closed the connection")])
        let broken = try await changes.next("broken") { $0.lastError != nil }
        #expect(broken.lastError == "lease \(lease.id.rawValue): the peer closed the connection")
        #expect(broken.lastErrorWallMicros == clock.wallMicroseconds)
        await registry.setStatus(lease.id, ["LastError": .string("")])
        let repaired = try await changes.next("repaired") { $0.lastError == nil }
        #expect(repaired.lastErrorWallMicros == nil)
        await registry.setStatus(lease.id, ["LastError": .string("connect to 127.0.0.1:1 failed: Connection refused")])
        _ = try await changes.next("broken again") { $0.lastError != nil }
        await registry.release(lease.id)
        _ = try await changes.next("its lease ended") { $0.lastError == nil }
        await supervisor.stopAll()
    }

    @Test func failingStrategyIsRestartedWithBackoffAndItsLeasesReleased() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        // No jitter, so the delays are exactly the backoff ceilings: 10 s, 20 s, 40 s.
        let supervisor = makeSupervisor(clock, registry, backoff: Backoff(initial: .seconds(10), maximum: .seconds(300), jitter: false))
        let attempts = Counter(), log = OrderLog()
        await supervisor.start([SupervisedStrategy(name: "flaky", kind: "test", strategy: FailingStrategy(failures: 3, attempts: attempts, log: log))])
        // Each failed attempt releases its lease, records the failure, then
        // waits out its delay on the clock: that sleep is the event to wait
        // for before time moves (a loaded machine may take it late).
        func failed(_ attempt: Int, waiting delay: Duration) async throws {
            try await clock.settle(until: "attempt \(attempt) failed and waits \(delay) to restart") {
                let started = await attempts.value
                return started == attempt && clock.nextDeadline == clock.now + delay
            }
        }
        try await failed(1, waiting: .seconds(10))
        #expect(await supervisor.statuses.first?.state == .backoff)
        #expect(await registry.active.isEmpty, "the failed attempt's lease must be released")
        await clock.advance(by: .seconds(9))
        #expect(await attempts.value == 1)
        await clock.advance(by: .seconds(1))
        try await failed(2, waiting: .seconds(20))
        await clock.advance(by: .seconds(20))
        try await failed(3, waiting: .seconds(40))
        await clock.advance(by: .seconds(39))
        #expect(await attempts.value == 3)
        let failed = try #require(await supervisor.statuses.first)
        #expect(failed.lastError == "boom 3")
        #expect(failed.lastErrorWallMicros != nil)
        let changes = StatusWaiter(await supervisor.changes(), name: "flaky")
        // As the host does: fold the strategies' errors as they change.
        let follow = Task { await supervisor.followErrors() }
        defer { follow.cancel() }
        await clock.advance(by: .seconds(1))
        try await clock.settle(until: "the fourth attempt started") { await attempts.value == 4 }
        // The run that took its lease again recovered: LastError is cleared.
        let status = try await changes.next("recovered") { $0.lastError == nil }
        #expect(status.restarts == 3)
        #expect(status.lastError == nil && status.lastErrorWallMicros == nil)
        #expect(status.state == .running)
        #expect(await registry.active.count == 1)
        await supervisor.stopAll()
        #expect(await registry.active.isEmpty)
        let after = await supervisor.statuses
        #expect(after.isEmpty, "stopped strategies leave the running list: \(after)")
    }

    @Test func jitteredDelaysStayWithinTheBackoffCeiling() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let backoff = Backoff(initial: .seconds(8), maximum: .seconds(60))
        let supervisor = makeSupervisor(clock, registry, backoff: backoff)
        let attempts = Counter(), log = OrderLog()
        await supervisor.start([SupervisedStrategy(name: "flaky", kind: "test", strategy: FailingStrategy(failures: 6, attempts: attempts, log: log))])
        // Each failed attempt's restart waits on the clock: move it to that
        // deadline once the wait is registered (a slow machine, or TSan, may
        // register it after a fixed number of yields), so each start's time
        // is its delay's end exactly.
        let started = clock.now
        for attempt in 1...6 {
            try await eventually("attempt \(attempt) failed and its restart waits on the clock") {
                log.all.count >= attempt && clock.nextDeadline != nil
            }
            if let deadline = clock.nextDeadline { await clock.advance(to: deadline) }
        }
        try await eventually("the seventh attempt started") { log.all.count >= 7 }
        let starts = log.all.compactMap { Int64($0) }
        // 8 + 16 + 32 + 60 + 60 + 60 s at most: all seven attempts within 236 s.
        #expect(starts.count == 7)
        #expect(clock.now - started <= .seconds(236))
        for (i, (a, b)) in zip(starts, starts.dropFirst()).enumerated() {
            let delay = Duration.nanoseconds(b - a)
            #expect(delay <= backoff.ceiling(attempt: i), "delay \(delay) after failure \(i + 1) exceeds \(backoff.ceiling(attempt: i))")
        }
        await supervisor.stopAll()
    }

    @Test func stopAllStopsInReverseStartOrderAndReleasesEveryLease() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let supervisor = makeSupervisor(clock, registry, backoff: Backoff())
        let log = OrderLog()
        await supervisor.start(["a", "b", "c"].map { SupervisedStrategy(name: $0, kind: "test", strategy: WaitingStrategy(log: log)) })
        // Each holds its lease, then sleeps on the clock until stopped.
        try await clock.settle(until: "the three strategies hold their leases and wait") {
            let held = await registry.active.count
            return held == 3 && clock.sleeperCount >= 3
        }
        await supervisor.stopAll()
        #expect(log.all == ["stopped c", "stopped b", "stopped a"])
        #expect(await registry.active.isEmpty)
        let released = await registry.history.filter { $0.kind == .released }.map(\.lease.strategy)
        #expect(released == ["c", "b", "a"])
    }
}
