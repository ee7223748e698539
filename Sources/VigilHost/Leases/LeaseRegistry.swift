import VigilKit

/// A lease as the registry records it.
public struct LeaseSnapshot: Sendable, Hashable {
    public var id: LeaseID
    /// The strategy instance (or client) that holds it.
    public var strategy: String
    public var holds: String
    public var reason: String
    public var acquiredAt: VigilInstant
    /// Wall clock at acquisition, microseconds since the epoch.
    public var acquiredWallMicros: Int64
    public var budget: Duration?
    /// When the budget runs out, on the registry's budget clock
    /// (``LeaseRegistry/budgetClock``: awake time in vigild, so time the
    /// system spends suspended does not count).
    public var deadline: VigilInstant?
    /// The wall time (µs since the epoch) the budget runs out if the system
    /// stays awake: the acquisition's wall time plus the boottime since, plus
    /// what is left of the budget, so setting the wall clock does not move
    /// it. A suspend moves it later by the time slept
    /// (``LeaseRegistry/systemResumed()``). Nil without a budget.
    public var deadlineWallMicros: Int64?
    public var renewals: Int
    public var state: LeaseState
    /// What the power backend holds for it ("tracked only", "logind inhibitor ...").
    public var power: String
    /// How long the expiration handler may run once the budget is out.
    public var grace: Duration = .zero
    /// The holder's live status (``LeaseHandle/setStatus(_:)``).
    public var status: [String: StatusValue] = [:]
    /// For a lease a D-Bus client began (BeginBackgroundTask): who holds it.
    public var client: ClientIdentity?
    /// What it asked the power backend to hold (nil: tracked only), for
    /// its strategy's held time (``StrategyCosts``).
    public var hold: PowerHold? = nil
}

/// The D-Bus peer that holds a client lease.
public struct ClientIdentity: Sendable, Hashable {
    /// The peer's unique bus name (`:1.42`).
    public var owner: String
    public var uid: UInt32
    /// 0 when the bus could not tell.
    public var pid: UInt32
    /// The task name the client gave.
    public var name: String

    public init(owner: String, uid: UInt32, pid: UInt32, name: String) {
        self.owner = owner
        self.uid = uid
        self.pid = pid
        self.name = name
    }
}

/// One change in the registry. The D-Bus API, the survival log and tests all
/// observe leases through these events.
public struct LeaseEvent: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        case acquired, renewed, expiring, expired, released, failed
        /// The holder replaced the lease's status. Sent to subscribers but
        /// kept out of `history`, so frequent updates (a download's progress)
        /// cannot push life-cycle events out of it.
        case status
    }
    public var kind: Kind
    public var lease: LeaseSnapshot
    public var at: VigilInstant
    /// For `expired`: the expiration handler overran its grace time and the
    /// lease was force-released.
    public var forced: Bool
    /// For `released`/`failed`: why.
    public var detail: String
}

/// A lease whose live status changed: its id and the new status, without
/// the rest of its snapshot.
public struct LeaseStatusChange: Sendable, Hashable {
    public var lease: LeaseID
    public var status: [String: StatusValue]

    public init(lease: LeaseID, status: [String: StatusValue]) {
        self.lease = lease
        self.status = status
    }
}

/// Sees every lease change as the registry publishes it, on the registry
/// (the metrics count this way without a task of their own). Its methods
/// must be quick and must not call back into the registry.
public protocol LeaseObserver: Sendable {
    /// A life-cycle event (any kind but `status`).
    func observe(_ event: LeaseEvent)
    /// `lease`, of `strategy`, took `status` as its live status: without a
    /// copy of its snapshot, which a status per keep-alive ping would cost.
    func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue])
}

/// Which events a ``LeaseRegistry/events(_:)`` subscriber takes: events
/// of these kinds, of leases of this strategy (any when nil).
public struct LeaseEventFilter: Sendable {
    public var kinds: Set<LeaseEvent.Kind>
    public var strategy: String?

    public init(kinds: Set<LeaseEvent.Kind>, strategy: String? = nil) {
        self.kinds = kinds
        self.strategy = strategy
    }

    /// Every event.
    public static let all = LeaseEventFilter(kinds: [.acquired, .renewed, .expiring, .expired, .released, .failed, .status])
    /// The kinds that end a lease.
    public static let endings: Set<LeaseEvent.Kind> = [.expired, .released, .failed]

