import Foundation
import Prometheus
import VigilKit

/// The host's Prometheus metrics (docs/metrics.md).
///
/// Nothing here polls. Gauges and totals are read from the host's own state
/// (registry, supervisor, scheduler, survival store) when someone asks for
/// the exposition: a scrape or a heartbeat writing the textfile. The few
/// things that only exist as moments (lease events, strategy events, each
/// wake's lateness, each VoIP ping's round trip) are counted as they happen,
/// by observers the registry, the scheduler and the event recorder call
/// synchronously, so they add no task and no wakeup of their own.
///
/// Label values are bounded: strategy names and kinds come from the config
/// (plus `client`), client leases are counted by uid (the most frequent
/// ``maxClientUIDs``, the rest as `other`), and every value is cut to
/// ``maxLabelBytes`` bytes without control characters. A client's lease name
/// never becomes a label.
public final class HostMetrics: LeaseObserver {
    /// The most uids `vigil_client_leases` shows by name.
    public static let maxClientUIDs = 20
    /// The most strategies `vigil_voip_rtt_seconds` has a histogram of;
    /// the pings of later ones go into `strategy="other"`. swift-prometheus
    /// adds a labelled histogram by copying its family, so ten thousand
    /// voip-socket strategies, one histogram each, cost O(n²) (about ten
    /// seconds of CPU at their first pings, `vigil-bench voip-socket`),
    /// and 140,000 series nobody graphs one by one.
    public static let maxRTTStrategies = 100
    /// The longest label value, in UTF-8 bytes.
    public static let maxLabelBytes = 128

