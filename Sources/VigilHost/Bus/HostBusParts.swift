import VigilKit

/// What vigild's D-Bus objects are given of the host, rather than the whole
/// ``HostRuntime``: the lease registry (events and snapshot), the
/// supervisor's strategy statuses, the configured strategies, reload, the
/// survival store, the clock and the log. The host builds one
/// (``HostRuntime/busParts``); the Bus code does not reach into the
/// runtime, and the runtime does not call into the Bus code.
public struct HostBusParts: Sendable {
    /// A configured strategy as the bus shows it: its kind and TOML table.
    public struct StrategyConfig: Sendable {
        public var kind: String
        public var values: [String: ConfigValue]
        public init(kind: String, values: [String: ConfigValue]) {
            self.kind = kind
            self.values = values
        }
    }

    // Facts of the run (the Host object's constant properties).
    public var version: String
    public var runId: String
    public var configPath: String
    public var startedAt: VigilInstant
    public var startedWallMicros: Int64
    public var clock: any VigilClock
    public var logging: HostLogging
    /// Lease events and the active leases; its power backend.
    public var registry: LeaseRegistry
    /// Strategy statuses and their changes.
    public var supervisor: Supervisor
    /// The wake clock in use.
    public var scheduler: any WakeScheduling
    /// The survival log (read by `Survival`, and whether it is writable).
    public var store: SurvivalStore
    /// Leases of D-Bus clients and of apps using the freedesktop inhibit APIs.
    public var clientLeases: ClientLeases
    public var inhibits: ForeignInhibits
    /// What strategies put on the bus.
    public var strategyBus: StrategyBusBridge
    /// What each strategy has cost (the Strategy objects' cost properties).
    public var costs: StrategyCosts
    /// The configured strategy of that name, if any.
    public var configuredStrategy: @Sendable (_ name: String) async -> StrategyConfig?
    /// `Host.Reload`.
    public var reload: @Sendable () async -> ReloadResult
    public var readHealth: @Sendable () async -> HostHealth
    /// Whether vigild serves the freedesktop inhibit names on this bus.
    public var servesInhibits: @Sendable () async -> Bool
    /// Suspends that broke leases, from the moment asked (the
    /// `SleepBrokeLease` signal); an ended stream when there are none to tell.
    public var sleepBreaks: @Sendable () async -> AsyncStream<BrokenSleep> = { AsyncStream { $0.finish() } }

    public init(version: String, runId: String, configPath: String, startedAt: VigilInstant, startedWallMicros: Int64,
                clock: any VigilClock, logging: HostLogging, registry: LeaseRegistry, supervisor: Supervisor,
                scheduler: any WakeScheduling, store: SurvivalStore, clientLeases: ClientLeases, inhibits: ForeignInhibits,
                strategyBus: StrategyBusBridge, costs: StrategyCosts,
                configuredStrategy: @escaping @Sendable (_ name: String) async -> StrategyConfig?,
                reload: @escaping @Sendable () async -> ReloadResult, health: @escaping @Sendable () async -> HostHealth,
                servesInhibits: @escaping @Sendable () async -> Bool) {
        self.version = version
        self.runId = runId
        self.configPath = configPath
        self.startedAt = startedAt
        self.startedWallMicros = startedWallMicros
        self.clock = clock
        self.logging = logging
        self.registry = registry
        self.supervisor = supervisor
        self.scheduler = scheduler
        self.store = store
        self.clientLeases = clientLeases
        self.inhibits = inhibits
        self.strategyBus = strategyBus
        self.costs = costs
        self.configuredStrategy = configuredStrategy
        self.reload = reload
        self.readHealth = health
        self.servesInhibits = servesInhibits
    }

    public func health() async -> HostHealth { await readHealth() }
}