    public func takes(_ event: LeaseEvent) -> Bool {
        kinds.contains(event.kind) && (strategy == nil || strategy == event.lease.strategy)
    }
}

/// What ``LeaseRegistry/changes()`` delivers: each life-cycle event on its
/// own, and status changes in batches.
public enum LeaseChange: Sendable, Hashable {
    /// Any event but `status`.
    case event(LeaseEvent)
    /// The statuses of one ``LeaseRegistry/setStatuses(_:)`` call (or one
    /// ``LeaseRegistry/setStatus(_:_:)``), in order.
    case statuses([LeaseStatusChange])
}

/// The single source of truth for what Vigil keeps alive.
///
/// Budgets are deadlines on the injected budget clock: awake time in vigild
/// (``AwakeClock``), so a budget is time the work could run and a suspend
/// never eats it (iOS counts a background task's time the same way). When
/// a deadline passes the
/// lease becomes `expiring` and its expiration handler runs for at most its
/// grace time; then the lease is released (`expired`), force-released if the
/// handler overran. Every change is published to `events()` subscribers.
public actor LeaseRegistry: LeaseStatusSink {
    /// An active lease: its fields out of line (``OutOfLine``), so that
    /// `entries` holds a word per bucket, not the few hundred bytes of a
    /// snapshot and a request.
    private struct Entry {
        private struct Fields {
            var snapshot: LeaseSnapshot
            var request: LeaseRequest
            var token: (any PowerToken)?
            var renewing = 0
        }
        private var fields: OutOfLine<Fields>

        init(snapshot: LeaseSnapshot, request: LeaseRequest, token: (any PowerToken)?) {
            fields = OutOfLine(Fields(snapshot: snapshot, request: request, token: token))
        }

        var snapshot: LeaseSnapshot {
            _read { yield fields.value.snapshot }
            _modify { yield &fields.value.snapshot }
        }
        var request: LeaseRequest {
            _read { yield fields.value.request }
            _modify { yield &fields.value.request }
        }
        var token: (any PowerToken)? {
            _read { yield fields.value.token }
            _modify { yield &fields.value.token }
        }
        /// Renewals waiting for the power backend. While one is, the old
        /// deadline does not expire the lease: its holder asked in time,
        /// and the renewal's answer decides (a new deadline, or the end).
        var renewing: Int {
            _read { yield fields.value.renewing }
            _modify { yield &fields.value.renewing }
        }
    }

    /// Times of events and acquisitions (boottime in vigild).
    public nonisolated let clock: any VigilClock
    /// What budgets count: deadlines are instants on this clock.
    public nonisolated let budgetClock: any VigilClock
    public nonisolated let backend: any PowerBackend
    private var entries: [LeaseID: Entry] = [:]
    /// Leases waiting for the power backend's hold (``beingTaken``).
    private var taking: [LeaseID: (strategy: String, since: VigilInstant)] = [:]
    /// The ids in `entries` by holder, so releasing one strategy's leases
    /// does not go through (and copy) every entry: stopping 10,000
    /// voip-socket strategies was quadratic.
    private var byStrategy: [String: HolderLeases] = [:]
    private var nextID: UInt64 = 1
    /// Active leases' deadlines, earliest first, watched by one task
    /// (`deadlineWatch`) rather than one task per lease, which cost every
    /// client lease a task started and one cancelled (two threads woken per
    /// BeginBackgroundTask and End). An entry whose lease has ended, or was
    /// renewed, since is stale: skipped when it comes up, and dropped when
    /// stale entries outnumber the leases.
    private var deadlines = InstantHeap()
    /// The task sleeping until `at`, the earliest deadline when it started;
    /// `number` tells it from a replaced watch that woke before its cancel.
    private var deadlineWatch: (at: VigilInstant, number: UInt64, task: Task<Void, Never>)?
    private var lastDeadlineWatch: UInt64 = 0
    private var subscribers: [UInt64: (filter: LeaseEventFilter, continuation: AsyncStream<LeaseEvent>.Continuation)] = [:]
    private var changeSubscribers: [UInt64: (continuation: AsyncStream<LeaseChange>.Continuation, excluding: String?)] = [:]
    private var nextSubscriber: UInt64 = 0
    private var observers: [any LeaseObserver] = []
    /// The most recent events, oldest first, bounded by count and by bytes
    /// (``LeaseEvent/retainedBytes``), so a few huge strings cannot make the
    /// history hold more memory than a thousand ordinary events.
    public var history: [LeaseEvent] {
        (0..<historyCount).compactMap { historyRing[(historyHead + $0) % historyRing.count] }
    }
    /// The history as a ring, its oldest event at `historyHead`, so that
    /// dropping the oldest moves nothing (`removeFirst` on an array moved
    /// the whole full history, a thousand events, on every lease's begin
    /// and end). A dropped slot is nil until reused.
    private var historyRing: [LeaseEvent?] = []
    private var historyHead = 0
    private var historyCount = 0
    private var historyBytes = 0
    private let historyLimit: Int
    private let historyByteLimit: Int

    /// The default byte bound of the history: 4 MiB.
    public static let defaultHistoryByteLimit = 4 << 20

    /// `budgetClock`: the clock budgets count on, `clock` when nil. vigild
    /// gives ``AwakeClock`` (budgets count awake time); tests give a second
    /// manual clock to suspend the system under a lease.
    public init(clock: any VigilClock, budgetClock: (any VigilClock)? = nil, backend: any PowerBackend = NoPowerBackend(),
                historyLimit: Int = 1_000, historyByteLimit: Int = LeaseRegistry.defaultHistoryByteLimit) {
        self.clock = clock
        self.budgetClock = budgetClock ?? clock
        self.backend = backend
        self.historyLimit = max(1, historyLimit)
        self.historyByteLimit = historyByteLimit
    }

    /// The bytes the history holds now, as ``LeaseEvent/retainedBytes`` counts them.
    public var historyByteCount: Int { historyBytes }

    // MARK: observing

    /// The events from now on that `filter` takes (by default every
    /// event), in order. Ends when the consumer stops iterating.
    ///
    /// The filter is applied here, before the event is queued: a follower
    /// that wants a few kinds (the ends of its own leases) is not woken for
    /// the others, and `status` events, one per keep-alive ping, are made
    /// only while a subscriber takes them.
    public func events(_ filter: LeaseEventFilter = .all) -> AsyncStream<LeaseEvent> {
        let (stream, continuation, key) = subscription(of: LeaseEvent.self)
        subscribers[key] = (filter, continuation)
        return stream
    }

    /// Every change from now on, in order, with statuses batched: a batch of
    /// thousands of keep-alive statuses is one element (one wake-up of the
    /// consumer, one yield), carrying each lease's id and status rather than
    /// an event with a copy of its snapshot. For followers that keep up with
    /// every status (the D-Bus projection). Ends when the consumer stops
    /// iterating. `excluding`: without the life-cycle events of that
    /// strategy's leases (a follower that observes those as they happen).
    public func changes(excluding strategy: String? = nil) -> AsyncStream<LeaseChange> {
        let (stream, continuation, key) = subscription(of: LeaseChange.self)
        guard !changesEnded else {
            continuation.finish()
            return stream
        }
        changeSubscribers[key] = (continuation, strategy)
        return stream
    }

    /// True once ``endChanges()`` ran.
    public private(set) var changesEnded = false

    /// Ends every ``changes(excluding:)`` stream after the changes already
    /// published (the host is stopping and every lease has ended), so a
    /// follower (the D-Bus API) can finish showing them before it goes away.
    public func endChanges() {
        changesEnded = true
        for subscriber in changeSubscribers.values { subscriber.continuation.finish() }
        changeSubscribers = [:]
    }

    /// A new unbounded stream and its key; it unsubscribes when its consumer stops.
    private func subscription<Element>(of: Element.Type) -> (AsyncStream<Element>, AsyncStream<Element>.Continuation, UInt64) {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: .unbounded)
        let key = nextSubscriber
        nextSubscriber += 1
        continuation.onTermination = { [weak self] _ in
            // Unstructured task: not cancelled: one hop into the actor to forget the subscriber,
            // from a synchronous termination handler.
            Task { await self?.unsubscribe(key) }
        }
        return (stream, continuation, key)
    }

    private func unsubscribe(_ key: UInt64) {
        subscribers[key] = nil
        changeSubscribers[key] = nil
    }

    /// Shows every change to `observer` as it is published, on the
    /// registry, after the observers added before it.
    public func observe(_ observer: any LeaseObserver) {
        observers.append(observer)
    }

    /// `observer` (an object added with ``observe(_:)``) sees no more.
    public func stopObserving(_ observer: any LeaseObserver & AnyObject) {
        observers.removeAll { ($0 as AnyObject) === observer }
    }

    /// Leases being taken: asked for, and waiting for the power backend
    /// (right after a resume logind answers Inhibit with OperationInProgress
    /// until its sleep operation has finished, and the backend asks again).
    /// Each is its strategy and the instant it was asked for; its `acquired`
    /// or `failed` event follows.
    public var beingTaken: [(strategy: String, since: VigilInstant)] { Array(taking.values) }

    /// Active (and expiring) leases, by id.
    public var active: [LeaseSnapshot] {
        entries.values.map(\.snapshot).sorted { $0.id < $1.id }
    }

    /// How many leases are active (and expiring), without copying them.
    public var activeCount: Int { entries.count }

    public func lease(_ id: LeaseID) -> LeaseSnapshot? { entries[id]?.snapshot }

    /// Folds the active leases in place, in no order (no copy, no sort), for
    /// aggregates such as the metrics.
    public func reduceActive<Result: Sendable>(into initial: Result, _ update: @Sendable (inout Result, LeaseSnapshot) -> Void) -> Result {
        var result = initial
        for entry in entries.values { update(&result, entry.snapshot) }
        return result
    }

    /// The state of a lease, also after it ended (while it is in the history).
    public func state(of id: LeaseID) -> LeaseState? {
        if let entry = entries[id] { return entry.snapshot.state }
        for back in stride(from: historyCount - 1, through: 0, by: -1) {
            if let event = historyRing[(historyHead + back) % historyRing.count], event.lease.id == id { return event.lease.state }
        }
        return nil
    }

    // MARK: changing

    /// Takes a lease for `strategy`. Throws if the budget is not positive or
    /// the power backend refuses the hold.
    @discardableResult
    public func acquire(strategy: String, _ request: LeaseRequest, client: ClientIdentity? = nil) async throws -> LeaseID {
        try await acquireSnapshot(strategy: strategy, request, client: client).id
    }

    /// ``acquire(strategy:_:client:)``, returning the lease as its
    /// `acquired` event shows it (for a caller that shows it at once).
    public func acquireSnapshot(strategy: String, _ request: LeaseRequest, client: ClientIdentity? = nil) async throws -> LeaseSnapshot {
        if let budget = request.budget, budget <= .zero {
            throw LeaseError(.invalidBudget, "lease budget must be greater than zero, got \(budget.vigilDescription)")
        }
        if request.grace < .zero {
            throw LeaseError(.invalidBudget, "grace time must not be negative, got \(request.grace.vigilDescription)")
        }
        let id = LeaseID(nextID)
        nextID += 1
        let now = clock.now
        let wall = clock.wallMicroseconds
        var snapshot = LeaseSnapshot(
            id: id, strategy: strategy, holds: request.holds, reason: request.reason,
            acquiredAt: now, acquiredWallMicros: wall, budget: request.budget,
            deadline: request.budget.map { budgetClock.now + $0 }, deadlineWallMicros: request.budget.map { wall + $0.microseconds },
            renewals: 0, state: .active, power: "tracked only",
            grace: request.grace, client: client, hold: request.power
        )
        var token: (any PowerToken)?
        if let hold = request.power {
            taking[id] = (strategy, now)
            do {
                // logind lists `who`: for a client, name the app, not "client".
                let who = client.map { "vigil: \($0.name) (uid \($0.uid), pid \($0.pid))" } ?? "vigil: \(strategy)"
                token = try await backend.hold(hold, who: who, why: request.reason, budget: request.budget)
                taking[id] = nil
                snapshot.power = token?.description ?? "tracked only"
            } catch {
                taking[id] = nil
                snapshot.state = .failed
                publish(.failed, snapshot, detail: "\(backend.name): \(error)")
                throw LeaseError(.backendFailed, "\(backend.name) refused the hold: \(error)")
            }
        }
        entries[id] = Entry(snapshot: snapshot, request: request, token: token)
        if let held = byStrategy[strategy] {
            byStrategy[strategy] = held.inserting(id)
        } else {
            byStrategy[strategy] = .one(id)
        }
        publish(.acquired, snapshot)
        armWatcher(id)
        return snapshot
    }

    /// Moves the deadline to now + `budget` (or the lease's own budget),
    /// renewing the power backend's hold first. If the backend cannot renew,
    /// the lease expires at once: its expiration handler runs with its grace
    /// time, and the error is thrown. Returns the lease as renewed (as its
    /// `renewed` event shows it).
    @discardableResult
    public func renew(_ id: LeaseID, budget: Duration? = nil) async throws -> LeaseSnapshot {
        guard let entry = entries[id] else {
            throw LeaseError(.ended, "lease \(id) has ended; it cannot be renewed")
        }
        guard entry.snapshot.state == .active else {
            throw LeaseError(.ended, "lease \(id) is \(entry.snapshot.state.rawValue); it cannot be renewed")
        }
        if let budget, budget <= .zero {
            throw LeaseError(.invalidBudget, "lease budget must be greater than zero, got \(budget.vigilDescription)")
        }
        let newBudget = budget ?? entry.snapshot.budget
        if let token = entry.token {
            // logind may take a while (Inhibit is retried while its sleep
            // operation finishes, through a whole suspend that starts now).
            entries[id]?.renewing += 1
            do {
                try await token.renew(budget: newBudget)
                entries[id]?.renewing -= 1
            } catch {
                entries[id]?.renewing -= 1
                // The actor may have changed while the backend worked.
                if let current = entries[id], current.snapshot.state == .active, let deadline = current.snapshot.deadline {
                    await deadlinePassed(id, deadline: deadline, detail: "\(backend.name) could not renew the hold: \(error)")
                }
                throw LeaseError(.backendFailed, "\(backend.name) could not renew lease \(id): \(error)")
            }
        }
        guard var current = entries[id], current.snapshot.state == .active else {
            throw LeaseError(.ended, "lease \(id) ended while it was being renewed")
        }
        current.snapshot.budget = newBudget
        current.snapshot.deadline = newBudget.map { budgetClock.now + $0 }
        current.snapshot.deadlineWallMicros = deadlineWall(current.snapshot)
        current.snapshot.renewals += 1
        entries[id] = current
        publish(.renewed, current.snapshot)
        armWatcher(id)
        return current.snapshot
    }

    /// Replaces a lease's live status. Does nothing for an ended or unknown
    /// lease, or when the status did not change.
    public func setStatus(_ id: LeaseID, _ status: [String: StatusValue]) {
        setStatuses([(id, status)])
    }

    /// Stores `status` as the status of `id` in place (copying the entry
    /// out and back retains and releases every string it holds, which for
    /// a status set per keep-alive ping of thousands of connections was most
    /// of the call); returns where the entry is and its strategy, or nil
    /// when the lease is unknown or had that status already.
    private func storeStatus(_ id: LeaseID, _ status: [String: StatusValue]) -> (index: [LeaseID: Entry].Index, strategy: String)? {
        guard let index = entries.index(forKey: id), let strategy = Self.replaceStatus(of: &entries.values[index].snapshot, with: status) else { return nil }
        return (index, strategy)
    }

    /// The strategy of `snapshot` once it took `status` (nil: it had it
    /// already). Inout, so the entry is read where it lies (reading it, even
    /// one field, through the table's getter copies the whole entry).
    private static func replaceStatus(of snapshot: inout LeaseSnapshot, with status: [String: StatusValue]) -> String? {
        guard !sameStatus(snapshot.status, status) else { return nil }
        snapshot.status = status
        return snapshot.strategy
    }

    /// `a == b`, mostly without hashing. A strategy's next status is
    /// usually its last one with a value or two changed, which keeps the
    /// key order; walked side by side, the first pair with the same key and
    /// another value proves them different (keys are unique), and the same
    /// pairs all along prove them equal. Only keys out of step need the
    /// hashed comparison (a lookup per key, per status of every ping).
    static func sameStatus(_ a: [String: StatusValue], _ b: [String: StatusValue]) -> Bool {
        guard a.count == b.count else { return false }
        for (x, y) in zip(a, b) {
            guard x.key == y.key else { return a == b }
            guard x.value == y.value else { return false }
        }
        return true
    }

    /// ``setStatus(_:_:)`` for many leases, in order, in one call.
    ///
    /// Subscribers hear of the batch after the whole batch is stored: a
    /// ``changes()`` subscriber as one element carrying ids and statuses,
    /// an ``events(_:)`` subscriber that takes statuses as one `status`
    /// event per lease, in order (made only when there is one: each copies
    /// the lease's snapshot). Yielded one by one between stores, each status woke a
    /// subscriber that had just emptied its stream (a thread wake-up per
    /// status, the largest cost of a keep-alive ping's status with vigild's
    /// bus projection following); and an event per status copies the
    /// lease's snapshot, which only per-event subscribers need.
    public func setStatuses(_ updates: [(lease: LeaseID, status: [String: StatusValue])]) {
        let perEvent = subscribers.values.contains { $0.filter.kinds.contains(.status) }
        var events: [LeaseEvent] = []
        var changes: [LeaseStatusChange] = []
        if perEvent { events.reserveCapacity(updates.count) }
        if !changeSubscribers.isEmpty { changes.reserveCapacity(updates.count) }
        let now = clock.now
        for update in updates {
            guard let (index, strategy) = storeStatus(update.lease, update.status) else { continue }
            for observer in observers { observer.observeStatus(of: update.lease, strategy: strategy, update.status) }
            if perEvent {
                events.append(LeaseEvent(kind: .status, lease: entries.values[index].snapshot, at: now, forced: false, detail: ""))
            }
            if !changeSubscribers.isEmpty { changes.append(LeaseStatusChange(lease: update.lease, status: update.status)) }
        }
        if perEvent {
            for subscriber in subscribers.values where subscriber.filter.kinds.contains(.status) {
                for event in events where subscriber.filter.takes(event) { subscriber.continuation.yield(event) }
            }
        }
        if !changes.isEmpty {
            for subscriber in changeSubscribers.values { subscriber.continuation.yield(.statuses(changes)) }
        }
    }

    /// Ends a lease. Releasing an ended or unknown lease does nothing.
    public func release(_ id: LeaseID, detail: String = "released by holder") async {
        await end(id, as: .released, forced: false, detail: detail)
    }

    /// Releases every lease held by `strategy` (its `run` ended).
    public func releaseAll(strategy: String, detail: String) async {
        for id in byStrategy[strategy]?.sorted ?? [] {
            await end(id, as: .released, forced: false, detail: detail)
        }
    }

    /// Releases every lease (host shutdown).
    public func releaseEverything(detail: String) async {
        for id in entries.keys.sorted() {
            await end(id, as: .released, forced: false, detail: detail)
        }
    }

    // MARK: internals

    private func end(_ id: LeaseID, as kind: LeaseEvent.Kind, forced: Bool, detail: String) async {
        guard var entry = entries.removeValue(forKey: id) else { return }
        if let held = byStrategy[entry.snapshot.strategy] {
            byStrategy[entry.snapshot.strategy] = held.removing(id)
        }
        entry.snapshot.state = kind == .expired ? .expired : .released
        await entry.token?.release()
        publish(kind, entry.snapshot, forced: forced, detail: detail)
    }

    /// The wall time of a lease's deadline as ``LeaseSnapshot/deadlineWallMicros`` defines it.
    private func deadlineWall(_ lease: LeaseSnapshot) -> Int64? {
        guard let deadline = lease.deadline else { return nil }
        return lease.acquiredWallMicros + (clock.now - lease.acquiredAt).microseconds + (deadline - budgetClock.now).microseconds
    }

    /// After a system resume: each lease's deadline wall time moves later by
    /// the time slept where the budget clock did not count it. No event: the
    /// budget and the deadline on the budget clock are unchanged.
    public func systemResumed() {
        for (id, entry) in entries where entry.snapshot.deadline != nil {
            entries[id]?.snapshot.deadlineWallMicros = deadlineWall(entry.snapshot)
        }
    }

    /// Watches the lease's deadline (just acquired or renewed).
    private func armWatcher(_ id: LeaseID) {
        guard let deadline = entries[id]?.snapshot.deadline else { return }
        if deadlines.count >= 2 * entries.count + 64 {
            deadlines.rebuild { entries[LeaseID($0)]?.snapshot.state == .active }
        }
        deadlines.push(deadline, id.rawValue)
        if let watch = deadlineWatch, watch.at <= deadline { return }
        watchDeadlines(until: deadline)
    }

    /// Whether the heap's entry (`at`, `id`) is still a lease's deadline.
    private func isDeadline(_ at: VigilInstant, of id: LeaseID) -> Bool {
        guard let entry = entries[id] else { return false }
        return entry.snapshot.state == .active && entry.snapshot.deadline == at
    }

    private func watchDeadlines(until at: VigilInstant) {
        deadlineWatch?.task.cancel()
        let clock = budgetClock
        lastDeadlineWatch += 1
        let number = lastDeadlineWatch
        // Unstructured task: cancelled when the next deadline watch replaces it.
        deadlineWatch = (at, number, Task { [weak self] in
            do { try await clock.sleep(until: at) } catch { return }
            await self?.deadlinesPassed(watch: number)
        })
    }

    /// On the watch task, once its time came: every lease whose deadline
    /// passed expires; the watch moves on to the next deadline first. A
    /// watch replaced meanwhile (by an earlier deadline) does nothing.
    private func deadlinesPassed(watch number: UInt64) async {
        guard deadlineWatch?.number == number else { return }
        deadlineWatch = nil
        let now = budgetClock.now
        var due: [(id: LeaseID, deadline: VigilInstant)] = []
        while let top = deadlines.top {
            let id = LeaseID(top.id)
            if !isDeadline(top.at, of: id) {
                deadlines.pop()
            } else if top.at <= now {
                deadlines.pop()
                // A renewal in flight sets the next deadline, or ends the lease.
                if entries[id]?.renewing == 0 { due.append((id, top.at)) }
            } else {
                break
            }
        }
        if let next = deadlines.top { watchDeadlines(until: next.at) }
        // Each expiry runs its handler for up to its grace time: all but
        // the last on tasks of their own; the last on this task, which no
        // longer is the watch (so it is never cancelled with it).
        guard let last = due.popLast() else { return }
        for lease in due {
            // Unstructured task: not cancelled, on purpose: a newer deadline watch must not cancel
            // an expiry already under way; each ends when its lease has expired.
            Task { await self.deadlinePassed(lease.id, deadline: lease.deadline, detail: "budget ran out") }
        }
        await deadlinePassed(last.id, deadline: last.deadline, detail: "budget ran out")
    }

    private func deadlinePassed(_ id: LeaseID, deadline: VigilInstant, detail: String) async {
        guard var entry = entries[id], entry.snapshot.state == .active, entry.snapshot.deadline == deadline else { return }
        entry.snapshot.state = .expiring
        // The handler below runs on the task that called this (the deadline
        // watch's, no longer the watch), so nothing cancels it. A later
        // call finds the state changed.
        entries[id] = entry
        publish(.expiring, entry.snapshot, detail: detail)

        guard let handler = entry.request.onExpire else {
            await end(id, as: .expired, forced: false, detail: "budget ran out; no expiration handler")
            return
        }
        // Race the handler against its grace time; whichever finishes first wins.
        let grace = entry.request.grace
        let clock = self.clock
        let expiry = LeaseExpiry(lease: id, grace: grace)
        let handlerFinished = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await handler(expiry)
                return true
            }
            group.addTask {
                do { try await clock.sleep(for: grace) } catch {}
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        if handlerFinished {
            await end(id, as: .expired, forced: false, detail: "budget ran out; expiration handler finished")
        } else {
            await end(id, as: .expired, forced: true, detail: "expiration handler overran its grace time of \(grace.vigilDescription); force-released")
        }
    }

    private func publish(_ kind: LeaseEvent.Kind, _ snapshot: LeaseSnapshot, forced: Bool = false, detail: String = "") {
        let event = LeaseEvent(kind: kind, lease: snapshot, at: clock.now, forced: forced, detail: detail)
        if kind != .status { remember(event) }
        deliver(event)
    }

    /// A life-cycle event (statuses go through ``setStatuses(_:)``).
    private func deliver(_ event: LeaseEvent) {
        for observer in observers { observer.observe(event) }
        for subscriber in subscribers.values where subscriber.filter.takes(event) { subscriber.continuation.yield(event) }
        for subscriber in changeSubscribers.values where subscriber.excluding != event.lease.strategy { subscriber.continuation.yield(.event(event)) }
    }
}

