/// A kind of keep-alive strategy (`periodic-wake`, `silent-audio`, ...): the
/// factory that turns one `[[strategy]]` table of the config into a strategy.
public protocol StrategyKind: Sendable {
    /// The `kind` value that selects this strategy in the config, in
    /// kebab-case. The plugin library must be named `libvigil-<name>.so`.
    var name: String { get }

    /// One line for `vigilctl` listings and error messages.
    var summary: String { get }

    /// Validates `config` and builds a strategy from it.
    ///
    /// Read every option through `config`'s typed accessors; they record
    /// problems (wrong type, bad duration, missing key) instead of throwing,
    /// so that one run reports every problem at once. Report semantic problems
    /// with ``ConfigReader/problem(_:_:)``. Keys you never read are reported
    /// as unknown. The host discards the result if any problem was recorded,
    /// so placeholder values are fine on the error path. Throw only for
    /// failures that are not about the config.
    ///
    /// Must not start any work: nothing runs until ``KeepAliveStrategy/run(in:)``.
    func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy
}

/// A configured strategy instance.
///
/// All long-lived work happens in ``run(in:)``, never in an initializer.
/// Returning means the strategy finished; throwing means it failed and the
/// host restarts it with exponential backoff. On shutdown the host cancels the
/// task: return promptly when cancelled. Every lease the strategy still holds
/// when `run` ends is released by the host.
public protocol KeepAliveStrategy: Sendable {
    func run(in context: StrategyContext) async throws
}

/// Everything the host gives a running strategy.
public struct StrategyContext: Sendable {
    /// The instance's `name` from the config.
    public let name: String
    /// The instance's `kind`.
    public let kind: String
    /// Where the strategy logs: a swift-log `Logger` labelled with the
    /// instance's name, whose metadata says `strategy=<name>` (and, in the
    /// host, `run=<run id>`). Add `lease=<id>` for the lines about one
    /// lease with `log.with(lease:)`.
    public let log: Logger
    /// Acquire leases: the host's single record of what is being kept alive.
    public let leases: any LeaseProvider
    /// Ask for wakes; shared by the whole host so wakes coalesce.
    public let scheduler: any WakeScheduling
    /// Run hook commands with a timeout and a clean environment.
    public let hooks: any HookRunning
    /// The host's clock. Use it (never `Date()` or `ContinuousClock`) for
    /// anything timed, so tests can drive time.
    public let clock: any VigilClock
    /// Record notable events in the survival log (a wake's lateness, a
    /// command's exit status, a reconnect).
    public let events: any EventRecording
    /// The strategy's own persistent records (the host's SQLite store).
    public let store: any StrategyStore
    /// Methods and objects the strategy offers on D-Bus.
    public let bus: any StrategyBus
    /// What the strategy costs that the host cannot see by itself: the
    /// bytes its own connections and transfers move. (Wakes, held time and
    /// the CPU of commands run through ``hooks`` the host counts itself.)
    public let cost: any CostRecording

    public init(
        name: String, kind: String, log: Logger, leases: any LeaseProvider,
        scheduler: any WakeScheduling, hooks: any HookRunning, clock: any VigilClock,
        events: any EventRecording, store: any StrategyStore = MemoryStrategyStore(),
        bus: any StrategyBus = DetachedStrategyBus(), cost: any CostRecording = UncountedCost()
    ) {
        self.cost = cost
        self.name = name
        self.kind = kind
        self.log = log
        self.leases = leases
        self.scheduler = scheduler
        self.hooks = hooks
        self.clock = clock
        self.events = events
        self.store = store
        self.bus = bus
    }
}

/// Where a strategy reports the bytes it moves on the network (its
/// `BytesSent` and `BytesReceived` on D-Bus, docs/metrics.md). Synchronous
/// and cheap: call it from a socket's event loop as bytes go, never on a
/// timer of its own.
public protocol CostRecording: Sendable {
    func networkBytes(sent: UInt64, received: UInt64)
}

/// Counts nothing (tests, and strategies run outside a host).
public struct UncountedCost: CostRecording {
    public init() {}
    public func networkBytes(sent: UInt64, received: UInt64) {}
}

/// Where strategies record notable events. The host stores them in the
/// survival log with the run id and both clocks' times.
public protocol EventRecording: Sendable {
    func record(_ event: String, _ fields: [String: String]) async
}