    static let latenessBuckets: [Double] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30]
    static let rttBuckets: [Double] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]

    /// The lease event labels, in the order they are listed.
    static let leaseEventNames = ["acquired", "renewed", "expiring", "expired", "released", "force_released", "failed"]

    /// Counted as they happen (strategy names are bounded by the config).
    private struct Counted {
        var leaseEvents: [Pair: Int] = [:]
        var strategyEvents: [Pair: Int] = [:]
        /// Per VoIP lease: the `Pings` figure last seen, to record a round
        /// trip once per ping, and its strategy's histogram once known.
        var pings: [LeaseID: PingCount] = [:]
        var rtt: [String: ValueHistogram] = [:]
        /// Dark wakes by outcome, and their awake time (µs).
        var darkWakes: [DarkWake.Outcome: Int] = [:]
        var darkWakeAwakeMicros: Int64 = 0
        var returnsToSleep: Int { darkWakes[.asleepAgain] ?? 0 }
        /// Suspends that broke leases, and the leases they broke.
        var brokenSleeps = 0
        var brokenLeases = 0
    }

    /// A VoIP lease's pings as the metrics saw them. The histogram is found
    /// (by the strategy's label) at the lease's first answered ping, so
    /// later pings cost one lookup by lease id: not a label check and two or
    /// three lookups by strategy name each (with over ``maxRTTStrategies``
    /// strategies, three: a miss, `other`, and storing `other` again).
    private struct PingCount {
        var pings: UInt64 = 0
        var histogram: ValueHistogram?

        /// Takes `pings` as the last figure; returns the one before and
        /// the histogram.
        mutating func take(_ pings: UInt64) -> (before: UInt64, histogram: ValueHistogram?) {
            defer { self.pings = pings }
            return (self.pings, histogram)
        }
    }

    struct Pair: Hashable {
        var strategy: String
        var name: String
    }

    private let counted = Lock(Counted())
    /// Histograms live across scrapes; everything else is rebuilt per scrape.
    private let histograms = PrometheusCollectorRegistry()
    private let lateness: ValueHistogram

    public init() {
        lateness = histograms.valueHistogram(
            "vigil_wake_lateness_seconds", buckets: Self.latenessBuckets,
            help: "How late each batch of the wake scheduler fired after its planned time.")
    }

    // MARK: observers

    /// A lease event (``LeaseRegistry/observe(_:)``).
    public func observe(_ event: LeaseEvent) {
        let strategy = Self.label(event.lease.strategy)
        counted.withLock { c in
            switch event.kind {
            case .status:
                // Statuses come through ``observeStatus(of:strategy:_:)``.
                return
            case .released, .expired, .failed:
                c.pings[event.lease.id] = nil
            case .acquired, .renewed, .expiring:
                break
            }
            let name = event.kind == .expired && event.forced ? "force_released" : event.kind.rawValue
            c.leaseEvents[Pair(strategy: strategy, name: name), default: 0] += 1
        }
    }

    /// A lease's new live status: a VoIP lease's answered ping goes into
    /// the round-trip histogram of its strategy.
    public func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {
        guard case .uint(let pings)? = status["Pings"], case .int(let rtt)? = status["LastRttUsec"] else { return }
        counted.withLock { c in
            let (before, known) = c.pings[lease, default: PingCount()].take(pings)
            guard pings > before, rtt >= 0 else { return }
            let histogram = known ?? rttHistogram(&c, strategy: strategy)
            if known == nil { c.pings[lease]?.histogram = histogram }
            histogram.record(Double(rtt) / 1e6)
        }
    }

    /// The round-trip histogram of `strategy`: its own for the first
    /// ``maxRTTStrategies`` strategies, then `other`. Under the lock.
    private func rttHistogram(_ c: inout Counted, strategy: String) -> ValueHistogram {
        let strategy = Self.label(strategy)
        if let histogram = c.rtt[strategy] { return histogram }
        let key = c.rtt.count < Self.maxRTTStrategies ? strategy : "other"
        if let histogram = c.rtt[key] { return histogram }
        let histogram = histograms.valueHistogram(
            "vigil_voip_rtt_seconds", labels: [("strategy", key)], buckets: Self.rttBuckets,
            help: "Round trip of each answered VoIP ping.")
        c.rtt[key] = histogram
        return histogram
    }

    /// A strategy's survival-log event; only the few that metrics show are kept.
    public func observeStrategyEvent(strategy: String, event: String, fields: [String: String]) {
        let name: String
        switch event {
        case "download-retry": name = "download_retry"
        case "download-completed": name = "download_completed"
        case "download-failed": name = (fields["error"] ?? "").contains("sha256 mismatch") ? "download_hash_failure" : "download_failed"
        case "audio-lost": name = "audio_lost"
        case "strategy-failed": name = "strategy_failed"
        default: return
        }
        let key = Pair(strategy: Self.label(strategy), name: name)
        counted.withLock { $0.strategyEvents[key, default: 0] += 1 }
    }

    /// A dark wake ended (``ReturnToSleep``).
    public func darkWake(_ wake: DarkWake) {
        counted.withLock {
            $0.darkWakes[wake.outcome, default: 0] += 1
            $0.darkWakeAwakeMicros += wake.awakeMicros
        }
    }

    /// A suspend broke leases (``SleepBreaks``).
    public func sleepBroke(_ broken: BrokenSleep) {
        counted.withLock {
            $0.brokenSleeps += 1
            $0.brokenLeases += broken.leases.count
        }
    }

    /// One batch of the wake scheduler fired `lateness` late.
    public func observeLateness(_ lateness: Duration) {
        self.lateness.record(max(0, lateness.seconds))
    }

    // MARK: exposition

    /// Host state read for one exposition.
    public struct Snapshot: Sendable {
        public var version: String
        public var upSeconds: Double
        public var powerBackend: String
        public var wakeClock: String
        public var canWakeSystem: Bool
        public var strategies: [StrategyStatus]
        public var leases: LeaseTotals
        public var survival: SurvivalTotals?
        /// What each strategy has cost (``StrategyCosts``), and the timer
        /// expirations that fired any strategy's request, each once.
        public var costs: [String: StrategyCostRow]
        public var machineWakeups: UInt64
        /// The wake scheduler's own count of its timer expirations (nil
        /// when it is not a ``WakeScheduler``).
        public var timerExpirations: Int?
        /// Apps' refused requests and expired leases (``AppPolicy``).
        public var apps: [AppPolicy.AppCount] = []

        public init(
            version: String, upSeconds: Double, powerBackend: String, wakeClock: String, canWakeSystem: Bool,
            strategies: [StrategyStatus], leases: LeaseTotals, survival: SurvivalTotals?,
            costs: [String: StrategyCostRow] = [:], machineWakeups: UInt64 = 0, timerExpirations: Int? = nil,
            apps: [AppPolicy.AppCount] = []
        ) {
            self.apps = apps
            self.timerExpirations = timerExpirations
            self.costs = costs
            self.machineWakeups = machineWakeups
            self.version = version
            self.upSeconds = upSeconds
            self.powerBackend = powerBackend
            self.wakeClock = wakeClock
            self.canWakeSystem = canWakeSystem
            self.strategies = strategies
            self.leases = leases
            self.survival = survival
        }
    }

    /// Reads the host's state now.
    public static func snapshot(of host: HostRuntime) async -> Snapshot {
        let survival: SurvivalTotals?
        do {
            survival = try await host.store.metricTotals()
        } catch {
            host.logging.logger("metrics").error("cannot read the survival totals: \(error)")
            survival = nil
        }
        return Snapshot(
            version: host.version,
            upSeconds: (host.clock.now - host.startedAt).seconds,
            powerBackend: host.registry.backend.name,
            wakeClock: host.scheduler.clockInfo.clock,
            canWakeSystem: host.scheduler.clockInfo.canWakeSystem,
            strategies: await host.supervisor.statuses,
            leases: await host.registry.reduceActive(into: LeaseTotals()) { $0.add($1) },
            survival: survival,
            costs: host.costs.all(),
            machineWakeups: host.costs.machineWakeups,
            timerExpirations: await (host.scheduler as? WakeScheduler)?.statistics.timerExpirations,
            apps: await host.inhibits.policy.appCounts()
        )
    }

    /// The exposition (Prometheus text format 0.0.4, no timestamps) of `host` now.
    public func exposition(of host: HostRuntime) async -> [UInt8] {
        exposition(await Self.snapshot(of: host))
    }

    /// The exposition of a snapshot, with what was counted so far.
    public func exposition(_ s: Snapshot) -> [UInt8] {
        let r = PrometheusCollectorRegistry()
        r.gauge("vigil_build_info", labels: [("version", Self.label(s.version))],
                help: "Always 1; the vigild version.").set(1.0)
        r.gauge("vigil_up_seconds", help: "Seconds since this run of vigild started.").set(s.upSeconds)
        r.gauge("vigil_power_backend", labels: [("backend", Self.label(s.powerBackend))],
                help: "Always 1; what leases hold on the system.").set(1.0)
        r.gauge("vigil_wake_clock", labels: [("clock", Self.label(s.wakeClock)), ("can_wake_system", s.canWakeSystem ? "true" : "false")],
                help: "Always 1; the clock of the wake scheduler.").set(1.0)

        if let t = s.survival {
            if let wall = t.lastHeartbeatWallMicros {
                r.gauge("vigil_last_heartbeat_timestamp_seconds",
                        help: "Unix time of the last heartbeat written to the survival log.").set(Double(wall) / 1e6)
            }
            for reason in RunEndReason.allCases {
                r.counter("vigil_runs_total", labels: [("end", reason.rawValue)],
                          help: "Runs in the survival log by how they ended (running: the current one).")
                    .increment(by: Int64(t.runs[reason] ?? 0))
            }
            let gaps = [("suspended", t.suspends, t.suspendedMicros), ("frozen", t.stalls, t.stalledMicros)]
            for (gapClass, count, micros) in gaps {
                r.counter("vigil_gaps_total", labels: [("class", gapClass)],
                          help: "Gaps between heartbeats: suspended (system sleep) or frozen (SIGSTOP, freezer, overload).")
                    .increment(by: Int64(count))
                r.counter("vigil_gap_seconds_total", labels: [("class", gapClass)],
                          help: "Seconds lost in gaps between heartbeats, by class.")
                    .increment(by: Double(micros) / 1e6)
            }
        }

        // Strategies, and `client` for the leases D-Bus clients hold.
        var kinds: [(name: String, kind: String)] = s.strategies.map { (Self.label($0.name), Self.label($0.kind)) }
        if !kinds.contains(where: { $0.name == ClientLeases.strategyName }) {
            kinds.append((ClientLeases.strategyName, ClientLeases.strategyName))
        }
        for st in s.strategies {
            let name = Self.label(st.name)
            r.gauge("vigil_strategy_up", labels: [("strategy", name), ("kind", Self.label(st.kind))],
                    help: "1 while the strategy runs, 0 while it backs off, waits for its when conditions, finished or stopped.")
                .set(st.state == .running ? 1.0 : 0.0)
            r.counter("vigil_strategy_restarts_total", labels: [("strategy", name)],
                      help: "Times the supervisor restarted the strategy after it failed.")
                .increment(by: Int64(st.restarts))
            r.gauge("vigil_strategy_error", labels: [("strategy", name)],
                    help: "1 while the strategy's LastError is set (its run's failure or one of its leases' errors), 0 once it recovered.")
                .set(st.lastError == nil ? 0.0 : 1.0)
            if let wall = st.lastErrorWallMicros {
                r.gauge("vigil_strategy_last_error_timestamp_seconds", labels: [("strategy", name)],
                        help: "Unix time the strategy's LastError was set (only while it is set).")
                    .set(Double(wall) / 1e6)
            }
        }

        // Per strategy, then labels: the label work is per strategy, not per lease.
        var leases: [String: Int] = [:]
        var figures: [Pair: Double] = [:]
        var playing: [String: Double] = [:]
        for (raw, totals) in s.leases.byStrategy {
            let strategy = Self.label(raw)
            leases[strategy, default: 0] += totals.leases
            for (metric, value) in totals.figures { figures[Pair(strategy: strategy, name: metric), default: 0] += value }
            if let streams = totals.playing { playing[strategy, default: 0] += streams }
        }
        let clientUIDs = s.leases.clientUIDs
        for (name, kind) in kinds {
            r.gauge("vigil_leases", labels: [("strategy", name), ("kind", kind)],
                    help: "Active leases (expiring ones included).").set(Int64(leases[name] ?? 0))
        }
        let (counts, events) = counted.withLock { ($0.leaseEvents, $0.strategyEvents) }
        for (name, _) in kinds {
            for event in Self.leaseEventNames {
                r.counter("vigil_lease_events_total", labels: [("strategy", name), ("event", event)],
                          help: "Lease life-cycle events since vigild started.")
                    .increment(by: Int64(counts[Pair(strategy: name, name: event)] ?? 0))
            }
        }
        // Strategies that are gone still had leases: keep their counts.
        for (pair, count) in counts.sorted(by: { ($0.key.strategy, $0.key.name) < ($1.key.strategy, $1.key.name) })
        where !kinds.contains(where: { $0.name == pair.strategy }) {
            r.counter("vigil_lease_events_total", labels: [("strategy", pair.strategy), ("event", pair.name)],
                      help: "Lease life-cycle events since vigild started.").increment(by: Int64(count))
        }

        for uid in Self.boundedUIDs(clientUIDs) {
            r.gauge("vigil_client_leases", labels: [("uid", uid.label)],
                    help: "Active client leases (BeginBackgroundTask) by the client's uid.").set(Int64(uid.count))
        }

        for app in Self.boundedApps(s.apps) {
            if app.refused > 0 {
                r.counter("vigil_app_requests_refused_total", labels: [("app", Self.label(app.app))],
                          help: "Apps' inhibits and client leases refused (a deny rule, an allow list, a spent app_budget) since vigild started.")
                    .increment(by: Int64(clamping: app.refused))
            }
            if app.expired > 0 {
                r.counter("vigil_app_leases_expired_total", labels: [("app", Self.label(app.app))],
                          help: "Apps' inhibits and client leases that reached their cap or budget and expired since vigild started.")
                    .increment(by: Int64(clamping: app.expired))
            }
        }

        for (pair, value) in figures.sorted(by: { ($0.key.strategy, $0.key.name) < ($1.key.strategy, $1.key.name) }) {
            let help = Self.statusHelp[pair.name] ?? ""
            if pair.name.hasSuffix("_total") {
                r.counter(pair.name, labels: [("strategy", pair.strategy)], help: help).increment(by: value)
            } else {
                r.gauge(pair.name, labels: [("strategy", pair.strategy)], help: help).set(value)
            }
        }
        for (strategy, value) in playing.sorted(by: { $0.key < $1.key }) {
            r.gauge("vigil_audio_streams_playing", labels: [("strategy", strategy)],
                    help: "silent-audio streams playing now (0: paused or waiting for a sink).").set(value)
        }
        for (pair, count) in events.sorted(by: { ($0.key.strategy, $0.key.name) < ($1.key.strategy, $1.key.name) }) {
            let (metric, help) = Self.eventMetrics[pair.name] ?? ("vigil_strategy_events_total", "")
            r.counter(metric, labels: [("strategy", pair.strategy)], help: help).increment(by: Int64(count))
        }

        let sleep = counted.withLock { ($0.darkWakes, $0.darkWakeAwakeMicros, $0.returnsToSleep, $0.brokenSleeps, $0.brokenLeases) }
        r.counter("vigil_returns_to_sleep_total",
                  help: "Times vigild returned the system to sleep after its own alarm's wake, since it started.")
            .increment(by: Int64(sleep.2))
        for outcome in [DarkWake.Outcome.asleepAgain, .stayedAwake] {
            r.counter("vigil_dark_wakes_total", labels: [("outcome", outcome.rawValue)],
                      help: "Wakes by vigild's own alarm since it started, by what followed (the count of the awake seconds' sum).")
                .increment(by: Int64(sleep.0[outcome] ?? 0))
        }
        r.counter("vigil_dark_wake_awake_seconds_total",
                  help: "Seconds awake from each wake by vigild's own alarm to the return to sleep or the decision to stay awake, summed.")
            .increment(by: Double(sleep.1) / 1e6)
        r.counter("vigil_sleep_broke_leases_total",
                  help: "Suspends that began while Vigil leases held sleep in block mode, since vigild started.")
            .increment(by: Int64(sleep.3))
        r.counter("vigil_broken_leases_total",
                  help: "Leases such suspends broke (one suspend may break several).")
            .increment(by: Int64(sleep.4))

        exposeCosts(s, kinds: kinds, into: r)

        var buffer = r.emitToBuffer()
        histograms.emit(into: &buffer)
        return buffer
    }

    /// What each strategy cost (docs/metrics.md#what-each-strategy-costs):
    /// every configured strategy and `client`, at zero until they cost
    /// something, and any other that did (apps' inhibits, strategies gone).
    private func exposeCosts(_ s: Snapshot, kinds: [(name: String, kind: String)], into r: PrometheusCollectorRegistry) {
        var costs: [String: StrategyCostRow] = Dictionary(kinds.map { ($0.name, StrategyCostRow()) }, uniquingKeysWith: { a, _ in a })
        for (raw, cost) in s.costs {
            let strategy = Self.label(raw)
            costs[strategy] = (costs[strategy] ?? StrategyCostRow()) + cost
        }
        r.counter("vigil_wakeups_total",
                  help: "Wake scheduler timer expirations that fired a strategy's request, each counted once however many strategies shared it.")
            .increment(by: Int64(clamping: s.machineWakeups))
        if let expirations = s.timerExpirations {
            r.counter("vigil_wake_timer_expirations_total",
                      help: "Every timer expiration of the wake scheduler (its own statistics): strategies' wakes, heartbeats, and stale expirations of a timer re-armed meanwhile.")
                .increment(by: Int64(expirations))
        }
        for (strategy, cost) in costs.sorted(by: { $0.key < $1.key }) {
            let labels = [("strategy", strategy)]
            r.counter("vigil_strategy_wakeups_total", labels: labels,
                      help: "Wake scheduler timer expirations that fired the strategy's requests (a shared expiration counts for each strategy).")
                .increment(by: Int64(clamping: cost.wakeups))
            r.counter("vigil_strategy_system_wakes_total", labels: labels,
                      help: "System resumes attributed to the strategy's wake_system alarms.")
                .increment(by: Int64(clamping: cost.systemWakes))
            r.counter("vigil_strategy_sleep_held_seconds_total", labels: labels,
                      help: "Seconds the strategy's leases held sleep off (block inhibitors of sleep), active leases up to now.")
                .increment(by: Double(cost.sleepHeldUsec) / 1e6)
            r.counter("vigil_strategy_idle_held_seconds_total", labels: labels,
                      help: "Seconds the strategy's leases held idle off (block inhibitors of idle), active leases up to now.")
                .increment(by: Double(cost.idleHeldUsec) / 1e6)
            r.counter("vigil_strategy_child_cpu_seconds_total", labels: labels,
                      help: "User plus system CPU seconds of the strategy's commands and hooks, from their rusage.")
                .increment(by: Double(cost.childCPUUsec) / 1e6)
            for (direction, bytes) in [("sent", cost.bytesSent), ("received", cost.bytesReceived)] {
                r.counter("vigil_strategy_network_bytes_total", labels: labels + [("direction", direction)],
                          help: "Bytes the strategy's connections and downloads sent and received.")
                    .increment(by: Int64(clamping: bytes))
            }
        }
    }

    /// Lease status keys that strategies publish (LeaseHandle.setStatus),
    /// summed per strategy into these metrics.
    static let statusFigures: [String: String] = [
        "Pings": "vigil_voip_pings_total",
        "LatePings": "vigil_voip_late_pings_total",
        "Overruns": "vigil_voip_overruns_total",
        "Reconnects": "vigil_voip_reconnects_total",
        "BytesDone": "vigil_download_bytes",
        "Underruns": "vigil_audio_underruns_total",
    ]

    static let statusHelp: [String: String] = [
        "vigil_voip_pings_total": "VoIP pings sent by the connections open now.",
        "vigil_voip_late_pings_total": "VoIP pings answered after their deadline, by the connections open now.",
        "vigil_voip_overruns_total": "VoIP ping handlers that overran their deadline, by the connections open now.",
        "vigil_voip_reconnects_total": "VoIP reconnects of the connections open now.",
        "vigil_download_bytes": "Bytes fetched so far of the downloads in progress.",
        "vigil_audio_underruns_total": "Underruns of the silent-audio streams open now.",
    ]

    static let eventMetrics: [String: (String, String)] = [
        "download_retry": ("vigil_download_retries_total", "Downloads retried (resumed with Range) since vigild started."),
        "download_completed": ("vigil_download_completed_total", "Downloads verified and published since vigild started."),
        "download_hash_failure": ("vigil_download_hash_failures_total", "Downloads refused for a sha256 mismatch since vigild started."),
        "download_failed": ("vigil_download_failures_total", "Downloads that failed for other reasons since vigild started."),
        "audio_lost": ("vigil_audio_lost_total", "Times a silent-audio stream lost its server or sink since vigild started."),
        "strategy_failed": ("vigil_strategy_failures_total", "Times a strategy's run threw since vigild started."),
    ]

    /// The most apps the refused and expired counters show by name.
    static let maxApps = 50

    /// The apps with most refusals and expiries, the rest summed as `other`.
    static func boundedApps(_ apps: [AppPolicy.AppCount]) -> [AppPolicy.AppCount] {
        let sorted = apps.sorted { ($0.refused &+ $0.expired, $1.app) > ($1.refused &+ $1.expired, $0.app) }
        var out = Array(sorted.prefix(maxApps))
        let rest = sorted.dropFirst(maxApps)
        if !rest.isEmpty {
            out.append(AppPolicy.AppCount(app: "other", refused: rest.reduce(0) { $0 &+ $1.refused }, expired: rest.reduce(0) { $0 &+ $1.expired }))
        }
        return out
    }

    /// The uids with most client leases, the rest summed as `other`.
    static func boundedUIDs(_ counts: [UInt32: Int]) -> [(label: String, count: Int)] {
        let sorted = counts.sorted { ($0.value, $1.key) > ($1.value, $0.key) }
        var out = sorted.prefix(maxClientUIDs).map { (label: String($0.key), count: $0.value) }
        let rest = sorted.dropFirst(maxClientUIDs).reduce(0) { $0 + $1.value }
        if rest > 0 { out.append((label: "other", count: rest)) }
        return out
    }

    /// A label value: at most ``maxLabelBytes`` UTF-8 bytes (cut at a
    /// character boundary), control characters replaced by `?`. Quotes,
    /// backslashes and newlines left are escaped by the exposition writer.
    public static func label(_ value: String) -> String {
        // The common case, printable ASCII that fits, is the name itself.
        if value.utf8.count <= maxLabelBytes, value.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return value }
        var out = ""
        var bytes = 0
        for scalar in value.unicodeScalars {
            let c: Unicode.Scalar = scalar.properties.generalCategory == .control ? "?" : scalar
            let size = UTF8.width(c)
            if bytes + size > maxLabelBytes { break }
            out.unicodeScalars.append(c)
            bytes += size
        }
        return out
    }
}

