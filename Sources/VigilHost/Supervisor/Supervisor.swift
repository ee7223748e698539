import VigilKit

/// A strategy instance as the supervisor runs it.
public struct SupervisedStrategy: Sendable {
    public var name: String
    public var kind: String
    public var strategy: any KeepAliveStrategy
    /// Its `when`/`when_any` conditions: it runs only while they hold.
    public var conditions: StrategyConditions?

    public init(name: String, kind: String, strategy: any KeepAliveStrategy, conditions: StrategyConditions? = nil) {
        self.name = name
        self.kind = kind
        self.strategy = strategy
        self.conditions = conditions
    }
}

/// Where a supervised strategy is in its life.
public enum StrategyRunState: String, Sendable, Hashable {
    case running
    /// It threw; waiting before the next restart.
    case backoff
    /// `run` returned: the strategy finished its work; not restarted.
    case finished
    /// Cancelled by shutdown or reload.
    case stopped
    /// Its `when` conditions do not hold: not running until they do.
    case waiting
}

/// What the supervisor knows about one strategy instance.
public struct StrategyStatus: Sendable, Hashable {
    public var name: String
    public var kind: String
    public var state: StrategyRunState
    public var restarts: Int
    /// The newest error of the strategy or of one of its leases ("lease 7:
    /// ..."), until it recovers; nil when it is fine.
    public var lastError: String?
    /// When `lastError` was set (wall clock, microseconds since the epoch).
    public var lastErrorWallMicros: Int64?
    public var startedAt: VigilInstant?
    /// While `waiting`: the false conditions, as written in the config.
    public var waitingFor: String

    public init(name: String, kind: String, state: StrategyRunState, restarts: Int, lastError: String? = nil, lastErrorWallMicros: Int64? = nil,
                startedAt: VigilInstant? = nil, waitingFor: String = "") {
        self.name = name
        self.kind = kind
        self.state = state
        self.restarts = restarts
        self.lastError = lastError
        self.lastErrorWallMicros = lastErrorWallMicros
        self.startedAt = startedAt
        self.waitingFor = waitingFor
    }
}

/// Everything the supervisor gives each strategy besides its own name.
public struct StrategyServices: Sendable {
    public var registry: LeaseRegistry
    public var scheduler: any WakeScheduling
    public var clock: any VigilClock
    /// How strategies' loggers are made (labelled with the strategy's name,
    /// `strategy=<name>` on every line).
    public var logging: HostLogging
    /// Builds the hook runner for a strategy.
    public var hooks: @Sendable (_ strategy: String, _ log: Logger) -> any HookRunning
    /// Builds the event recorder for a strategy.
    public var events: @Sendable (_ strategy: String) -> any EventRecording
    /// Builds the persistent record store for a strategy.
    public var store: @Sendable (_ strategy: String) -> any StrategyStore = { _ in MemoryStrategyStore() }
    /// Builds the D-Bus face of a strategy.
    public var bus: @Sendable (_ strategy: String) -> any StrategyBus = { name in DetachedStrategyBus(objectPath: VigilAPI.strategyPath(name)) }
    /// Where a strategy reports its network bytes (StrategyContext.cost).
    public var cost: @Sendable (_ strategy: String) -> any CostRecording = { _ in UncountedCost() }
    /// Called each time a run of a strategy ends (to take down what it exported).
    public var runEnded: @Sendable (_ strategy: String) async -> Void = { _ in }
    /// Tells whether strategies' `when` conditions hold (nil: no strategy
    /// has conditions, or they are ignored).
    public var conditions: ConditionMonitor?

    public init(
        registry: LeaseRegistry, scheduler: any WakeScheduling, clock: any VigilClock, logging: HostLogging,
        hooks: @escaping @Sendable (String, Logger) -> any HookRunning,
        events: @escaping @Sendable (String) -> any EventRecording
    ) {
        self.registry = registry
        self.scheduler = scheduler
        self.clock = clock
        self.logging = logging
        self.hooks = hooks
        self.events = events
    }
}