extension LeaseRegistry {
    /// Appends to the history, then drops the oldest events until it is
    /// within both bounds again (the newest event is always kept).
    private func remember(_ event: LeaseEvent) {
        if historyCount < historyRing.count {
            historyRing[(historyHead + historyCount) % historyRing.count] = event
        } else if historyRing.count < historyLimit {
            // Growing to the limit: in order first, if drops moved the head.
            if historyHead != 0 {
                historyRing = history.map(Optional.some)
                historyHead = 0
            }
            historyRing.append(event)
        } else {
            // Full: the newest takes the oldest's place.
            dropOldestEvent()
            historyRing[(historyHead + historyCount) % historyRing.count] = event
        }
        historyCount += 1
        historyBytes += event.retainedBytes
        while historyCount > 1, historyBytes > historyByteLimit { dropOldestEvent() }
    }

    private func dropOldestEvent() {
        historyBytes -= historyRing[historyHead]?.retainedBytes ?? 0
        historyRing[historyHead] = nil
        historyHead = (historyHead + 1) % historyRing.count
        historyCount -= 1
    }
}

extension LeaseEvent {
    /// An estimate of the memory this event keeps alive: its strings' UTF-8
    /// bytes and status entries plus a fixed share for the rest.
    public var retainedBytes: Int {
        var bytes = 256 + detail.utf8.count
        bytes += lease.strategy.utf8.count + lease.holds.utf8.count + lease.reason.utf8.count + lease.power.utf8.count
        if let client = lease.client { bytes += client.owner.utf8.count + client.name.utf8.count }
        for (key, value) in lease.status {
            bytes += 32 + key.utf8.count
            if case .string(let text) = value { bytes += text.utf8.count }
        }
        return bytes
    }
}

