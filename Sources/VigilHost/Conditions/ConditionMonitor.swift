import Foundation
import VigilDBus
import VigilKit

/// Knows whether each strategy's `when` conditions hold, and tells the
/// supervisor when that changes.
///
/// Every fact comes from an event source, never from polling: inotify and
/// kernel uevents (files, power supplies), rtnetlink (network), the proc
/// connector (processes), the lease registry's event stream (leases) and the
/// wake scheduler (time windows). A source starts when the first strategy
/// needs it and runs until ``stop()``. Facts are applied in the order the
/// sources report them, by one task.
public actor ConditionMonitor {
    public struct Settings: Sendable {
        /// `[host] power_supply_dir`.
        public var powerSupplyDir: String
        /// Local time for `time` windows.
        public var timeZone: TimeZone
        /// A network namespace (/run/netns/NAME) the network watcher enters; tests only.
        public var networkNamespace: String?
        /// Where NetworkManager is asked whether the network is metered (tests: a private bus).
        public var systemBus: DBusConnection.Bus

        public init(
            powerSupplyDir: String = "/sys/class/power_supply", timeZone: TimeZone = .current,
            networkNamespace: String? = nil, systemBus: DBusConnection.Bus = .system
        ) {
            self.powerSupplyDir = powerSupplyDir
            self.timeZone = timeZone
            self.networkNamespace = networkNamespace
            self.systemBus = systemBus
        }
    }

    private let settings: Settings
    private let registry: LeaseRegistry
    private let scheduler: any WakeScheduling
    private let clock: any VigilClock
    private let log: Logger
    private let facts: AsyncStream<ConditionFact>.Continuation
    private var consumer: Task<Void, Never>?

    // What is known.
    private var power: PowerReading?
    private var files: [String: Bool] = [:]
    private var online = false
    private var metered: Bool?
    private var leases: [LeaseSnapshot] = []
    private var times: [[TimeWindow]: Bool] = [:]
    private var processes: Set<String> = []

    // Sources, started on demand.
    private var fileWatcher: FileExistenceWatcher?
    private var powerWatcher: PowerSupplyWatcher?
    private var linkWatcher: LinkWatcher?
    private var processWatcher: ProcessWatcher?
    private var leaseTask: Task<Void, Never>?
    private var meteredTask: Task<Void, Never>?
    private var timeTasks: [[TimeWindow]: Task<Void, Never>] = [:]
    /// Sources that could not start, by condition name: their conditions stay false.
    private var failed: [String: String] = [:]

    private struct Gate {
        var conditions: StrategyConditions
        var last: ConditionVerdict
        var continuation: AsyncStream<ConditionVerdict>.Continuation
    }
    private var gates: [UInt64: Gate] = [:]
    private var nextGate: UInt64 = 0
    private var stopped = false

    public init(settings: Settings, registry: LeaseRegistry, scheduler: any WakeScheduling, clock: any VigilClock, logging: HostLogging) {
        self.settings = settings
        self.registry = registry
        self.scheduler = scheduler
        self.clock = clock
        self.log = logging.logger("conditions")
        let (stream, continuation) = AsyncStream.makeStream(of: ConditionFact.self, bufferingPolicy: .unbounded)
        self.facts = continuation
        consumer = nil
        // Unstructured task: not cancelled: it ends when stop() finishes `facts`, the stream it
        // reads.
        Task { await self.consume(stream) }
    }

    private func consume(_ stream: AsyncStream<ConditionFact>) async {
        for await fact in stream {
            apply(fact)
            publish()
        }
    }

    /// The verdicts for `conditions`: the current one at once, then each
    /// change, until the consumer stops iterating.
    public func verdicts(for conditions: StrategyConditions) async -> AsyncStream<ConditionVerdict> {
        await startSources(for: conditions)
        let (stream, continuation) = AsyncStream.makeStream(of: ConditionVerdict.self, bufferingPolicy: .bufferingNewest(1))
        let verdict = conditions.verdict(truth)
        let key = nextGate
        nextGate += 1
        gates[key] = Gate(conditions: conditions, last: verdict, continuation: continuation)
        // Unstructured task: not cancelled: one hop into the actor to forget the gate, from a
        // synchronous termination handler.
        continuation.onTermination = { [weak self] _ in Task { await self?.removeGate(key) } }
        continuation.yield(verdict)
        return stream
    }

    private func removeGate(_ key: UInt64) { gates[key] = nil }

    /// Whether `condition` holds now.
    func truth(_ condition: Condition) -> Bool {
        switch condition {
        case .acPower(let wanted):
            guard let power else { return false }
            return power.onAC == wanted
        case .batteryAbove(let percent):
            guard let power else { return false }
            return (power.lowestBattery ?? 100) > percent
        case .network(.online):
            return online
        case .network(.unmetered):
            return online && metered != true
        case .time(let windows):
            return times[windows] ?? false
        case .leaseActive(let selector):
            return leases.contains { selector.matches($0) && ($0.state == .active || $0.state == .expiring) }
        case .process(let name):
            return processes.contains(name)
        case .fileExists(let path):
            return files[path] ?? false
        }
    }

    private func apply(_ fact: ConditionFact) {
        switch fact {
        case .power(let reading): power = reading
        case .files(let state): files.merge(state) { _, new in new }
        case .online(let value): online = value
        case .metered(let value): metered = value
        case .leases(let active): leases = active
        case .time(let windows, let inside): times[windows] = inside
        case .processes(let names): processes = names
        }
    }

    private func publish() {
        for (key, gate) in gates {
            let verdict = gate.conditions.verdict(truth)
            guard verdict != gate.last else { continue }
            gates[key]?.last = verdict
            gate.continuation.yield(verdict)
        }
    }

    // MARK: sources

    private func startSources(for conditions: StrategyConditions) async {
        guard !stopped else { return }
        let sink: FactSink = { [facts] fact in facts.yield(fact) }
        for condition in conditions.all {
            do throws(ConditionWatchError) {
                switch condition {
                case .acPower, .batteryAbove:
                    if powerWatcher == nil {
                        let watcher = try PowerSupplyWatcher(directory: settings.powerSupplyDir, sink: sink)
                        powerWatcher = watcher
                        power = watcher.initial
                    }
                case .network(let requirement):
                    if linkWatcher == nil {
                        let watcher = try LinkWatcher(namespace: settings.networkNamespace, sink: sink)
                        linkWatcher = watcher
                        online = watcher.initial
                    }
                    if requirement == .unmetered && meteredTask == nil {
                        let log = self.log, bus = settings.systemBus
                        // Unstructured task: cancelled by stop(), which then awaits it.
                        meteredTask = Task { await NetworkManagerMetered.follow(bus: bus, sink: sink, log: log) }
                    }
                case .fileExists(let path):
                    if fileWatcher == nil { fileWatcher = try FileExistenceWatcher(sink: sink) }
                    if let fileWatcher, files[path] == nil { files.merge(fileWatcher.add(path)) { _, new in new } }
                case .process(let name):
                    if processWatcher == nil { processWatcher = try ProcessWatcher(sink: sink) }
                    if let processWatcher { processes = processWatcher.add(name) }
                case .leaseActive:
                    if leaseTask == nil {
                        // Statuses and renewals change no lease's presence.
                        let stream = await registry.events(LeaseEventFilter(kinds: LeaseEventFilter.endings.union([.acquired, .expiring])))
                        leases = await registry.active
                        let registry = self.registry
                        // Unstructured task: cancelled by stop(), which then awaits it.
                        leaseTask = Task {
                            for await _ in stream { sink(.leases(await registry.active)) }
                        }
                    }
                case .time(let windows):
                    if timeTasks[windows] == nil { startTime(windows, sink: sink) }
                }
            } catch {
                let name = condition.written.split(separator: " ").first.map(String.init) ?? "?"
                if failed[name] == nil {
                    failed[name] = error.description
                    log.error("cannot watch \(name), so it stays false: \(error)")
                }
            }
        }
    }

    /// A task that knows whether now is inside `windows` and sleeps, through
    /// the wake scheduler, until the next start or end of a window.
    private func startTime(_ windows: [TimeWindow], sink: @escaping FactSink) {
        let schedule = TimeWindowSchedule(windows: windows, timeZone: settings.timeZone)
        let clock = self.clock, scheduler = self.scheduler
        let first = schedule.state(at: Double(clock.wallMicroseconds) / 1e6)
        times[windows] = first.inside
        // Unstructured task: cancelled by stop(), which then awaits it.
        timeTasks[windows] = Task {
            var next = first.next
            while let boundary = next {
                let wall = Double(clock.wallMicroseconds) / 1e6
                let target = clock.now + .microseconds(Int64(((boundary - wall) * 1e6).rounded(.up)))
                do {
                    _ = try await scheduler.wake(WakeRequest(earliest: target, latest: target, label: "time window"))
                } catch { return }
                let state = schedule.state(at: Double(clock.wallMicroseconds) / 1e6)
                sink(.time(windows, state.inside))
                next = state.next
            }
        }
    }

    /// How many times the descriptor sources (files, power, network,
    /// processes) have woken, together: an idle host's stays put.
    var sourceWakeups: Int {
        [fileWatcher?.wakeups, powerWatcher?.wakeups, linkWatcher?.wakeups, processWatcher?.wakeups].reduce(0) { $0 + ($1 ?? 0) }
    }

    /// Stops every source.
    public func stop() async {
        stopped = true
        fileWatcher?.stop()
        powerWatcher?.stop()
        linkWatcher?.stop()
        processWatcher?.stop()
        leaseTask?.cancel()
        meteredTask?.cancel()
        for task in timeTasks.values { task.cancel() }
        for task in timeTasks.values { await task.value }
        if let leaseTask { await leaseTask.value }
        if let meteredTask { await meteredTask.value }
        for gate in gates.values { gate.continuation.finish() }
        gates = [:]
        facts.finish()
    }
}
