import VigilDBus
import VigilKit

/// The host's `org.vigil.Vigil1` objects on D-Bus (docs/dbus-api.md).
///
/// `export()` attaches an object server to the connection and exports the
/// root object `/org/vigil/Vigil1` (Host + ObjectManager), one object per
/// strategy and one per active lease. From then on it follows the host
/// (the ``HostBusParts`` it is given, not the whole runtime):
/// lease objects and strategy objects appear and disappear
/// (`InterfacesAdded` / `InterfacesRemoved`), the Host signals and
/// `PropertiesChanged` are emitted as the registry and the supervisor
/// report changes. Call `export()` before requesting the bus name, so that
/// a client that sees the name finds the objects.
///
/// The objects show this actor's copy of the registry and supervisor state,
/// updated in event order, so that what a client reads always agrees with
/// the signals it has received.
///
/// Handlers never wait for this actor: each change publishes an immutable
/// snapshot (behind a lock) that reads (Properties.Get/GetAll, ListLeases,
/// ListStrategies, GetManagedObjects) take without an actor hop, the rows
/// encoded once per change; BeginBackgroundTask, End and Renew run
/// nonisolated too, so a Begin never queues behind readers or behind the
/// following of events.
public actor HostBusAPI {
    /// What it is given of the host.
    public nonisolated let parts: HostBusParts
    public nonisolated let connection: DBusConnection
    /// The uid vigild runs as: besides root, the only uid allowed to call
    /// mutating methods.
    public nonisolated let hostUID: UInt32

    /// What the strategy object shows: its fields out of line
    /// (``OutOfLine``), so the table of strategies holds a word per bucket.
    struct StrategyEntry: Sendable {
        private struct Fields: Sendable {
            var status: StrategyStatus
            var config: [String: ConfigValue]
            var path: String
        }
        private var fields: OutOfLine<Fields>

        /// `path`: the strategy's object path, the string the object
        /// server's table keys it by and the `Strategies` list shows.
        init(status: StrategyStatus, config: [String: ConfigValue], path: String) {
            fields = OutOfLine(Fields(status: status, config: config, path: path))
        }

        /// Its object path, made once.
        var path: String { fields.value.path }

        var status: StrategyStatus {
            _read { yield fields.value.status }
            _modify { yield &fields.value.status }
        }
        /// The strategy's TOML table when the object was exported.
        var config: [String: ConfigValue] {
            _read { yield fields.value.config }
            _modify { yield &fields.value.config }
        }
    }

    /// What a lease object shows: its fields out of line (``OutOfLine``),
    /// so the table of leases holds a word per bucket, not a snapshot.
    struct LeaseEntry: Sendable {
        private struct Fields: Sendable {
            var snapshot: LeaseSnapshot
            var kind: String
            var path: String
        }
        private var fields: OutOfLine<Fields>

        var snapshot: LeaseSnapshot {
            _read { yield fields.value.snapshot }
            _modify { yield &fields.value.snapshot }
        }
        /// The kind of the lease's strategy.
        var kind: String {
            _read { yield fields.value.kind }
            _modify { yield &fields.value.kind }
        }
        /// Its object path, made once: a status batch names thousands.
        var path: String {
            _read { yield fields.value.path }
            _modify { yield &fields.value.path }
        }

        /// `path`: the lease's object path, the one string the object
        /// server's table and the rate limiter key the object by too (each
        /// made its own copy: 48 bytes of heap apiece per lease).
        init(snapshot: LeaseSnapshot, kind: String, path: String) {
            fields = OutOfLine(Fields(snapshot: snapshot, kind: kind, path: path))
        }

        /// Takes `status`; returns the path to announce (changed in place:
        /// reading an entry out of the table copies it).
        mutating func take(_ status: [String: StatusValue]) -> String {
            snapshot.status = status
            return path
        }
    }

    /// What the handlers read, published by this actor after each change.
    struct Published: Sendable {
        var strategyOrder: [String] = []
        var strategies: [String: StrategyEntry] = [:]
        var leases: [LeaseID: LeaseEntry] = [:]
        /// Encoded on the first read after a change.
        var strategyPaths: BusEncoded<[ObjectPath]>?
        var strategyRows: [StrategyRow]?
        var leasePaths: BusEncoded<[ObjectPath]>?
        var leaseRows: DBusPreparedReply<BusTuple<[LeaseRow]>>?
        /// The highest lease id whose object was exported.
        var highestShownLease: UInt64 = 0
        /// The pace of the Host's `Leases` and `Strategies` announcements.
        var leasesPace = AnnouncementPace()
        var strategiesPace = AnnouncementPace()

        /// The pace of `list`'s announcements.
        subscript(pace list: PacedList) -> AnnouncementPace {
            get {
                switch list {
                case .leases: leasesPace
                case .strategies: strategiesPace
                }
            }
            set {
                switch list {
                case .leases: leasesPace = newValue
                case .strategies: strategiesPace = newValue
                }
            }
        }
        /// Calls waiting for their lease's object (the inhibit bridge's).
        var showWaiters: [LeaseID: [CheckedContinuation<Void, Never>]] = [:]
        /// The object server, while the host is followed: set once
        /// everything is exported and followed, cleared by ``stop()``.
        var server: DBusObjectServer?
    }

    private nonisolated let published = Lock(Published())
    /// The interface lists of lease objects: a lease's (Lease) and a
    /// client lease's (Lease, ClientLease), one array each that every lease
    /// object shares (``HostBusInterfaces/lease(_:)``), so the object
    /// server's table holds a reference per object, not an array of its
    /// own (96 bytes of heap per lease); made at the first lease's export.
    private nonisolated let leaseInterfaceValues = Lock<(lease: [DBusInterface], clientLease: [DBusInterface])?>(nil)

    /// The Strategy interface, in one array every strategy object shares
    /// (``HostBusInterfaces/strategy(_:)``); made at the first strategy's export.
    private nonisolated let strategyInterfaceValue = Lock<[DBusInterface]?>(nil)

    private nonisolated var strategyInterfaces: [DBusInterface] {
        strategyInterfaceValue.withLock { value in
            if let value { return value }
            let made = [HostBusInterfaces.strategy(self)]
            value = made
            return made
        }
    }

    private nonisolated var leaseInterfaces: (lease: [DBusInterface], clientLease: [DBusInterface]) {
        leaseInterfaceValues.withLock { values in
            if let values { return values }
            let lease = HostBusInterfaces.lease(self)
            let made = (lease: [lease], clientLease: [lease, HostBusInterfaces.clientLease(self)])
            values = made
            return made
        }
    }
    private var server: DBusObjectServer?
    // The strategy entries and their order live only in `published`, as
    // the lease entries do: a copy here, handed over after each change,
    // shared its storage, so the next change copied the whole table (and
    // the order), which made starting 10,000 strategies quadratic.

    /// Sets or removes one strategy's entry in place; a strategy that comes
    /// or goes changes the order (and the `Strategies` paths) too.
    private func setStrategy(_ name: String, _ entry: StrategyEntry?) {
        published.withLock { state in
            let membership = (state.strategies[name] == nil) != (entry == nil)
            state.strategies[name] = entry
            state.strategyRows = nil
            guard membership else { return }
            if entry == nil {
                state.strategyOrder.removeAll { $0 == name }
            } else {
                state.strategyOrder.append(name)
            }
            state.strategyPaths = nil
        }
    }
    /// The lease entries live only in `published` (a second copy here
    /// would share its storage, and every change would copy the whole
    /// table): ``setLease(_:_:rows:)`` changes one entry in place.
    private func leaseEntry(_ id: LeaseID) -> LeaseEntry? { published.withLock { $0.leases[id] } }

    /// Sets or removes one lease's entry. `rows`: whether a ListLeases row
    /// changes (not for `Status`, which rows do not carry); the paths
    /// change when a lease comes or goes.
    private func setLease(_ id: LeaseID, _ entry: LeaseEntry?, rows: Bool = true) {
        published.withLock { state in
            let membership = (state.leases[id] == nil) != (entry == nil)
            state.leases[id] = entry
            if membership { state.leasePaths = nil }
            if rows || membership { state.leaseRows = nil }
        }
    }
    private var followers: [Task<Void, Never>] = []
    /// The followers of the registry's changes and of the supervisor's
    /// statuses (in `followers` too), which ``drain()`` lets finish.
    private var leaseFollower: Task<Void, Never>?
    private var statusFollower: Task<Void, Never>?
    /// Shows client leases as the registry changes them (while exported).
    private var clientLeaseProjection: ClientLeaseProjection?
    /// Callers' uid and pid by unique name, while they are on the bus.
    nonisolated let credentials: CallerCredentials
    /// At most one PropertiesChanged per second for a lease's `Status` (and
    /// for strategies' child objects), and at most 20 a second for the
    /// host; a change inside the interval, or beyond the host's budget, is
    /// announced later, with the status of that moment. Reads always see
    /// the newest status.
    private var limiter: PropertiesChangedLimiter?
    /// The freedesktop inhibit names and objects, when served.
    private var inhibitBridge: InhibitBusBridge?
    private let survival: SurvivalRunReader
    let log: Logger

    public init(parts: HostBusParts, connection: DBusConnection, hostUID: UInt32) {
        self.parts = parts
        self.connection = connection
        self.hostUID = hostUID
        self.credentials = CallerCredentials(connection: connection)
        self.survival = SurvivalRunReader(path: parts.store.path)
        self.log = parts.logging.logger("dbus")
    }

    deinit {
        for task in followers { task.cancel() }
    }

    // MARK: exporting

    /// Exports the objects and starts following the host. Call once.
    public func export() async throws {
        guard server == nil else { throw DBusError.failed("the org.vigil.Vigil1 objects are already exported") }
        // Subscribe before taking the snapshot: an event that happens in
        // between is in both, and the handlers skip what is already shown.
        let leaseChanges = await parts.registry.changes(excluding: ClientLeases.strategyName)
        let statusChanges = await parts.supervisor.changes()
        let server = try await DBusObjectServer(connection: connection, logger: log)
        self.server = server
        // Client leases are shown by an observer of the registry, from the
        // moment the server is published: before the snapshot of the active
        // leases, so each client lease is in one or the other (or both: then
        // the snapshot's export skips it).
        let projection = ClientLeaseProjection(self)
        clientLeaseProjection = projection
        await parts.registry.observe(projection)
        let limiter = PropertiesChangedLimiter(clock: parts.clock, log: log, server: server)
        self.limiter = limiter
        try await server.addObjectManager(at: VigilAPI.rootPath)
        await parts.strategyBus.attach(server: server, hostUID: hostUID, credentials: credentials, limiter: limiter)
        try await server.export(VigilAPI.rootPath, interfaces: [HostBusInterfaces.host(self)])
        published.withLock { $0.server = server }
        for status in await parts.supervisor.statuses where status.state != .stopped {
            try await addStrategy(status, on: server)
        }
        for lease in await parts.registry.active where leaseEntry(lease.id) == nil {
            try await addLease(lease, on: server)
        }
        if await parts.servesInhibits() {
            let credentials = self.credentials
            let bridge = InhibitBusBridge(server: server, connection: connection, inhibits: parts.inhibits, log: log, credentials: { call in
                let caller = try await credentials.of(call.sender)
                return (caller.uid, caller.pid)
            }, shown: { [weak self] id in await self?.waitUntilShown(id) })
            inhibitBridge = bridge
            try await bridge.export()
        }
        // Unstructured task: kept in `followers`, cancelled by stop() (or deinit).
        let leaseFollower = Task { [weak self] in
            for await change in leaseChanges {
                guard let self else { return }
                switch change {
                case .event(let event): await self.follow(event)
                case .statuses(let statuses): await self.follow(statuses)
                }
            }
        }
        self.leaseFollower = leaseFollower
        followers.append(leaseFollower)
        followers.append(try await followDisconnects())
        // Unstructured task: kept in `followers`, cancelled by stop() (or deinit).
        let statusFollower = Task { [weak self] in
            for await status in statusChanges {
                guard let self else { return }
                await self.follow(status)
            }
        }
        self.statusFollower = statusFollower
        followers.append(statusFollower)
        let breaks = await parts.sleepBreaks()
        // Unstructured task: kept in `followers`, cancelled by stop() (or deinit).
        followers.append(Task { [weak self] in
            for await broken in breaks {
                guard let self else { return }
                await self.tell(broken)
            }
        })
    }

    /// `SleepBrokeLease`, once per lease the suspend broke.
    private func tell(_ broken: BrokenSleep) async {
        for lease in broken.leases {
            do {
                try await emit(VigilAPI.Host.sleepBrokeLease, SleepBrokeLeaseSignal(
                    lease: VigilAPI.leasePath(LeaseID(lease.id)), holder: lease.holder, name: lease.name,
                    sleptUsec: UInt64(max(0, broken.sleptMicros)), wakeCause: broken.wakeCause))
            } catch {
                log.warning("cannot announce that sleep broke lease \(lease.id): \(error)")
            }
        }
    }

    /// Lets the followers show what the host published before it stopped:
    /// waits for the status and lease followers whose streams have ended
    /// (``Supervisor/endChanges()``, ``LeaseRegistry/endChanges()``), so
    /// the last StrategyStateChanged and lease signals go out before the
    /// connection closes. A follower whose stream goes on is not waited for.
    public func drain() async {
        if await parts.supervisor.changesEnded { await statusFollower?.value }
        if await parts.registry.changesEnded { await leaseFollower?.value }
    }

    /// The most rate-limited PropertiesChanged signals a second, for the
    /// whole host (``PropertiesChangedLimiter``).
    public static let rateLimitedAnnouncementsPerSecond = PropertiesChangedLimiter.defaultAnnouncementsPerSecond

    /// The PropertiesChanged signals the rate limiter has sent so far (a
    /// lease's `Status`, strategies' child objects), for the benchmarks.
    public func rateLimitedAnnouncements() async -> Int {
        await limiter?.announcements ?? 0
    }

    /// Stops following the host (the objects stay as they are).
    public func stop() async {
        published.withLock { $0.server = nil }
        if let projection = clientLeaseProjection { await parts.registry.stopObserving(projection) }
        clientLeaseProjection = nil
        for task in followers { task.cancel() }
        followers = []
        await limiter?.forgetAll()
    }

    /// The connection is gone (the bus went away): stop following, end the
    /// client leases (their holders were on that bus) and let the strategy
    /// bridge export everything again on the next connection.
    public func connectionLost() async {
        await stop()
        await parts.strategyBus.detach()
        await parts.clientLeases.busLost()
        await parts.inhibits.busLost()
    }

    /// The introspection XML of the whole API (docs/org.vigil.Vigil1.xml),
    /// generated from the contract.
    public static func introspectionXML() -> String { HostBusInterfaces.introspectionXML() }

    /// The introspection XML of the freedesktop inhibit interfaces vigild
    /// serves (docs/freedesktop-inhibit.xml), generated from their declarations.
    public static func inhibitIntrospectionXML() -> String { InhibitBusBridge.introspectionXML() }

    // MARK: access

    /// Whether a caller running as `callerUID` may call mutating methods:
    /// root and the uid vigild runs as.
    public static func mayMutate(callerUID: UInt32, hostUID: UInt32) -> Bool {
        callerUID == 0 || callerUID == hostUID
    }

    /// Throws `AccessDenied` unless ``mayMutate(callerUID:hostUID:)``.
    static func requireMayMutate(callerUID: UInt32, hostUID: UInt32, method: String) throws(DBusError) {
        guard mayMutate(callerUID: callerUID, hostUID: hostUID) else {
            throw DBusError.accessDenied("\(method) is allowed only to root and to uid \(hostUID), which vigild runs as; the caller runs as uid \(callerUID)")
        }
    }

    // MARK: reading (for the handlers)

    nonisolated func strategy(named name: String) -> StrategyEntry? { published.withLock { $0.strategies[name] } }

    /// `read` of the strategy's entry where it lies, under the lock (as
    /// ``readLease(_:_:)``): a property getter takes one field, not a copy
    /// of the whole entry. Nil when the strategy is not shown.
    nonisolated func readStrategy<T>(_ name: String, _ read: (borrowing StrategyEntry) -> T) -> T? {
        published.withLock { state in
            guard let index = state.strategies.index(forKey: name) else { return nil }
            return read(state.strategies.values[index])
        }
    }

    /// `read` of the lease's entry where it lies, under the lock: a
    /// property getter takes one field, not a copy of the whole entry
    /// (every string of it retained and released, for each of the
    /// fourteen values a lease's InterfacesAdded reads). Nil when the
    /// lease is not shown.
    nonisolated func readLease<T>(_ id: LeaseID, _ read: (borrowing LeaseEntry) -> T) -> T? {
        published.withLock { state in
            guard let index = state.leases.index(forKey: id) else { return nil }
            return read(state.leases.values[index])
        }
    }

    nonisolated func strategyPaths() -> BusEncoded<[ObjectPath]> {
        published.withLock { state in
            if let cached = state.strategyPaths { return cached }
            // The entries' own path strings, shared, not a copy of each.
            let paths = BusEncoded(state.strategyOrder.map { ObjectPath(state.strategies[$0]?.path ?? VigilAPI.strategyPath($0)) })
            state.strategyPaths = paths
            return paths
        }
    }

    nonisolated func leasePaths() -> BusEncoded<[ObjectPath]> {
        published.withLock { state in
            if let cached = state.leasePaths { return cached }
            // The entries' own path strings, shared, not a copy of each.
            let paths = BusEncoded(state.leases.sorted { $0.key < $1.key }.map { ObjectPath($0.value.path) })
            state.leasePaths = paths
            return paths
        }
    }

    /// The ListLeases reply body, marshalled once per change.
    nonisolated func leaseRows() throws(DBusError) -> DBusPreparedReply<BusTuple<[LeaseRow]>> {
        try published.withLock { state throws(DBusError) in
            if let cached = state.leaseRows { return cached }
            let rows = try DBusPreparedReply(BusTuple(Self.leaseRows(state.leases)))
            state.leaseRows = rows
            return rows
        }
    }

    nonisolated func strategyRows() -> [StrategyRow] {
        published.withLock { state in
            if let cached = state.strategyRows { return cached }
            let rows = Self.strategyRows(order: state.strategyOrder, state.strategies)
            state.strategyRows = rows
            return rows
        }
    }

    static func leaseRows(_ leases: [LeaseID: LeaseEntry]) -> [LeaseRow] {
        leases.keys.sorted().compactMap { id -> LeaseRow? in
            guard let entry = leases[id] else { return nil }
            let lease = entry.snapshot
            return LeaseRow(
                path: entry.path, id: id.rawValue, strategy: lease.strategy, kind: entry.kind,
                holds: lease.holds, reason: lease.reason, acquiredAt: UInt64(clamping: lease.acquiredWallMicros),
                deadline: HostBusValues.deadlineWallMicros(lease), renewals: UInt32(clamping: lease.renewals),
                state: lease.state.rawValue)
        }
    }

    static func strategyRows(order strategyOrder: [String], _ strategies: [String: StrategyEntry]) -> [StrategyRow] {
        strategyOrder.compactMap { name -> StrategyRow? in
            guard let entry = strategies[name] else { return nil }
            let status = entry.status
            return StrategyRow(path: entry.path, name: name, kind: status.kind, state: status.state.rawValue,
                               restarts: UInt32(clamping: status.restarts), lastError: status.lastError ?? "")
        }
    }

    /// `Survival`: runs that started at or after `since` (0: all), newest first.
    nonisolated func survivalRows(since: UInt64) throws -> [RunRow] {
        let runs: [RunSummary]
        do {
            runs = try survival.runs(startedSince: Int64(clamping: since))
        } catch {
            throw DBusError.failed("cannot read the survival log: \(error)")
        }
        return runs.map(RunRow.init)
    }

    // MARK: following the host

    /// One registry event: for a lease, the object appears before
    /// `LeaseAcquired` and disappears after its final signal.
    private func follow(_ event: LeaseEvent) async {
        guard let server else { return }
        let id = event.lease.id
        let path = VigilAPI.leasePath(id)
        do {
            switch event.kind {
            case .failed:
                // Refused by the power backend: it never existed.
                return
            case .acquired:
                // Shown already when the export's snapshot had it.
                guard leaseEntry(id) == nil else { return }
                // One hop to the connection's queue: the object, then the signals.
                try await addLease(event.lease, on: server, then: published.withLock { announceLeases(&$0) } + [
                    Self.hostSignal(VigilAPI.Host.leaseAcquired, LeaseAcquiredSignal(lease: path, strategy: event.lease.strategy, holds: event.lease.holds)),
                ])
            case .renewed:
                showRenewal(event.lease, on: server)
            case .status:
                // Statuses come batched (``follow(_:)`` of the changes).
                return
            case .expiring:
                guard var entry = leaseEntry(id), entry.snapshot.state == .active else { return }
                entry.snapshot = event.lease
                setLease(id, entry)
                try await server.apply(Self.leaseExpiringChanges(event, path: path))
            case .expired, .released:
                guard leaseEntry(id) != nil else { return }
                // Gone from what readers see before the signals are built, so
                // the root's Leases no longer lists it; its State goes with
                // its value.
                setLease(id, nil)
                await limiter?.forget(path)
                try await server.apply(Self.leaseEndChanges(event, path: path) + published.withLock { announceLeases(&$0) })
            }
        } catch {
            log.with(lease: id).warning("cannot publish lease \(id) \(event.kind.rawValue) on D-Bus: \(error)")
        }
    }

    /// A batch of status changes: stored in place under one lock, then
    /// each shown lease's `Status` goes to the limiter, all in one hop.
    private func follow(_ statuses: [LeaseStatusChange]) async {
        let shown: [String] = published.withLock { state in
            var paths: [String] = []
            paths.reserveCapacity(statuses.count)
            for change in statuses {
                guard let index = state.leases.index(forKey: change.lease) else { continue }
                paths.append(state.leases.values[index].take(change.status))
            }
            return paths
        }
        await limiter?.changed(shown, properties: [VigilAPI.Lease.status.name])
    }

    /// How long the expiration handler of an expiring lease may still run
    /// before the lease is force-released: its grace time (the event is
    /// published as the budget runs out).
    static func remainingMicros(_ event: LeaseEvent) -> UInt64 { UInt64(max(0, event.lease.grace.microseconds)) }

    /// One supervisor status: a strategy's object appears with its first
    /// status and disappears after the `stopped` one.
    private func follow(_ status: StrategyStatus) async {
        guard let server else { return }
        let path = VigilAPI.strategyPath(status.name)
        do {
            guard var entry = strategy(named: status.name) else {
                guard status.state != .stopped else { return }
                try await addStrategy(status, on: server)
                try await server.apply(published.withLock { announceStrategies(&$0) })
                try await emit(VigilAPI.Host.strategyStateChanged, StrategyStateChangedSignal(
                    strategy: path, state: status.state.rawValue, lastError: status.lastError ?? ""))
                return
            }
            let old = entry.status
            var changed: [String] = []
            if old.state != status.state { changed.append(VigilAPI.Strategy.state.name) }
            if old.restarts != status.restarts { changed.append(VigilAPI.Strategy.restarts.name) }
            if old.lastError != status.lastError { changed.append(VigilAPI.Strategy.lastError.name) }
            if old.lastErrorWallMicros != status.lastErrorWallMicros { changed.append(VigilAPI.Strategy.lastErrorAt.name) }
            if old.waitingFor != status.waitingFor { changed.append(VigilAPI.Strategy.waitingFor.name) }
            guard !changed.isEmpty else { return }
            entry.status = status
            setStrategy(status.name, entry)
            try await server.emitPropertiesChanged(path: path, interface: VigilAPI.strategyInterface, properties: changed)
            if old.state != status.state || old.lastError != status.lastError {
                try await emit(VigilAPI.Host.strategyStateChanged, StrategyStateChangedSignal(
                    strategy: path, state: status.state.rawValue, lastError: status.lastError ?? ""))
            }
            if status.state == .stopped {
                setStrategy(status.name, nil)
                try await server.unexport(path)
                await parts.strategyBus.strategyUnexported(status.name)
                try await server.apply(published.withLock { announceStrategies(&$0) })
            }
        } catch {
            log.warning("cannot publish the state of strategy \(status.name) on D-Bus: \(error)", metadata: ["strategy": "\(status.name)"])
        }
    }

    private func addStrategy(_ status: StrategyStatus, on server: DBusObjectServer) async throws {
        let config = await parts.configuredStrategy(status.name)?.values ?? [:]
        // One string for the path, wherever the object is kept.
        let path = VigilAPI.strategyPath(status.name)
        setStrategy(status.name, StrategyEntry(status: status, config: config, path: path))
        try await server.export(path, interfaces: strategyInterfaces)
        await parts.strategyBus.strategyExported(status.name)
    }

    /// Exports the lease's object, then makes `changes` (in the same hop
    /// to the connection's queue when they read without waiting).
    private func addLease(_ lease: LeaseSnapshot, on server: DBusObjectServer, then changes: [DBusObjectServer.Change] = []) async throws {
        let shared = leaseInterfaces
        var interfaces = shared.lease
        var kind: String?
        if lease.strategy == ForeignInhibits.strategyName {
            kind = ForeignInhibits.strategyName
        } else if lease.client != nil {
            kind = ClientLeases.strategyName
            interfaces = shared.clientLease
        } else {
            kind = strategy(named: lease.strategy)?.status.kind
            if kind == nil { kind = await parts.configuredStrategy(lease.strategy)?.kind }
        }
        // One string for the path, wherever the object is kept.
        let path = VigilAPI.leasePath(lease.id)
        setLease(lease.id, LeaseEntry(snapshot: lease, kind: kind ?? "", path: path))
        // Shown once exported: a Begin that looks before must wait.
        defer {
            published.withLock { $0.highestShownLease = max($0.highestShownLease, lease.id.rawValue) }
            resumeShowWaiters(lease.id)
        }
        try await server.apply([.export(path: path, interfaces: interfaces)] + changes)
        await limiter?.track(path, interface: interfaces[0], startsInterval: false)
    }

    /// A client lease's life-cycle event, on the registry as it is published
    /// (``ClientLeaseProjection``): the entry changes, and the object's
    /// export or removal and the signals are queued on the connection in
    /// event order, under the lock. BeginBackgroundTask and End make their
    /// registry change on the connection's loop (brief handlers), so the
    /// object and the signals go ahead of their reply, and no follower wakes
    /// per lease. Nothing while the objects are not exported.
    nonisolated func showClientLeaseEvent(_ event: LeaseEvent) {
        guard event.lease.strategy == ClientLeases.strategyName, event.lease.client != nil else { return }
        if event.kind == .renewed {
            showRenewal(event.lease, on: nil)
            return
        }
        let id = event.lease.id
        let log = self.log
        published.withLock { state in
            guard let server = state.server else { return }
            let path = VigilAPI.leasePath(id)
            let changes: [DBusObjectServer.Change]
            switch event.kind {
            case .acquired:
                guard state.leases[id] == nil else { return }
                state.leases[id] = LeaseEntry(snapshot: event.lease, kind: ClientLeases.strategyName, path: path)
                state.leasePaths = nil
                state.leaseRows = nil
                changes = [
                    .export(path: path, interfaces: leaseInterfaces.clientLease),
                ] + announceLeases(&state) + [
                    Self.hostSignal(VigilAPI.Host.leaseAcquired, LeaseAcquiredSignal(lease: path, strategy: event.lease.strategy, holds: event.lease.holds)),
                ]
            case .expiring:
                guard let index = state.leases.index(forKey: id), state.leases.values[index].snapshot.state == .active else { return }
                state.leases.values[index].snapshot = event.lease
                state.leaseRows = nil
                changes = Self.leaseExpiringChanges(event, path: path)
            case .expired, .released:
                guard state.leases.removeValue(forKey: id) != nil else { return }
                state.leasePaths = nil
                state.leaseRows = nil
                changes = Self.leaseEndChanges(event, path: path) + announceLeases(&state)
            case .renewed, .status, .failed:
                return
            }
            server.applyQueued(changes) { error in
                log.with(lease: id).warning("cannot publish lease \(id) \(event.kind.rawValue) on D-Bus: \(error)")
            }
        }
    }

    /// A lease's budget ran out: its State, the Host's signal, and a client
    /// lease's own Expiring.
    private static func leaseExpiringChanges(_ event: LeaseEvent, path: String) -> [DBusObjectServer.Change] {
        let remaining = remainingMicros(event)
        var changes: [DBusObjectServer.Change] = [
            .propertiesChanged(path: path, interface: VigilAPI.leaseInterface, properties: [VigilAPI.Lease.state.name]),
            Self.hostSignal(VigilAPI.Host.leaseExpiring, LeaseExpiringSignal(lease: path, remainingUsec: remaining)),
        ]
        if event.lease.strategy == ClientLeases.strategyName {
            changes.append(.signal(VigilAPI.ClientLease.expiring, at: path, BusTuple(remaining)))
        }
        return changes
    }

    /// A lease's end on the bus: its last State (gone from the table, so
    /// given as a value), the Host's signal (and a client lease's Expired)
    /// and the object's removal; the Host's `Leases` is announced after
    /// them (``announceLeases(_:)``).
    private static func leaseEndChanges(_ event: LeaseEvent, path: String) -> [DBusObjectServer.Change] {
        var changes: [DBusObjectServer.Change] = [
            .propertiesChangedValues(path: path, interface: VigilAPI.leaseInterface,
                                     values: [(name: VigilAPI.Lease.state.name, value: .string(event.lease.state.rawValue))]),
        ]
        if event.kind == .expired {
            changes.append(Self.hostSignal(VigilAPI.Host.leaseExpired, LeaseExpiredSignal(lease: path, forced: event.forced)))
            if event.lease.strategy == ClientLeases.strategyName {
                changes.append(.signal(VigilAPI.ClientLease.expired, at: path, BusTuple()))
            }
        } else {
            changes.append(Self.hostSignal(VigilAPI.Host.leaseReleased, LeaseReleasedSignal(lease: path, reason: event.detail)))
        }
        changes.append(.unexport(path: path))
        return changes
    }

    /// The Host's list properties announced at a pace (at most one
    /// PropertiesChanged per ``AnnouncementPace/interval``): each
    /// announcement carries the whole list.
    enum PacedList: Sendable {
        case leases, strategies

        var name: String {
            switch self {
            case .leases: VigilAPI.Host.leases.name
            case .strategies: VigilAPI.Host.strategies.name
            }
        }
    }

    /// The change that announces the Host's `Leases` now; none when it was
    /// announced less than ``AnnouncementPace/interval`` ago: then it is
    /// announced once at the end of that interval, with the list of that
    /// moment. Every Begin and End changes the list, and each announcement
    /// carries all of it: announced per change, thousands of leases made
    /// their coming and going quadratic on the bus, and two of the nine
    /// messages of a Begin and End. Under the lock, with the change.
    private nonisolated func announceLeases(_ state: inout Published) -> [DBusObjectServer.Change] {
        announce(.leases, &state)
    }

    /// ``announceLeases(_:)`` for the Host's `Strategies`: 10,000
    /// strategies starting made 10,000 announcements of up to 10,000 paths
    /// each (half a minute of the bus connection's thread, and gigabytes
    /// through dbus-daemon) while the strategies began to work.
    private nonisolated func announceStrategies(_ state: inout Published) -> [DBusObjectServer.Change] {
        announce(.strategies, &state)
    }

    private nonisolated func announce(_ list: PacedList, _ state: inout Published) -> [DBusObjectServer.Change] {
        let clock = parts.clock
        switch state[pace: list].changed(at: clock.now) {
        case .now:
            return [Self.hostPropertiesChanged([list.name])]
        case .at(let due):
            // Unstructured task: not cancelled: it ends at `due` (within the pace's interval),
            // holds the API weakly, and is called under the lock, where nothing may wait.
            Task { [weak self] in
                do { try await clock.sleep(until: due) } catch { return }
                self?.announceDue(list)
            }
            return []
        case .planned:
            return []
        }
    }

    /// The end of the interval in which the list changed after its last
    /// announcement.
    private nonisolated func announceDue(_ list: PacedList) {
        let log = self.log
        published.withLock { state in
            guard state[pace: list].isPlanned, let server = state.server else { return }
            state[pace: list].announced(at: parts.clock.now)
            server.applyQueued([Self.hostPropertiesChanged([list.name])]) { error in
                log.warning("cannot announce the Host's \(list.name) on D-Bus: \(error)")
            }
        }
    }

    /// Shows a lease's renewal once, `lease` as the registry had it after
    /// the renewal: the entry takes it, and its signals are queued on the
    /// connection, under the lock, by whichever comes first of the Renew
    /// call (before its reply) and the following of the registry (`server`
    /// given; nil: the exported one). Nothing when the lease is not shown,
    /// or shows this renewal or a later one.
    @discardableResult
    nonisolated func showRenewal(_ lease: LeaseSnapshot, on server: DBusObjectServer?) -> Bool {
        let id = lease.id
        return published.withLock { state in
            guard let server = server ?? state.server, let index = state.leases.index(forKey: id),
                  lease.renewals > state.leases.values[index].snapshot.renewals else { return false }
            state.leases.values[index].snapshot = lease
            state.leaseRows = nil
            let path = state.leases.values[index].path
            let log = self.log
            server.applyQueued([
                .propertiesChanged(path: path, interface: VigilAPI.leaseInterface, properties: [VigilAPI.Lease.deadline.name, VigilAPI.Lease.renewals.name]),
                Self.hostSignal(VigilAPI.Host.leaseRenewed, LeaseRenewedSignal(lease: path, deadline: HostBusValues.deadlineWallMicros(lease))),
            ]) { error in
                log.with(lease: id).warning("cannot publish lease \(id) renewed on D-Bus: \(error)")
            }
            return true
        }
    }

    /// A unique name left the bus: its inhibits, portal requests and sessions end.
    func inhibitorVanished(_ name: String) async {
        await parts.inhibits.ownerVanished(name)
        await inhibitBridge?.ownerVanished(name)
    }

    /// Returns once the lease's object is exported (or was, and the lease
    /// already ended). Lease ids grow and the registry's events arrive in
    /// order, so a lease with an id up to the last one shown was handled.
    nonisolated func waitUntilShown(_ id: LeaseID) async {
        await withCheckedContinuation { continuation in
            let shown = published.withLock { state in
                if id.rawValue <= state.highestShownLease { return true }
                state.showWaiters[id, default: []].append(continuation)
                return false
            }
            if shown { continuation.resume() }
        }
    }

    private func resumeShowWaiters(_ id: LeaseID) {
        let waiters = published.withLock { $0.showWaiters.removeValue(forKey: id) } ?? []
        for waiter in waiters { waiter.resume() }
    }

    private func emit<Body>(_ signal: Signal<Body>, _ body: Body) async throws {
        try await server?.apply([Self.hostSignal(signal, body)])
    }

    /// A signal of the Host interface on the root object.
    private static func hostSignal<Body>(_ signal: Signal<Body>, _ body: Body) -> DBusObjectServer.Change {
        .signal(signal, at: VigilAPI.rootPath, body)
    }

    /// PropertiesChanged of Host properties on the root object.
    private static func hostPropertiesChanged(_ properties: [String]) -> DBusObjectServer.Change {
        .propertiesChanged(path: VigilAPI.rootPath, interface: VigilAPI.hostInterface, properties: properties)
    }
}

/// Shows client leases on the bus as the registry publishes their events
/// (``HostBusAPI/showClientLeaseEvent(_:)``). Holds the API weakly: the
/// registry keeps its observers.
final class ClientLeaseProjection: LeaseObserver {
    private weak let api: HostBusAPI?

    init(_ api: HostBusAPI) { self.api = api }

    func observe(_ event: LeaseEvent) { api?.showClientLeaseEvent(event) }
    func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {}
}