/// The active leases added up per strategy (what the metrics show of them).
public struct LeaseTotals: Sendable {
    public struct PerStrategy: Sendable {
        public var leases = 0
        /// Summed numeric statuses, by metric name (``HostMetrics/statusFigures``).
        public var figures: [String: Double] = [:]
        /// silent-audio streams playing; nil when no lease has a `Stream` status.
        public var playing: Double?
    }

    /// By the strategy name as the registry has it (labels are made later).
    public var byStrategy: [String: PerStrategy] = [:]
    /// Client leases by uid.
    public var clientUIDs: [UInt32: Int] = [:]

    public init() {}

    public init(_ leases: some Sequence<LeaseSnapshot>) {
        for lease in leases { add(lease) }
    }

    public mutating func add(_ lease: LeaseSnapshot) {
        if let client = lease.client { clientUIDs[client.uid, default: 0] += 1 }
        byStrategy[lease.strategy, default: PerStrategy()].add(lease.status)
    }
}

extension LeaseTotals.PerStrategy {
    mutating func add(_ status: [String: StatusValue]) {
        leases += 1
        for (key, value) in status {
            if let metric = HostMetrics.statusFigures[key], let number = value.number {
                figures[metric, default: 0] += number
            } else if key == "Stream", case .string(let state) = value {
                playing = (playing ?? 0) + (state == "playing" ? 1 : 0)
            }
        }
    }
}

