import VigilKit

/// What each strategy has cost since vigild started: wakeups, system wakes,
/// time its leases held sleep and idle off, its commands' CPU and its
/// network bytes (docs/metrics.md#what-each-strategy-costs).
///
/// Counted as things happen, by the parts that see them and call in
/// synchronously: the wake scheduler at each timer expiration, the resume
/// recorder at each attributed system wake, the registry (this is a
/// ``LeaseObserver``) at each lease's start and end, each strategy's hook
/// runner as a command is reaped, and strategies for their bytes. Held time
/// of the leases active now is added when read. Nothing here has a task or
/// a timer, so the counters add no wakeup to an idle host.
///
/// Strategy names are bounded by the config, plus `client` and `inhibit`
/// (the leases of D-Bus clients and of apps' inhibit requests).
public final class StrategyCosts: LeaseObserver, Sendable {
    private struct Active {
        var since: VigilInstant
        var sleep: Bool
        var idle: Bool
    }

    private struct State {
        var totals: [String: StrategyCostRow] = [:]
        /// The leases holding sleep or idle off now, by strategy, so that
        /// reading one strategy's cost goes through its leases only.
        var active: [String: [LeaseID: Active]] = [:]
        /// Timer expirations that fired any strategy's request, each once.
        var machineWakeups: UInt64 = 0
    }

    private let state = Lock(State())
    /// The registry's clock: lease times are instants on it.
    private let clock: any VigilClock

    public init(clock: any VigilClock) {
        self.clock = clock
    }

    // MARK: counting

    /// One timer expiration fired requests of `strategies` (each once).
    public func timerExpired(firing strategies: Set<String>) {
        guard !strategies.isEmpty else { return }
        state.withLock { s in
            s.machineWakeups += 1
            for name in strategies { s.totals[name, default: StrategyCostRow()].wakeups += 1 }
        }
    }

    /// A system resume was attributed to `strategy`'s alarm.
    public func systemWake(by strategy: String) {
        state.withLock { $0.totals[strategy, default: StrategyCostRow()].systemWakes += 1 }
    }

    /// A command or hook of `strategy` used `cpu` (user + system).
    public func childCPU(_ cpu: Duration, of strategy: String) {
        guard cpu > .zero else { return }
        let micros = UInt64(clamping: cpu.microseconds)
        state.withLock { $0.totals[strategy, default: StrategyCostRow()].childCPUUsec &+= micros }
    }

    /// `strategy` moved bytes on the network.
    public func networkBytes(sent: UInt64, received: UInt64, of strategy: String) {
        guard sent > 0 || received > 0 else { return }
        state.withLock { s in
            // One lookup: this runs for every read and write of a socket.
            Self.update(&s.totals, strategy) { row in
                row.bytesSent &+= sent
                row.bytesReceived &+= received
            }
        }
    }

    /// Where `strategy` reports its bytes (``StrategyContext/cost``).
    public func recorder(for strategy: String) -> any CostRecording {
        Recorder(costs: self, strategy: strategy)
    }

    private struct Recorder: CostRecording {
        let costs: StrategyCosts
        let strategy: String
        func networkBytes(sent: UInt64, received: UInt64) { costs.networkBytes(sent: sent, received: received, of: strategy) }
    }

    // MARK: LeaseObserver

    /// A lease holds sleep or idle off from its acquisition to its end, when
    /// it asked for a `block` hold of that kind (a `delay` hold only delays).
    public func observe(_ event: LeaseEvent) {
        switch event.kind {
        case .acquired:
            guard let hold = event.lease.hold, hold.mode == "block" else { return }
            let sleep = hold.what.contains("sleep"), idle = hold.what.contains("idle")
            guard sleep || idle else { return }
            let active = Active(since: event.lease.acquiredAt, sleep: sleep, idle: idle)
            state.withLock { $0.active[event.lease.strategy, default: [:]][event.lease.id] = active }
        case .released, .expired:
            let strategy = event.lease.strategy
            state.withLock { s in
                guard let active = s.active[strategy]?.removeValue(forKey: event.lease.id) else { return }
                if s.active[strategy]?.isEmpty == true { s.active[strategy] = nil }
                Self.add(active, of: strategy, until: event.at, to: &s.totals)
            }
        case .renewed, .expiring, .failed, .status:
            return
        }
    }

    public func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {}

    private static func update(_ totals: inout [String: StrategyCostRow], _ strategy: String, _ change: (inout StrategyCostRow) -> Void) {
        change(&totals[strategy, default: StrategyCostRow()])
    }

    private static func add(_ active: Active, of strategy: String, until end: VigilInstant, to totals: inout [String: StrategyCostRow]) {
        let micros = UInt64(clamping: max(0, (end - active.since).microseconds))
        if active.sleep { totals[strategy, default: StrategyCostRow()].sleepHeldUsec &+= micros }
        if active.idle { totals[strategy, default: StrategyCostRow()].idleHeldUsec &+= micros }
    }

    // MARK: reading

    /// What `strategy` has cost so far, its active leases' held time up to now.
    public func cost(of strategy: String) -> StrategyCostRow {
        let now = clock.now
        return state.withLock { s in
            var totals = [strategy: s.totals[strategy] ?? StrategyCostRow()]
            for active in (s.active[strategy] ?? [:]).values { Self.add(active, of: strategy, until: now, to: &totals) }
            return totals[strategy] ?? StrategyCostRow()
        }
    }

    /// Every strategy that has cost anything, active leases counted up to now.
    public func all() -> [String: StrategyCostRow] {
        let now = clock.now
        return state.withLock { s in
            var totals = s.totals
            for (strategy, leases) in s.active {
                for active in leases.values { Self.add(active, of: strategy, until: now, to: &totals) }
            }
            return totals
        }
    }

    /// Timer expirations that fired any strategy's request (each counted
    /// once, however many strategies it fired).
    public var machineWakeups: UInt64 { state.withLock { $0.machineWakeups } }
}