/// A strategy's view of the registry: acquires in the strategy's name.
public struct StrategyLeases: LeaseProvider {
    public let registry: LeaseRegistry
    public let strategy: String
    /// Called after each lease is acquired, before the strategy has it
    /// (the supervisor learns that a failed strategy recovered).
    public let acquired: @Sendable () -> Void

    public init(registry: LeaseRegistry, strategy: String, acquired: @escaping @Sendable () -> Void = {}) {
        self.registry = registry
        self.strategy = strategy
        self.acquired = acquired
    }

    public func acquire(_ request: LeaseRequest) async throws -> any LeaseHandle {
        let id = try await registry.acquire(strategy: strategy, request)
        acquired()
        return RegistryLease(id: id, registry: registry)
    }
}

extension StrategyLeases: SystemSleepWatching {
    /// Through the registry's power backend, when it is logind's.
    public func watchSleep(
        who: String, beforeSleep: @escaping @Sendable () async -> Void, afterResume: @escaping @Sendable () async -> Void
    ) async throws -> Task<Void, Never> {
        guard let logind = registry.backend as? LogindPowerBackend else {
            throw LeaseError(.backendFailed, "the power backend is \(registry.backend.name), which does not announce system sleep (only logind does)")
        }
        return try await logind.watchSleep(
            who: who, why: "let strategy \(strategy) stop before the system sleeps", onSleep: beforeSleep, onResume: afterResume)
    }
}