extension StatusValue {
    /// The value as a number, for numeric statuses.
    var number: Double? {
        switch self {
        case .int(let v): Double(v)
        case .uint(let v): Double(v)
        case .double(let v): v.isFinite ? v : nil
        case .bool, .string: nil
        }
    }
}

/// A strategy's event recorder that also shows the event to the metrics.
struct MetricsCountedEvents: EventRecording {
    let inner: any EventRecording
    let metrics: HostMetrics
    let strategy: String

    func record(_ event: String, _ fields: [String: String]) async {
        metrics.observeStrategyEvent(strategy: strategy, event: event, fields: fields)
        await inner.record(event, fields)
    }
}

/// swift-prometheus's descriptor calls for a metric given by its full name
/// (every name here is written out whole, unit suffix included, so the
/// descriptor's namespace, subsystem and unit parts stay empty).
private extension PrometheusCollectorRegistry {
    static func descriptor(_ name: String, help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help)
    }

    func gauge(_ name: String, labels: [(String, String)] = [], help: String) -> Gauge {
        makeGauge(descriptor: Self.descriptor(name, help: help), labels: labels)
    }

    func counter(_ name: String, labels: [(String, String)] = [], help: String) -> Counter {
        makeCounter(descriptor: Self.descriptor(name, help: help), labels: labels)
    }

    func valueHistogram(_ name: String, labels: [(String, String)] = [], buckets: [Double], help: String) -> ValueHistogram {
        makeValueHistogram(descriptor: Self.descriptor(name, help: help), labels: labels, buckets: buckets)
    }
}
