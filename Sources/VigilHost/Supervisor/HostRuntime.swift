import Foundation
import ServiceLifecycle
import VigilKit

/// The running host: one lease registry, one wake scheduler, one survival
/// store, and the supervisor running the configured strategies.
///
/// `start` opens the store and begins a run (classifying an unclean previous
/// run as killed or rebooted) and starts the strategies; `reload` re-reads
/// the config and applies strategy differences.
///
/// The rest is services in one `ServiceGroup` (vigild's, or a test's), whose
/// order is the stop order reversed: ``backgroundServices()`` (the lease
/// events, the heartbeat, the metrics listener, the resume watcher), then
/// the runtime itself, a `Service` whose graceful shutdown stops the
/// strategies in reverse start order and releases every lease. After the
/// group has stopped, ``finish(reason:)`` writes the final heartbeat and the
/// end of the run.
public actor HostRuntime: Service {
    /// The config in effect: the one started with, then each applied reload.
    public private(set) var config: VigilConfig
    /// The config file (fixed for the life of the run).
    public nonisolated let configPath: String
    public nonisolated let runId: String
    /// The vigild version this run records.
    public nonisolated let version: String
    /// When this run started, on the runtime clock and on the wall clock
    /// (microseconds since the Unix epoch, as recorded in the survival log).
    public nonisolated let startedAt: VigilInstant
    public nonisolated let startedWallMicros: Int64
    public nonisolated let registry: LeaseRegistry
    /// Leases D-Bus clients hold (BeginBackgroundTask), in `registry` too.
    public nonisolated let clientLeases: ClientLeases
    /// Apps' requests through the freedesktop inhibit APIs, as leases.
    public nonisolated let inhibits: ForeignInhibits
    public nonisolated let scheduler: any WakeScheduling
    public nonisolated let supervisor: Supervisor
    /// Whether strategies' `when` conditions hold.
    public nonisolated let conditions: ConditionMonitor
    /// What strategies put on D-Bus (StrategyContext.bus).
    public nonisolated let strategyBus: StrategyBusBridge
    public nonisolated let store: SurvivalStore
    public nonisolated let clock: any VigilClock
    /// What `beginRun` found about the previous run.
    public nonisolated let began: RunBegan
    /// How the host and its strategies make their loggers; every logger
    /// says `run=<run id>`.
    public nonisolated let logging: HostLogging
    /// The host's own lines (`vigild: ...`).
    nonisolated let log: Logger
    /// The Prometheus metrics (docs/metrics.md).
    public nonisolated let metrics: HostMetrics
    /// What each strategy has cost since this run started.
    public nonisolated let costs: StrategyCosts
    /// The `[metrics] listen` endpoint, when configured.
    private var metricsListener: MetricsListener?
    private let readings: @Sendable () -> ClockReadings
    /// `[host] survival_interval` (a `[host]` key: fixed for the run).
    private nonisolated let survivalInterval: Duration
    private var background: [Task<Void, Never>] = []
    /// Writes lease events to the survival log.
    private let leaseEvents: LeaseEventWriter
    /// Sees each system resume and records what woke the system.
    private var resumeWatcher: ResumeWatcher?
    /// Wake, work, sleep again; nil without logind (docs/survival.md).
    public private(set) var returnToSleep: ReturnToSleep?
    /// Suspends that broke leases; nil without logind.
    public private(set) var sleepBreaks: SleepBreaks?
    private let power: any PowerBackend
    private let inputDirectory: String
    /// The strategies are stopping or stopped (``run()`` was shut down).
    private var stopped = false
    /// ``finish(reason:)`` ran.
    private var finished = false
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

    private init(config: VigilConfig, env: Environment, store: SurvivalStore, began: RunBegan, runId: String, startedWallMicros: Int64) {
        self.config = config
        self.configPath = config.path
        self.version = env.version
        self.startedAt = env.clock.now
        self.startedWallMicros = startedWallMicros
        self.plugins = env.plugins ?? PluginLoader(searchPath: PluginLoader.defaultSearchPath(configured: config.host.pluginPath))
        self.configOverrides = env.configOverrides
        self.clock = env.clock
        self.scheduler = env.scheduler
        // Every line of this run, the host's and its strategies', says
        // which run it belongs to (`run=` as in the survival log).
        let logging = env.logging.adding(["run": .string(runId)])
        self.logging = logging
        self.log = logging.logger("vigild")
        self.readings = env.readings
        self.power = env.power
        self.inputDirectory = env.inputDirectory
        self.survivalInterval = config.host.survivalInterval
        self.leaseEvents = LeaseEventWriter(store: store, readings: env.readings)
        self.store = store
        self.began = began
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
    }

    /// Opens the survival store, begins a run and starts everything.
    public static func start(config: VigilConfig, environment env: Environment) async throws -> HostRuntime {
        try FileManager.default.createDirectory(atPath: config.host.stateDir, withIntermediateDirectories: true)
        // Bound before the run begins, so a taken port fails the start cleanly.
        let listener = try config.host.metrics.listen.map { address throws(MetricsListenerError) in try MetricsListener(address: address) }
        let store = try SurvivalStore(path: HostPaths.survivalStore(stateDir: config.host.stateDir))
        let runId = try RunID.generate()
        // From here on the run has its id, and its lines say so (`run=`).
        let runLog = env.logging.adding(["run": .string(runId)]).logger("vigild")
        let startReadings = env.readings()
        let began = try await store.beginRun(RunStart(
            runId: runId, pid: getpid(), bootID: (try? BootID.current()) ?? "unknown", version: env.version,
            configPath: config.path, interval: config.host.survivalInterval, readings: startReadings
        ))
        for run in began.closedRuns {
            runLog.warning("previous run \(run.runId) (pid \(run.pid)) had no clean end: \(run.endReason.rawValue); it was alive for \(run.alive.vigilDescription)")
        }
        let host = HostRuntime(config: config, env: env, store: store, began: began, runId: runId, startedWallMicros: startReadings.wallMicros)
        await host.startCosts()
        await host.startMetrics(listener: listener)
        await host.registry.observe(host.leaseEvents.observer)
        await host.followStrategyErrors()
        await host.startSleepCycle(startBoottimeMicros: startReadings.boottimeMicros)
        await host.startResumeWatch(startBoottimeMicros: startReadings.boottimeMicros)
        await host.clientLeases.start()
        await host.inhibits.start()
        await host.supervisor.start(config.strategies.map {
            SupervisedStrategy(name: $0.name, kind: $0.kind, strategy: $0.strategy, conditions: $0.conditions)
        })
        // One short line for the terminal (what runs, and where to look);
        // why the clock and the backend are what they are is long, and
        // `vigilctl status` shows it too.
        let names = config.strategies.map(\.name).joined(separator: ", ")
        let what = "\(config.strategies.count) strateg\(config.strategies.count == 1 ? "y" : "ies")"
            + (config.strategies.isEmpty || names.count > 40 ? "" : " (\(names))")
        runLog.notice("run \(runId) started with \(what), power backend \(env.power.name); see vigilctl status")
        runLog.debug("wake clock \(env.scheduler.clockInfo.clock) (\(env.scheduler.clockInfo.reason)); power backend \(env.power.name) (\(env.power.reason))")
        return host
    }

    /// Strategies' LastError includes their leases' (before any strategy
    /// starts, so no lease error goes unseen).
    private func followStrategyErrors() async {
        let supervisor = self.supervisor
        await registry.observe(supervisor.errors)
        // Unstructured task: cancelled by stopStrategies() (the end of run()) with the other
        // `background` tasks, which it then awaits.
        background.append(Task { await supervisor.followErrors() })
    }

    /// The cost counters follow the registry and the scheduler from before
    /// any strategy starts.
    private func startCosts() async {
        let costs = self.costs
        await registry.observe(costs)
        if let scheduler = scheduler as? WakeScheduler {
            await scheduler.observeExpirations { costs.timerExpired(firing: $0) }
        }
    }

    private func startMetrics(listener: MetricsListener?) async {
        let metrics = self.metrics
        await registry.observe(metrics)
        if let scheduler = scheduler as? WakeScheduler {
            await scheduler.observeLateness { metrics.observeLateness($0) }
        }
        if let listener {
            listener.start { [weak self] in await self?.metricsExposition() ?? [] }
            metricsListener = listener
            log.notice("metrics on http://\(MetricsListenAddress(host: listener.address.host, port: listener.port))/metrics")
        }
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

    /// The services that keep the run's record and watch the system, in start
    /// order: the lease events, the heartbeat, the metrics listener and the
    /// resume watcher. List them before the runtime itself in the group, so
    /// that they stop after it: the lease events and costs of the stopping
    /// strategies are still written.
    public nonisolated func backgroundServices() -> [ServiceGroupConfiguration.ServiceConfiguration] {
        let registry = self.registry, costs = self.costs
        let heartbeat = HeartbeatWriter(
            store: store, interval: survivalInterval, scheduler: scheduler, clock: clock, readings: readings, log: log,
            sources: HeartbeatWriter.Sources(
                activeLeases: {
                    await registry.active.map {
                        HeartbeatLease(id: $0.id.rawValue, strategy: $0.strategy, holds: $0.holds, state: $0.state.rawValue)
                    }
                },
                costs: { costs.all() },
                apps: { [inhibits] in await inhibits.policy.appCountsByName() },
                healthChanged: { [weak self] in await self?.publishHealth() },
                afterBeat: { [weak self] first in await self?.afterHeartbeat(first: first) }))
        // The writers end only when the wake scheduler fails (the heartbeat)
        // or at shutdown: a heartbeat that ends early leaves the host running,
        // as a missing heartbeat is what the survival log is there to show.
        return [
            .init(service: leaseEvents, successTerminationBehavior: .ignore, serviceName: "survival lease events"),
            .init(service: heartbeat, successTerminationBehavior: .ignore, serviceName: "survival heartbeat"),
            .init(service: StopAtShutdown("metrics listener") { [weak self] in await self?.stopMetricsListener() }, serviceName: "metrics listener"),
            .init(service: StopAtShutdown("resume watcher") { [weak self] in await self?.stopResumeWatch() }, serviceName: "resume watcher"),
        ]
    }

    private func stopMetricsListener() {
        metricsListener?.stop()
    }

    private func stopResumeWatch() async {
        resumeWatcher?.invalidate()
        await returnToSleep?.stop()
        await sleepBreaks?.stop()
    }

    /// Wake, work, sleep again, and sleep that broke a lease: both need
    /// logind (its Suspend, inhibitors, sessions and PrepareForSleep).
    private func startSleepCycle(startBoottimeMicros: Int64) async {
        guard let logind = power as? LogindPowerBackend else {
            if config.host.returnToSleep.enabled {
                log.debug("return_to_sleep and broken-lease reports need the logind power backend; the backend is \(power.name)")
            }
            return
        }
        let store = self.store, metrics = self.metrics, log = self.log
        let breaks = SleepBreaks(
            registry: registry, clock: clock, readings: readings, runStartBoottimeMicros: startBoottimeMicros, logging: logging,
            record: { broken, at in
                metrics.sleepBroke(broken)
                do { try await store.recordEvent(BrokenSleep.eventName, strategy: nil, fields: broken.fields, readings: at) } catch {
                    log.error("cannot record the sleep that broke leases: \(error)")
                }
            })
        do {
            try await breaks.watch(logind.connection)
            sleepBreaks = breaks
        } catch {
            log.warning("cannot follow logind's PrepareForSleep, so sleep that breaks a lease is not reported: \(error)")
        }
        let input = InputActivityWatcher(directory: inputDirectory, log: logging.logger("sleep"))
        let cycle = ReturnToSleep(
            settings: config.host.returnToSleep, registry: registry, system: LogindSleepSystem(connection: logind.connection),
            input: input, clock: clock, logging: logging, readings: readings,
            outcome: { dark, resume, at in
                metrics.darkWake(dark)
                do {
                    try await store.recordEvent(DarkWake.eventName, strategy: nil, fields: dark.fields(wokeBootMicros: resume.boottimeMicros), readings: at)
                } catch {
                    log.error("cannot record the dark wake: \(error)")
                }
            })
        await cycle.start()
        returnToSleep = cycle
    }

    /// The broken sleeps from now on (the D-Bus signal's source); an
    /// ended stream without logind.
    public func sleepBreakStream() async -> AsyncStream<BrokenSleep> {
        guard let sleepBreaks else { return AsyncStream { $0.finish() } }
        return await sleepBreaks.breaks()
    }

    /// After each heartbeat: the metrics textfile.
    private func afterHeartbeat(first: Bool) async {
        await writeMetricsTextfile()
    }

    /// Watches for resumes (see ``ResumeWatcher``); without the timerfd the
    /// host runs on and the survival log still shows suspends, without cause.
    private func startResumeWatch(startBoottimeMicros: Int64) {
        let recorder = ResumeRecorder(
            store: store, scheduler: scheduler as? WakeScheduler, runStartBoottimeMicros: startBoottimeMicros, log: log, costs: costs)
        do {
            let cycle = returnToSleep, breaks = sleepBreaks
            resumeWatcher = try ResumeWatcher(readings: readings) { [registry] resume, slept in
                await registry.systemResumed()
                let wake = await recorder.resumed(resume, suspendedMicros: slept)
                await breaks?.resumed(wake, boottimeMicros: resume.boottimeMicros)
                await cycle?.resumed(wake, readings: resume)
            }
        } catch {
            log.warning("cannot watch for system resumes, so wakes are not attributed: \(error)")
        }
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
        guard !stopped else {
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
        await supervisor.start(effective.strategies.filter { toStart.contains($0.name) }.map {
            SupervisedStrategy(name: $0.name, kind: $0.kind, strategy: $0.strategy, conditions: $0.conditions)
        })
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

    /// Runs until the group shuts down gracefully (or the task is
    /// cancelled), then stops the strategies.
    public func run() async {
        try? await gracefulShutdown()
        await stopStrategies()
    }

    /// Stops strategies (reverse start order), each given its stop timeout,
    /// and releases every lease (the client leases and the apps' inhibits
    /// too). Then no strategy status or lease change follows: their streams
    /// end, so the D-Bus API can show the last of them before it closes.
    private func stopStrategies() async {
        guard !stopped else { return }
        stopped = true
        log.notice("shutting down")
        await clientLeases.refuseNewLeases()
        await supervisor.stopAll()
        await supervisor.endChanges()
        await conditions.stop()
        await registry.releaseEverything(detail: "host shutting down")
        await clientLeases.stop()
        await inhibits.stop()
        await registry.endChanges()
        for task in background { task.cancel() }
        for task in background { await task.value }
    }

    /// Ends the run once its services (the group) have stopped: counts the log lines that
    /// could not be written, writes the final heartbeat and the end of the run
    /// (`reason`), and a last metrics textfile. Idempotent.
    public func finish(reason: RunEndReason = .stopped) async {
        guard !finished else { return }
        finished = true
        // Log lines that could not be written (stderr full or closed) are
        // counted in the survival log, which outlives the lost lines.
        let dropped = await health().droppedLogLines
        if dropped > 0 {
            try? await store.recordEvent("log-lines-dropped", strategy: nil, fields: ["count": String(dropped)], readings: readings())
        }
        let apps = await inhibits.policy.appCountsByName()
        do { try await store.endRun(reason: reason, readings: readings(), costs: costs.all(), apps: apps) } catch {
            log.error("cannot record the end of run \(runId): \(error)")
        }
        // The last textfile says the run stopped.
        await writeMetricsTextfile()
        log.notice("run \(runId) ended: \(reason.rawValue)")
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