/// A lease handle backed by the registry.
public struct RegistryLease: BatchableLeaseHandle {
    public let id: LeaseID
    let registry: LeaseRegistry

    public func renew(budget: Duration?) async throws {
        try await registry.renew(id, budget: budget)
    }

    public func release() async {
        await registry.release(id)
    }

    public func setStatus(_ status: [String: StatusValue]) async {
        await registry.setStatus(id, status)
    }

    public var statusSink: any LeaseStatusSink { registry }

    public var state: LeaseState {
        get async { await registry.state(of: id) ?? .released }
    }
}

/// The ids of one holder's leases (``LeaseRegistry``'s `byStrategy`): most
/// holders have one, kept inline; a set of one cost an allocation of about
/// a hundred bytes per strategy.
private enum HolderLeases {
    case one(LeaseID)
    case many(Set<LeaseID>)

    func inserting(_ id: LeaseID) -> HolderLeases {
        switch self {
        case .one(let held):
            return held == id ? self : .many([held, id])
        case .many(var ids):
            ids.insert(id)
            return .many(ids)
        }
    }

    /// Nil when no id is left.
    func removing(_ id: LeaseID) -> HolderLeases? {
        switch self {
        case .one(let held):
            return held == id ? nil : self
        case .many(var ids):
            ids.remove(id)
            if ids.count == 1, let last = ids.first { return .one(last) }
            return ids.isEmpty ? nil : .many(ids)
        }
    }

    var sorted: [LeaseID] {
        switch self {
        case .one(let id): [id]
        case .many(let ids): ids.sorted()
        }
    }
}