/// Runs each strategy instance as its own task, restarts one that throws
/// with exponential backoff and full jitter, and stops them in reverse start
/// order. No lease outlives its strategy: when a `run` ends, for whatever
/// reason, the strategy's leases are released.
public actor Supervisor {
    private let services: StrategyServices
    private let backoff: Backoff
    /// How long a strategy may take to return after cancellation.
    private let stopTimeout: Duration
    private var order: [String] = []
    private var tasks: [String: Task<Void, Never>] = [:]
    /// Each strategy's status, out of line (``OutOfLine``): a word per
    /// bucket of the table, not the hundred bytes of a status.
    private var status: [String: OutOfLine<StrategyStatus>] = [:]
    private var subscribers: [UInt64: AsyncStream<StrategyStatus>.Continuation] = [:]
    private var nextSubscriber: UInt64 = 0
    /// Each strategy's own last failure and its leases' errors, folded
    /// into its LastError.
    public nonisolated let errors: StrategyErrors

    public init(services: StrategyServices, backoff: Backoff = Backoff(initial: .seconds(1), maximum: .seconds(300)), stopTimeout: Duration = .seconds(10)) {
        self.services = services
        self.backoff = backoff
        self.stopTimeout = stopTimeout
        errors = StrategyErrors(clock: services.clock)
    }

    /// Current status of every strategy, in start order.
    public var statuses: [StrategyStatus] { order.compactMap { status[$0]?.value } }

    /// Every status change from now on; ends after ``endChanges()``.
    public func changes() -> AsyncStream<StrategyStatus> {
        let (stream, continuation) = AsyncStream.makeStream(of: StrategyStatus.self)
        guard !changesEnded else {
            continuation.finish()
            return stream
        }
        let key = nextSubscriber
        nextSubscriber += 1
        subscribers[key] = continuation
        // Unstructured task: not cancelled: one hop into the actor to forget the subscriber, from a
        // synchronous termination handler.
        continuation.onTermination = { [weak self] _ in Task { await self?.unsubscribe(key) } }
        return stream
    }

    private func unsubscribe(_ key: UInt64) { subscribers[key] = nil }

    /// True once ``endChanges()`` ran: every ``changes()`` stream ends
    /// after the statuses already published.
    public private(set) var changesEnded = false

    /// Ends every ``changes()`` stream (each still delivers what was
    /// published before): called once every strategy has stopped, so a
    /// follower (the D-Bus API) can finish showing the last statuses
    /// before it goes away.
    public func endChanges() {
        changesEnded = true
        for c in subscribers.values { c.finish() }
        subscribers = [:]
    }

    /// True once ``stopAll()`` began: the host is shutting down, and
    /// ``start(_:)`` starts nothing more (a reload that comes too late).
    public private(set) var stopping = false

    /// Starts strategies in the given order (none once ``stopping``).
    public func start(_ strategies: [SupervisedStrategy]) {
        guard !stopping else { return }
        for s in strategies where tasks[s.name] == nil {
            order.append(s.name)
            update(StrategyStatus(name: s.name, kind: s.kind, state: s.conditions == nil || services.conditions == nil ? .running : .waiting, restarts: 0, lastError: nil, startedAt: services.clock.now))
            // Unstructured task: cancelled by stop(_:) (stopAll at shutdown, or a reload), which
            // then waits for it.
            tasks[s.name] = Task { await self.supervise(s) }
        }
    }

    /// Stops every strategy, last started first.
    public func stopAll() async {
        stopping = true
        for name in order.reversed() { await stop(name) }
    }

    /// Stops one strategy and releases its leases.
    public func stop(_ name: String) async {
        guard let task = tasks.removeValue(forKey: name) else { return }
        task.cancel()
        let clock = services.clock
        let timeout = stopTimeout
        let log = services.logging.logger(name, metadata: ["strategy": .string(name)])
        let finished = await withTaskGroup(of: Bool.self) { group in
            group.addTask { await task.value; return true }
            group.addTask {
                do { try await clock.sleep(for: timeout); return false } catch { return true }
            }
            let first = await group.next() ?? true
            group.cancelAll()
            return first
        }
        if !finished {
            log.error("did not stop within \(timeout.vigilDescription) of cancellation; releasing its leases anyway")
        }
        await services.registry.releaseAll(strategy: name, detail: "strategy stopped")
        errors.forgetFailure(of: name)
        if var s = status[name]?.value {
            s.state = .stopped
            update(s)
        }
        order.removeAll { $0 == name }
    }

    // Memory: a task keeps the stack slabs of its deepest await chain until
    // it ends, and every strategy's task runs `supervise` and
    // `runWithRestarts` under its whole run (10,000 connections: every byte
    // of these frames counts 10,000 times). So what they keep across their
    // awaits is one reference (``StrategyRun``), and the rest (making the
    // context, a run's end and the backoff, and the loop of a strategy with
    // conditions, whose runs are tasks of their own) is in `@inline(never)`
    // functions, whose frames this task does not hold while the strategy runs.

    private func supervise(_ s: SupervisedStrategy) async {
        let run = makeRun(s)
        guard let conditions = s.conditions, let monitor = services.conditions else {
            await runWithRestarts(run)
            return
        }
        await superviseGated(run, conditions: conditions, monitor: monitor)
    }

    /// The strategy's context and wake owner, built once for all its runs.
    @inline(never)
    private func makeRun(_ s: SupervisedStrategy) -> StrategyRun {
        let log = services.logging.logger(s.name, metadata: ["strategy": .string(s.name)])
        let context = StrategyContext(
            name: s.name, kind: s.kind, log: log,
            leases: StrategyLeases(registry: services.registry, strategy: s.name) { [errors] in errors.leaseTaken(by: s.name) },
            scheduler: services.scheduler, hooks: services.hooks(s.name, log),
            clock: services.clock, events: services.events(s.name),
            store: services.store(s.name), bus: services.bus(s.name), cost: services.cost(s.name)
        )
        return StrategyRun(s, context: context)
    }

    /// A run starts each time the conditions come to hold and is cancelled
    /// (its leases released) each time they stop holding.
    @inline(never)
    private func superviseGated(_ r: StrategyRun, conditions: StrategyConditions, monitor: ConditionMonitor) async {
        var run: Task<Void, Never>?
        for await verdict in await monitor.verdicts(for: conditions) {
            if verdict.holds {
                guard run == nil else { continue }
                r.context.log.info("conditions hold; starting")
                // Unstructured task: cancelled below when the conditions stop holding, or when
                // supervise(_:) is cancelled.
                run = Task { await self.runWithRestarts(r) }
            } else {
                if let current = run {
                    r.context.log.info("waiting for \(verdict.waitingFor); stopping")
                    current.cancel()
                    await current.value
                    run = nil
                    await r.context.events.record("strategy-waiting", ["waiting_for": verdict.waitingFor])
                }
                setWaiting(r.name, verdict.waitingFor)
            }
        }
        if let run {
            run.cancel()
            await run.value
        }
    }

    /// Runs the strategy, restarting it with backoff when it throws, until
    /// it finishes or is cancelled.
    private func runWithRestarts(_ r: StrategyRun) async {
        var attempt = 0
        while !Task.isCancelled {
            let started = services.clock.now
            setState(r.name, .running)
            let failure: (any Error)?
            do {
                // The wakes it asks for name it (a system wake's attribution).
                try await WakeOwner.$current.withValue(r.owner) {
                    try await r.strategy.run(in: r.context)
                }
                failure = nil
            } catch {
                failure = error
            }
            guard await runEnded(r, failure: failure, started: started, attempt: &attempt) else { return }
        }
    }

    /// After a run: releases its leases; when it failed, records that and
    /// waits out the backoff. False when it is not to run again (it
    /// finished, or was cancelled).
    @inline(never)
    private func runEnded(_ r: StrategyRun, failure: (any Error)?, started: VigilInstant, attempt: inout Int) async -> Bool {
        await services.runEnded(r.name)
        let detail = failure == nil ? "strategy finished" : "strategy \(Task.isCancelled ? "stopped" : "failed")"
        await services.registry.releaseAll(strategy: r.name, detail: detail)
        guard let error = failure else {
            r.context.log.info("finished")
            setState(r.name, .finished)
            return false
        }
        if Task.isCancelled { return false }
        // A run that lasted longer than the longest backoff counts as
        // healthy: start the backoff sequence again.
        if services.clock.now - started > backoff.maximum { attempt = 0 }
        let delay = backoff.delay(attempt: attempt)
        attempt += 1
        r.context.log.error("failed: \(error); restart #\(attempt) in \(delay.vigilDescription)")
        recordFailure(r.name, "\(error)")
        await r.context.events.record("strategy-failed", ["error": "\(error)", "restart_in_ms": String(delay.microseconds / 1_000)])
        do { try await services.clock.sleep(for: delay) } catch { return false }
        return true
    }

    private func setState(_ name: String, _ state: StrategyRunState) {
        guard var s = status[name]?.value, s.state != state else { return }
        s.state = state
        s.waitingFor = ""
        update(s)
    }

    private func setWaiting(_ name: String, _ waitingFor: String) {
        guard var s = status[name]?.value, s.state != .waiting || s.waitingFor != waitingFor else { return }
        s.state = .waiting
        s.waitingFor = waitingFor
        update(s)
    }

    private func recordFailure(_ name: String, _ error: String) {
        guard var s = status[name]?.value else { return }
        s.restarts += 1
        (s.lastError, s.lastErrorWallMicros) = errors.recordFailure(of: name, error)
        s.state = .backoff
        update(s)
    }

    /// Folds each strategy's errors into its LastError as they change,
    /// until cancelled. The host observes the registry with ``errors`` and
    /// runs this; without it, LastError is the strategies' own failures.
    public func followErrors() async {
        for await name in errors.changes {
            guard var s = status[name]?.value else { continue }
            let newest = errors.newest(of: name)
            guard newest?.error != s.lastError || newest?.wallMicros != s.lastErrorWallMicros else { continue }
            s.lastError = newest?.error
            s.lastErrorWallMicros = newest?.wallMicros
            update(s)
        }
    }

    private func update(_ s: StrategyStatus) {
        status[s.name] = OutOfLine(s)
        for c in subscribers.values { c.yield(s) }
    }
}

/// What every run of one supervised strategy runs with, by reference: the
/// frames of `supervise` and `runWithRestarts` live as long as the
/// strategy, and a context is a few hundred bytes.
private final class StrategyRun: Sendable {
    let name: String
    let strategy: any KeepAliveStrategy
    let context: StrategyContext
    let owner: WakeOwner

    init(_ s: SupervisedStrategy, context: StrategyContext) {
        name = s.name
        strategy = s.strategy
        self.context = context
        owner = WakeOwner(strategy: s.name, kind: s.kind)
    }
}
