import Foundation
import VigilKit

/// The running host: one lease registry, one wake scheduler, one survival
/// store, and the supervisor running the configured strategies.
///
/// `start` opens the store and begins a run (classifying an unclean previous
/// run as killed or rebooted), starts the heartbeat and the strategies;
/// `shutdown` stops strategies in reverse start order, releases every lease,
/// and writes the final heartbeat and a clean end.
public actor HostRuntime {
    public nonisolated let config: VigilConfig
    public nonisolated let runId: String
    public nonisolated let registry: LeaseRegistry
    public nonisolated let scheduler: any WakeScheduling
    public nonisolated let supervisor: Supervisor
    public nonisolated let store: SurvivalStore
    public nonisolated let clock: any VigilClock
    /// What `beginRun` found about the previous run.
    public nonisolated let began: RunBegan
    private let logSink: any LogSink
    private let readings: @Sendable () -> ClockReadings
    private var background: [Task<Void, Never>] = []
    private var stopped = false

    public struct Environment: Sendable {
        public var clock: any VigilClock
        public var scheduler: any WakeScheduling
        public var logSink: any LogSink
        public var readings: @Sendable () -> ClockReadings
        public var power: any PowerBackend
        public var version: String

        public init(
            clock: any VigilClock, scheduler: any WakeScheduling, logSink: any LogSink,
            readings: @escaping @Sendable () -> ClockReadings = { ClockReadings.now() },
            power: any PowerBackend = NoPowerBackend(), version: String
        ) {
            self.clock = clock
            self.scheduler = scheduler
            self.logSink = logSink
            self.readings = readings
            self.power = power
            self.version = version
        }
    }

    private init(config: VigilConfig, env: Environment, store: SurvivalStore, began: RunBegan, runId: String) {
        self.config = config
        self.clock = env.clock
        self.scheduler = env.scheduler
        self.logSink = env.logSink
        self.readings = env.readings
        self.store = store
        self.began = began
        self.runId = runId
        let registry = LeaseRegistry(clock: env.clock, backend: env.power)
        self.registry = registry
        let logSink = env.logSink
        self.supervisor = Supervisor(services: StrategyServices(
            registry: registry, scheduler: env.scheduler, clock: env.clock, logSink: env.logSink,
            hooks: { name, log in HookRunner(strategy: name, log: log) },
            events: { name in StoreEvents(store: store, strategy: name, readings: env.readings, log: StrategyLogger(source: name, sink: logSink)) }
        ))
    }

    /// Opens the survival store, begins a run and starts everything.
    public static func start(config: VigilConfig, environment env: Environment) async throws -> HostRuntime {
        let log = StrategyLogger(source: "vigild", sink: env.logSink)
        try FileManager.default.createDirectory(atPath: config.host.stateDir, withIntermediateDirectories: true)
        let store = try SurvivalStore(path: HostPaths.survivalStore(stateDir: config.host.stateDir))
        let runId = UUID().uuidString.lowercased()
        let began = try await store.beginRun(RunStart(
            runId: runId, pid: getpid(), bootID: (try? BootID.current()) ?? "unknown", version: env.version,
            configPath: config.path, interval: config.host.survivalInterval, readings: env.readings()
        ))
        for run in began.closedRuns {
            log.warning("previous run \(run.runId) (pid \(run.pid)) had no clean end: \(run.endReason.rawValue); it was alive for \(run.alive.vigilDescription)")
        }
        let host = HostRuntime(config: config, env: env, store: store, began: began, runId: runId)
        await host.startBackground(leaseEvents: await host.registry.events())
        await host.supervisor.start(config.strategies.map {
            SupervisedStrategy(name: $0.name, kind: $0.kind, strategy: $0.strategy)
        })
        log.notice("run \(runId) started with \(config.strategies.count) strateg\(config.strategies.count == 1 ? "y" : "ies"); wake clock \(env.scheduler.clockInfo.clock) (\(env.scheduler.clockInfo.reason)); power backend \(env.power.name) (\(env.power.reason))")
        return host
    }

    private func startBackground(leaseEvents: AsyncStream<LeaseEvent>) {
        let interval = config.host.survivalInterval
        let scheduler = self.scheduler
        let clock = self.clock
        let store = self.store
        let registry = self.registry
        let readings = self.readings
        let log = StrategyLogger(source: "vigild", sink: logSink)
        // The heartbeat is a wake request like any other, on a fixed grid from
        // the start of the run so that coalescing never makes it drift.
        background.append(Task {
            let start = clock.now
            var k: Int64 = 1
            let tolerance = min(interval / 10, .seconds(5))
            while !Task.isCancelled {
                let target = start + interval * Int(k)
                do {
                    _ = try await scheduler.wake(WakeRequest(earliest: target - tolerance, latest: target, label: "survival heartbeat"))
                } catch { return }
                let leases = await registry.active.map {
                    HeartbeatLease(id: $0.id.rawValue, strategy: $0.strategy, holds: $0.holds, state: $0.state.rawValue)
                }
                do {
                    try await store.heartbeat(readings(), leases: leases)
                    log.debug("heartbeat \(k) written (\(leases.count) active lease\(leases.count == 1 ? "" : "s"))")
                } catch {
                    log.error("cannot write heartbeat: \(error)")
                }
                // After a stall or suspend, continue with the next future slot.
                let elapsed = clock.now - start
                k = max(k + 1, Int64(elapsed / interval) + 1)
            }
        })
        // Lease changes go to the survival log's event table.
        background.append(Task {
            for await event in leaseEvents {
                var fields = ["lease": String(event.lease.id.rawValue), "holds": event.lease.holds]
                if !event.detail.isEmpty { fields["detail"] = event.detail }
                if event.forced { fields["forced"] = "true" }
                try? await store.recordEvent("lease-\(event.kind.rawValue)", strategy: event.lease.strategy, fields: fields, readings: readings())
            }
        })
    }

    /// Stops strategies (reverse start order), releases every lease, writes
    /// the final heartbeat and a clean end. Idempotent.
    public func shutdown(reason: RunEndReason = .stopped) async {
        guard !stopped else { return }
        stopped = true
        let log = StrategyLogger(source: "vigild", sink: logSink)
        log.notice("shutting down")
        await supervisor.stopAll()
        await registry.releaseEverything(detail: "host shutting down")
        await clock.settleIfManual()
        for task in background { task.cancel() }
        for task in background { await task.value }
        do { try await store.endRun(reason: reason, readings: readings()) } catch {
            log.error("cannot record the end of run \(runId): \(error)")
        }
        log.notice("run \(runId) ended: \(reason.rawValue)")
    }
}

extension VigilClock {
    /// Lets a test clock's woken tasks finish; nothing for the real clock.
    func settleIfManual() async {
        if let manual = self as? ManualClock { await manual.settle() }
    }
}

/// A strategy's events, written to the survival log with both clocks.
struct StoreEvents: EventRecording {
    let store: SurvivalStore
    let strategy: String
    let readings: @Sendable () -> ClockReadings
    let log: StrategyLogger

    func record(_ event: String, _ fields: [String: String]) async {
        do {
            try await store.recordEvent(event, strategy: strategy, fields: fields, readings: readings())
        } catch {
            log.error("cannot record event \(event): \(error)")
        }
    }
}
