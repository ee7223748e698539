import Foundation
import VigilDBus
import VigilKit

/// The assembled host: one lease registry, one wake scheduler, one survival
/// store, the supervisor of the configured strategies, and what they share.
///
/// ``open(config:environment:)`` opens the store and begins a run
/// (classifying an unclean previous run as killed or rebooted), binds the
/// metrics listener and wires the parts together; it starts nothing that
/// runs on. What runs is services, each starting and stopping inside its own
/// `run()`, which the host makes from its parts (each given what it uses):
/// ``survivalRecorder(outcome:)``, ``metricsEndpoint()``, ``sleepCycle()``
/// and ``strategies(after:)``. vigild lists them, with the bus and its own
/// services, in one `ServiceGroup` (Sources/vigild/Vigild.swift), whose
/// order is the stop order reversed. ``reload()`` re-reads the config and
/// applies strategy differences.
public actor HostRuntime {
    /// The config in effect: the one started with, then each applied reload.
    public private(set) var config: VigilConfig
    /// The config file (fixed for the life of the run).
    public nonisolated let configPath: String
    public nonisolated let runId: String
    /// The vigild version this run records.
    nonisolated let version: String
    /// When this run started, on the runtime clock and on the wall clock
    /// (microseconds since the Unix epoch, as recorded in the survival log).
    nonisolated let startedAt: VigilInstant
    nonisolated let startedWallMicros: Int64
    public nonisolated let registry: LeaseRegistry
    /// Leases D-Bus clients hold (BeginBackgroundTask), in `registry` too.
    nonisolated let clientLeases: ClientLeases
    /// Apps' requests through the freedesktop inhibit APIs, as leases.
    nonisolated let inhibits: ForeignInhibits
    nonisolated let scheduler: any WakeScheduling
    nonisolated let supervisor: Supervisor
    /// Whether strategies' `when` conditions hold.
    nonisolated let conditions: ConditionMonitor
    /// What strategies put on D-Bus (StrategyContext.bus).
    nonisolated let strategyBus: StrategyBusBridge
    nonisolated let store: SurvivalStore
    nonisolated let clock: any VigilClock
    /// How the host and its strategies make their loggers; every logger
    /// says `run=<run id>`.
    nonisolated let logging: HostLogging
    /// The host's own lines (`vigild: ...`).
    nonisolated let log: Logger
    /// The Prometheus metrics (docs/metrics.md).
    nonisolated let metrics: HostMetrics
    /// What each strategy has cost since this run started.
    nonisolated let costs: StrategyCosts
    /// The `[metrics] listen` endpoint, bound; nil when not configured.
    private nonisolated let metricsListener: MetricsListener?
    private nonisolated let readings: @Sendable () -> ClockReadings
    /// `[host] survival_interval` (a `[host]` key: fixed for the run).
    private nonisolated let survivalInterval: Duration
    /// Writes lease events to the survival log.
    private nonisolated let leaseEvents: LeaseEventWriter
    /// Wake, work, sleep again; nil without logind (docs/survival.md).
    nonisolated let returnToSleep: ReturnToSleep?
    /// Suspends that broke leases, and the logind connection they follow; nil without logind.
    private nonisolated let sleepBreaks: (SleepBreaks, DBusConnection)?
    /// Records what woke the system at each resume.
    private nonisolated let resumeRecorder: ResumeRecorder
    private nonisolated let power: any PowerBackend
    /// Resolves kinds on reload: the loader that resolved the first config,
    /// so a kind's library is never registered twice.
    private let plugins: PluginLoader
    private let configOverrides: @Sendable (inout VigilConfig) -> Void
    /// The reload running now; the next one waits for it.
    private var reloadInFlight: Task<ReloadResult, Never>?
    /// Subscribers of ``healthChanges()`` (HostHealth.swift).
    var healthSubscribers: [UInt64: AsyncStream<HostHealth>.Continuation] = [:]
    var nextHealthSubscriber: UInt64 = 0

    public struct Environment: Sendable {
        public var clock: any VigilClock
        /// What lease budgets count (``LeaseRegistry/budgetClock``):
        /// ``AwakeClock`` in vigild; `clock` when nil.
        public var budgetClock: (any VigilClock)? = nil
        public var scheduler: any WakeScheduling
        /// How the host makes its loggers: `.bootstrapped(writer:)` in
        /// vigild, an explicit handler in tests.
        public var logging: HostLogging
        public var readings: @Sendable () -> ClockReadings
        public var power: any PowerBackend
        public var version: String
        /// The loader that resolved the config's kinds (from
        /// `ConfigLoader.loadWithPlugins`); `reload` resolves through it.
        /// Nil: a loader on the config's plugin search path.
        public var plugins: PluginLoader?
        /// Command-line overrides applied to the config at start (e.g.
        /// `--state-dir`); applied again to each reloaded config so they are
        /// not mistaken for `[host]` changes.
        public var configOverrides: @Sendable (inout VigilConfig) -> Void
        /// The time zone of `time` conditions (tests pick one with DST).
        public var timeZone: TimeZone = .current
        /// A network namespace the `network` watcher enters; tests only.
        public var networkNamespace: String? = nil
        /// Where the input event devices are (a person at the machine
        /// during a dark wake); tests point it elsewhere.
        public var inputDirectory: String = "/dev/input"

        public init(
            clock: any VigilClock, scheduler: any WakeScheduling, logging: HostLogging,
            readings: @escaping @Sendable () -> ClockReadings = { ClockReadings.now() },
            power: any PowerBackend = NoPowerBackend(), version: String,
            plugins: PluginLoader? = nil, configOverrides: @escaping @Sendable (inout VigilConfig) -> Void = { _ in }
        ) {
            self.clock = clock
            self.scheduler = scheduler
            self.logging = logging
            self.readings = readings
            self.power = power
            self.version = version
            self.plugins = plugins
            self.configOverrides = configOverrides
        }
    }

    private init(config: VigilConfig, env: Environment, store: SurvivalStore, runId: String,
                 startReadings: ClockReadings, metricsListener: MetricsListener?) {
        self.config = config
        self.configPath = config.path
        self.version = env.version
        self.startedAt = env.clock.now
        self.startedWallMicros = startReadings.wallMicros
        self.plugins = env.plugins ?? PluginLoader(searchPath: PluginLoader.defaultSearchPath(configured: config.host.pluginPath))
        self.configOverrides = env.configOverrides
        self.clock = env.clock
        self.scheduler = env.scheduler
        // Every line of this run, the host's and its strategies', says
        // which run it belongs to (`run=` as in the survival log).
        let logging = env.logging.adding(["run": .string(runId)])
        self.logging = logging
        let log = logging.logger("vigild")
        self.log = log
        self.readings = env.readings
        self.power = env.power
        self.survivalInterval = config.host.survivalInterval
        self.metricsListener = metricsListener
        self.leaseEvents = LeaseEventWriter(store: store, readings: env.readings)
        self.store = store
        self.runId = runId
        let registry = LeaseRegistry(clock: env.clock, budgetClock: env.budgetClock, backend: env.power)
        self.registry = registry
        // One policy for apps' inhibits and clients' leases: an app's budget counts both.
        let appPolicy = AppPolicy(settings: config.host.appLimits, clock: registry.budgetClock)
        self.clientLeases = ClientLeases(registry: registry, settings: config.host.clientLeases, policy: appPolicy, logging: logging)
        self.inhibits = ForeignInhibits(registry: registry, settings: config.host.inhibits, grace: config.host.clientLeases.grace, logging: logging, policy: appPolicy)
        let metrics = HostMetrics()
        self.metrics = metrics
        let costs = StrategyCosts(clock: env.clock)
        self.costs = costs
        let strategyBus = StrategyBusBridge(logging: logging)
        self.strategyBus = strategyBus
        var services = StrategyServices(
            registry: registry, scheduler: env.scheduler, clock: env.clock, logging: logging,
            hooks: { name, log in HookRunner(strategy: name, log: log, costs: costs) },
            events: { name in MetricsCountedEvents(
                inner: StoreEvents(store: store, strategy: name, readings: env.readings, log: logging.logger(name, metadata: ["strategy": .string(name)])),
                metrics: metrics, strategy: name) }
        )
        services.store = { name in HostStrategyStore(store: store, strategy: name) }
        services.bus = { name in strategyBus.bus(for: name) }
        services.runEnded = { name in await strategyBus.runEnded(name) }
        services.cost = { name in costs.recorder(for: name) }
        let conditions = ConditionMonitor(
            settings: ConditionMonitor.Settings(powerSupplyDir: config.host.powerSupplyDir, timeZone: env.timeZone, networkNamespace: env.networkNamespace),
            registry: registry, scheduler: env.scheduler, clock: env.clock, logging: logging)
        self.conditions = conditions
        services.conditions = conditions
        self.supervisor = Supervisor(services: services)
        self.resumeRecorder = ResumeRecorder(
            store: store, scheduler: env.scheduler as? WakeScheduler, runStartBoottimeMicros: startReadings.boottimeMicros, log: log, costs: costs)
        // Wake, work, sleep again, and sleep that broke a lease: both need
        // logind (its Suspend, inhibitors, sessions and PrepareForSleep).
        if let logind = env.power as? LogindPowerBackend {
            self.sleepBreaks = (SleepBreaks(
                registry: registry, clock: env.clock, readings: env.readings, runStartBoottimeMicros: startReadings.boottimeMicros, logging: logging,
                record: { broken, at in
                    metrics.sleepBroke(broken)
                    do { try await store.recordEvent(BrokenSleep.eventName, strategy: nil, fields: broken.fields, readings: at) } catch {
                        log.error("cannot record the sleep that broke leases: \(error)")
                    }
                }), logind.connection)
            let input = InputActivityWatcher(directory: env.inputDirectory, log: logging.logger("sleep"))
            self.returnToSleep = ReturnToSleep(
                settings: config.host.returnToSleep, registry: registry, system: LogindSleepSystem(connection: logind.connection),
                input: input, clock: env.clock, logging: logging, readings: env.readings,
                nextAlarm: { [scheduler = env.scheduler as? WakeScheduler] in await scheduler?.nextSystemWakeAlarm() },
                outcome: { dark, resume, at in
                    metrics.darkWake(dark)
                    do {
                        try await store.recordEvent(DarkWake.eventName, strategy: nil, fields: dark.fields(wokeBootMicros: resume.boottimeMicros), readings: at)
                    } catch {
                        log.error("cannot record the dark wake: \(error)")
                    }
                })
        } else {
            if config.host.returnToSleep.enabled {
                log.debug("return_to_sleep and broken-lease reports need the logind power backend; the backend is \(env.power.name)")
            }
            self.sleepBreaks = nil
            self.returnToSleep = nil
        }
    }

    /// Opens the survival store, begins a run and assembles the host; binds
    /// `[metrics] listen` first, so a taken port fails here, before the run
    /// begins. Nothing runs on until the services run.
    public static func open(config: VigilConfig, environment env: Environment) async throws -> HostRuntime {
        try FileManager.default.createDirectory(atPath: config.host.stateDir, withIntermediateDirectories: true)
        // Bound before the run begins, so a taken port fails the start cleanly.
        let listener = try config.host.metrics.listen.map { address throws(MetricsListenerError) in try MetricsListener(address: address) }
        let store = try SurvivalStore(path: HostPaths.survivalStore(stateDir: config.host.stateDir))
        let runId = try RunID.generate()
        let startReadings = env.readings()
        let began = try await store.beginRun(RunStart(
            runId: runId, pid: getpid(), bootID: (try? BootID.current()) ?? "unknown", version: env.version,
            configPath: config.path, interval: config.host.survivalInterval, readings: startReadings
        ))
        // From here on the run has its id, and its lines say so (`run=`).
        let host = HostRuntime(config: config, env: env, store: store, runId: runId,
                               startReadings: startReadings, metricsListener: listener)
        for run in began.closedRuns {
            host.log.warning("previous run \(run.runId) (pid \(run.pid)) had no clean end: \(run.endReason.rawValue); it was alive for \(run.alive.vigilDescription)")
        }
        await host.wire()
        if let listener {
            host.log.notice("metrics on http://\(MetricsListenAddress(host: listener.address.host, port: listener.port))/metrics")
        }
        return host
    }

    /// Shows the registry's changes to those that count them (costs,
    /// metrics, the survival log's lease events, strategies' LastError) and
    /// the scheduler's timers to the costs and metrics: before any strategy
    /// starts, so nothing goes unseen.
    private func wire() async {
        let costs = self.costs, metrics = self.metrics
        await registry.observe(costs)
        if let scheduler = scheduler as? WakeScheduler {
            await scheduler.observeExpirations { costs.timerExpired(firing: $0) }
        }
        await registry.observe(metrics)
        if let scheduler = scheduler as? WakeScheduler {
            await scheduler.observeLateness { metrics.observeLateness($0) }
        }
        await registry.observe(leaseEvents.observer)
        await registry.observe(supervisor.errors)
    }

    // MARK: the services

    /// The run's record (lease events, heartbeats, its end with `outcome`'s
    /// reason): first in the group, so it stops last.
    public nonisolated func survivalRecorder(outcome: RunOutcome) -> SurvivalRecorder {
        let registry = self.registry, costs = self.costs, inhibits = self.inhibits, logging = self.logging
        let heartbeat = HeartbeatWriter(
            store: store, interval: survivalInterval, scheduler: scheduler, clock: clock, readings: readings, log: log,
            sources: HeartbeatWriter.Sources(
                activeLeases: {
                    await registry.active.map {
                        HeartbeatLease(id: $0.id.rawValue, strategy: $0.strategy, holds: $0.holds, state: $0.state.rawValue)
                    }
                },
                costs: { costs.all() },
                apps: { await inhibits.policy.appCountsByName() },
                healthChanged: { [weak self] in await self?.publishHealth() },
                afterBeat: { [weak self] _ in await self?.writeMetricsTextfile() }))
        return SurvivalRecorder(
            store: store, runId: runId, leaseEvents: leaseEvents, heartbeat: heartbeat, outcome: outcome,
            end: SurvivalRecorder.RunEnd(
                costs: { costs.all() },
                apps: { await inhibits.policy.appCountsByName() },
                droppedLogLines: { logging.droppedLines },
                afterEnd: { [weak self] in await self?.writeMetricsTextfile() }),
            readings: readings, log: log)
    }

    /// `/metrics` over HTTP, when `[metrics] listen` is configured.
    public nonisolated func metricsEndpoint() -> MetricsEndpoint? {
        metricsListener.map { MetricsEndpoint(listener: $0) { [weak self] in await self?.metricsExposition() ?? [] } }
    }

    /// What woke the system, and (with logind) wake, work, sleep again and
    /// sleep that broke a lease.
    public nonisolated func sleepCycle() -> SleepCycleService {
        let registry = self.registry, recorder = resumeRecorder, cycle = returnToSleep, breaks = sleepBreaks?.0
        return SleepCycleService(
            parts: SleepCycleService.Parts(
                sleepBreaks: sleepBreaks, returnToSleep: returnToSleep,
                resumed: { resume, slept in
                    await registry.systemResumed()
                    let wake = await recorder.resumed(resume, suspendedMicros: slept)
                    await breaks?.resumed(wake, boottimeMicros: resume.boottimeMicros)
                    await cycle?.resumed(wake, readings: resume)
                },
                readings: readings),
            log: log)
    }

    /// The configured strategies, the client leases and the apps' inhibits,
    /// started once `after` is (the sleep cycle).
    public func strategies(after: Started?) -> StrategiesService {
        let config = self.config, power = self.power, scheduler = self.scheduler, runId = self.runId, log = self.log
        return StrategiesService(
            parts: StrategiesService.Parts(
                supervisor: supervisor, registry: registry, conditions: conditions, clientLeases: clientLeases, inhibits: inhibits),
            strategies: config.strategies.map(\.supervised),
            after: after,
            announce: {
                // One short line for the terminal (what runs, and where to look);
                // why the clock and the backend are what they are is long, and
                // `vigilctl status` shows it too.
                let names = config.strategies.map(\.name).joined(separator: ", ")
                let what = "\(config.strategies.count) strateg\(config.strategies.count == 1 ? "y" : "ies")"
                    + (config.strategies.isEmpty || names.count > 40 ? "" : " (\(names))")
                log.notice("run \(runId) started with \(what), power backend \(power.name); see vigilctl status")
                log.debug("wake clock \(scheduler.clockInfo.clock) (\(scheduler.clockInfo.reason)); power backend \(power.name) (\(power.reason))")
            },
            log: log)
    }

    /// The Prometheus exposition of the host now.
    public func metricsExposition() async -> [UInt8] {
        await metrics.exposition(of: self)
    }

    /// Writes `[metrics] textfile`, if configured (at each heartbeat).
    func writeMetricsTextfile() async {
        guard let path = config.host.metrics.textfile else { return }
        do {
            try MetricsTextfile.write(await metricsExposition(), to: path)
        } catch {
            log.error("\(error)")
        }
    }

    /// The broken sleeps from now on (the D-Bus signal's source); an
    /// ended stream without logind.
    public func sleepBreakStream() async -> AsyncStream<BrokenSleep> {
        guard let breaks = sleepBreaks?.0 else { return AsyncStream { $0.finish() } }
        return await breaks.breaks()
    }

    /// The configured strategy called `name` in the config in effect.
    public func configuredStrategy(named name: String) -> ConfiguredStrategy? {
        config.strategies.first { $0.name == name }
    }

    /// Re-reads the config file and applies what changed.
    ///
    /// Invalid (or unreadable): nothing changes; `messages` are the problems,
    /// one `file:line:column: key: message` line each. Valid: strategies are
    /// compared by name; removed ones stop, added ones start, changed ones
    /// (kind or table differ) stop and start again with the new table, and
    /// unchanged ones keep running with their leases. `[host]` differences
    /// are reported but need a restart. Reloads run one at a time.
    public func reload() async -> ReloadResult {
        let previous = reloadInFlight
        // Unstructured task: not cancelled: reloads run one after another, each awaiting the one
        // before, and the caller awaits this one; a reload is not stopped halfway.
        let task = Task { () async -> ReloadResult in
            _ = await previous?.value
            return await self.applyReload()
        }
        reloadInFlight = task
        return await task.value
    }

    private func applyReload() async -> ReloadResult {
        guard await !supervisor.stopping else {
            return ReloadResult(applied: false, messages: ["vigild is shutting down; nothing was reloaded"])
        }
        var fresh: VigilConfig
        switch Self.readConfig(path: configPath, resolver: plugins) {
        case .failure(let error):
            let lines = error.problems.map { $0.location == nil ? "\(error.path): \($0)" : $0.description }
            log.error("reload: \(configPath) is invalid; nothing changed\n\(error)")
            return ReloadResult(applied: false, messages: lines)
        case .success(let config):
            fresh = config
        }
        configOverrides(&fresh)
        let diff = ConfigDiff(old: config, new: fresh)
        // Unchanged strategies keep their running instance.
        let running = Dictionary(config.strategies.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        fresh.strategies = fresh.strategies.map { s in
            guard diff.unchanged.contains(s.name), var kept = running[s.name] else { return s }
            kept.index = s.index
            return kept
        }
        let effective = VigilConfig(path: fresh.path, host: config.host, strategies: fresh.strategies, notes: fresh.notes)
        config = effective
        for name in diff.removed.reversed() { await supervisor.stop(name) }
        for name in diff.changed.reversed() { await supervisor.stop(name) }
        let toStart = Set(diff.added + diff.changed)
        await supervisor.start(effective.strategies.filter { toStart.contains($0.name) }.map(\.supervised))
        let messages = diff.messages
        for message in messages { log.notice("reload: \(message)") }
        return ReloadResult(applied: true, messages: messages)
    }

    /// Reads and validates a config file with `resolver`, without throwing.
    static func readConfig(path: String, resolver: any KindResolver) -> Result<VigilConfig, ConfigError> {
        let document: ConfigDocument
        do {
            document = try ConfigLoader.loadDocument(path: path)
        } catch {
            return .failure(error)
        }
        return ConfigLoader.validate(document, resolver: resolver)
    }

    /// Records events in the survival log under `source` (e.g. "host").
    public nonisolated func events(for source: String) -> any EventRecording {
        StoreEvents(store: store, strategy: source, readings: readings, log: logging.logger(source))
    }
}

extension ConfiguredStrategy {
    /// What the supervisor runs of it.
    var supervised: SupervisedStrategy {
        SupervisedStrategy(name: name, kind: kind, strategy: strategy, conditions: conditions)
    }
}

/// A strategy's events, written to the survival log with both clocks.
struct StoreEvents: EventRecording {
    let store: SurvivalStore
    let strategy: String
    let readings: @Sendable () -> ClockReadings
    let log: Logger

    func record(_ event: String, _ fields: [String: String]) async {
        do {
            try await store.recordEvent(event, strategy: strategy, fields: fields, readings: readings())
        } catch let error as SurvivalStoreError where error.code == .unwritable {
            // The heartbeat reports the outage once; an event per lease
            // change would repeat it many times a second.
            log.debug("cannot record event \(event): \(error)")
        } catch {
            log.error("cannot record event \(event): \(error)")
        }
    }
}

/// What `HostRuntime.reload` did.
public struct ReloadResult: Sendable, Hashable {
    /// False when the config was invalid and nothing changed.
    public var applied: Bool
    /// The problems (not applied) or what changed (applied), for people.
    public var messages: [String]

    public init(applied: Bool, messages: [String]) {
        self.applied = applied
        self.messages = messages
    }
}

/// The differences between the running config and a reloaded one.
struct ConfigDiff {
    /// Strategy names, each list in the order of the config it comes from.
    var added: [String] = []
    var removed: [String] = []
    /// Kind or table differ: restarted with the new table.
    var changed: [String] = []
    var unchanged: Set<String> = []
    /// `[host]` keys whose values differ (need a restart).
    var hostKeys: [String] = []

    init(old: VigilConfig, new: VigilConfig) {
        let before = Dictionary(old.strategies.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        let after = Set(new.strategies.map(\.name))
        removed = old.strategies.map(\.name).filter { !after.contains($0) }
        for s in new.strategies {
            guard let previous = before[s.name] else {
                added.append(s.name)
                continue
            }
            if previous.kind != s.kind || previous.values != s.values {
                changed.append(s.name)
            } else {
                unchanged.insert(s.name)
            }
        }
        hostKeys = Self.differingKeys(old.host, new.host)
    }

    var messages: [String] {
        var lines: [String] = []
        lines += removed.map { "stopped strategy \"\($0)\": removed from the config" }
        lines += added.map { "started strategy \"\($0)\": added to the config" }
        lines += changed.map { "restarted strategy \"\($0)\": its configuration changed" }
        if !hostKeys.isEmpty {
            let keys = hostKeys.map { "[host] \($0)" }.joined(separator: ", ")
            lines.append("\(keys) changed: restart vigild to apply")
        }
        if lines.isEmpty { lines.append("no changes") }
        return lines
    }

    /// The `[host]` keys (snake_case, as written in the file) whose values
    /// differ, found by reflection so that a new `[host]` key needs no code here.
    static func differingKeys(_ a: HostSettings, _ b: HostSettings) -> [String] {
        guard a != b else { return [] }
        let left = Mirror(reflecting: a).children, right = Mirror(reflecting: b).children
        var keys: [String] = []
        for (l, r) in zip(left, right) where String(describing: l.value) != String(describing: r.value) {
            // One property for two keys: name the keys.
            if l.label == "appLimits" {
                if a.appLimits.caps != b.appLimits.caps { keys.append("app_max") }
                if a.appLimits.budgets != b.appLimits.budgets { keys.append("app_budget") }
                continue
            }
            keys.append(snakeCase(l.label ?? "?"))
        }
        return keys.isEmpty ? ["settings"] : keys
    }

    static func snakeCase(_ name: String) -> String {
        var out = ""
        for c in name {
            if c.isUppercase {
                out += "_" + c.lowercased()
            } else {
                out.append(c)
            }
        }
        return out
    }
}
