import VigilDBus
import VigilKit

/// vigild's handlers for the `org.vigil.Vigil1` interfaces the contract
/// declares (``VigilAPI``: Host, Strategy, Lease, ClientLease). Each
/// interface is built with ``DBusInterface/init(api:methods:properties:)``,
/// which stops vigild if a declared member has no handler or a handler has
/// no declaration.
///
/// Handlers hold the API weakly: the server keeps the declarations, and the
/// API keeps the server. Built with a nil API, every handler fails.
enum HostBusInterfaces {
    private static func gone() -> DBusError { .failed("vigild's D-Bus API is shutting down") }

    // MARK: Host

    static func host(_ api: HostBusAPI?) -> DBusInterface {
        let parts = api?.parts
        // A value of the host read without waiting: answered on the connection's queue.
        func now<T>(_ property: Property<T>, _ value: @escaping @Sendable (HostBusParts) -> T) -> DBusProperty {
            .immediate(property) { _ in
                guard let parts else { throw gone() }
                return value(parts)
            }
        }
        // A value that needs a wait (the store, the health actor).
        func awaiting<T>(_ property: Property<T>, _ value: @escaping @Sendable (HostBusParts) async -> T) -> DBusProperty {
            .task(property) {
                guard let parts else { throw gone() }
                return await value(parts)
            }
        }
        typealias Host = VigilAPI.Host
        return DBusInterface(
            api: VigilAPI.host,
            methods: [
                .prepared(Host.listLeases) { [weak api] _ in
                    guard let api else { throw gone() }
                    return try api.leaseRows()
                },
                .immediate(Host.listStrategies) { [weak api] _ in
                    guard let api else { throw gone() }
                    return BusTuple(api.strategyRows())
                },
                DBusMethod(Host.survival) { [weak api] _, since in
                    guard let api else { throw gone() }
                    return BusTuple(try api.survivalRows(since: since))
                },
                .brief(Host.beginBackgroundTask) { [weak api] call, name, reason, budget in
                    guard let api else { throw gone() }
                    return try await api.beginBackgroundTask(call, name: name, reason: reason, budget: budget)
                },
                DBusMethod(Host.reload) { [weak api] call in
                    guard let api else { throw gone() }
                    _ = try await api.requireMayMutate(call, Host.reload)
                    let result = await api.parts.reload()
                    var reply = ReloadReply()
                    reply.applied = result.applied
                    reply.messages = result.messages
                    return reply
                },
                DBusMethod(Host.appPolicy) { [weak api] _ in
                    guard let api else { throw gone() }
                    return await api.appPolicy()
                },
                DBusMethod(Host.denyApp) { [weak api] call, pattern, forMicros in
                    guard let api else { throw gone() }
                    return try await api.denyApp(call, pattern, forMicros: forMicros)
                },
                DBusMethod(Host.allowApp) { [weak api] call, pattern in
                    guard let api else { throw gone() }
                    return try await api.allowApp(call, pattern)
                },
                DBusMethod(Host.releaseLease) { [weak api] call, lease in
                    guard let api else { throw gone() }
                    try await api.releaseLease(call, lease)
                    return BusTuple()
                },
            ],
            properties: [
                now(Host.version) { $0.version },
                now(Host.runId) { $0.runId },
                now(Host.startedAt) { UInt64(clamping: $0.startedWallMicros) },
                now(Host.survivalSeconds) { parts in
                    UInt64(clamping: max(0, (parts.clock.now - parts.startedAt).components.seconds))
                },
                now(Host.powerBackend) { $0.registry.backend.name },
                now(Host.powerBackendReason) { $0.registry.backend.reason },
                now(Host.wakeClock) { $0.scheduler.clockInfo.clock },
                now(Host.wakeClockReason) { $0.scheduler.clockInfo.reason },
                now(Host.canWakeSystem) { $0.scheduler.clockInfo.canWakeSystem },
                now(Host.configPath) { $0.configPath },
                awaiting(Host.storeWritable) { await $0.store.unwritableState == nil },
                awaiting(Host.droppedLogLines) { UInt64(clamping: await $0.health().droppedLogLines) },
                .immediate(Host.strategies, encoded: { [weak api] _ in
                    guard let api else { throw gone() }
                    return api.strategyPaths()
                }),
                .immediate(Host.leases, encoded: { [weak api] _ in
                    guard let api else { throw gone() }
                    return api.leasePaths()
                }),
            ]
        )
    }

    // MARK: Strategy

    /// `org.vigil.Vigil1.Strategy`, one value for every strategy object
    /// (as ``lease(_:)``): each getter reads the strategy whose object path
    /// it is given. One interface per strategy, each getter a closure of
    /// its own, was most of a strategy object's memory (10,000 voip-socket
    /// strategies).
    static func strategy(_ api: HostBusAPI?) -> DBusInterface {
        func read<T>(_ property: Property<T>, _ value: @escaping @Sendable (borrowing HostBusAPI.StrategyEntry) -> T) -> DBusProperty {
            .immediate(property) { [weak api] path in try readStrategy(api, path, value) }
        }
        // The cost counters, read when asked (no change signal): one
        // getter per field of the contract's row, declared by its fields,
        // each encoding its own field (not the whole row's properties
        // once per field: a strategy's InterfacesAdded reads them all).
        let costs = VigilAPI.strategy.properties.compactMap { declared -> DBusProperty? in
            guard let field = StrategyCostRow.fields.first(where: { $0.name == declared.name }) else { return nil }
            return DBusProperty(declared) { [weak api] path in
                let name = try readStrategy(api, path) { $0.status.name }
                guard let api else { throw gone() }
                return field.value(of: api.parts.costs.cost(of: name))
            }
        }
        typealias Strategy = VigilAPI.Strategy
        return DBusInterface(
            api: VigilAPI.strategy,
            properties: [
                read(Strategy.name) { $0.status.name },
                read(Strategy.kind) { $0.status.kind },
                read(Strategy.state) { $0.status.state.rawValue },
                read(Strategy.restarts) { UInt32(clamping: $0.status.restarts) },
                read(Strategy.lastError) { $0.status.lastError ?? "" },
                read(Strategy.lastErrorAt) { UInt64(clamping: $0.status.lastErrorWallMicros ?? 0) },
                read(Strategy.waitingFor) { $0.status.waitingFor },
                .immediate(Strategy.config, encoded: { [weak api] path in HostBusValues.configTable(try readStrategy(api, path) { $0.config }) }),
            ] + costs
        )
    }

    /// `value` read from the entry of the strategy whose object is at
    /// `path`, where it lies (``HostBusAPI/readStrategy(_:_:)``): not a
    /// copy of the whole entry per property.
    private static func readStrategy<T>(_ api: HostBusAPI?, _ path: String, _ value: (borrowing HostBusAPI.StrategyEntry) -> T) throws(DBusError) -> T {
        guard let api else { throw gone() }
        guard let name = VigilAPI.strategyName(path: path), let read = api.readStrategy(name, value) else {
            throw DBusError.unknownObject("the strategy at \(ClientText.excerpt(path)) is no longer configured")
        }
        return read
    }

    // MARK: Lease

    /// `org.vigil.Vigil1.Lease`, one value for every lease object: each
    /// getter reads the lease whose object path it is given, so exporting a
    /// lease makes no getters of its own (thousands of leases come and go).
    static func lease(_ api: HostBusAPI?) -> DBusInterface {
        func read<T>(_ property: Property<T>, _ value: @escaping @Sendable (borrowing HostBusAPI.LeaseEntry) -> T) -> DBusProperty {
            .immediate(property) { [weak api] path in try readEntry(api, path, value) }
        }
        typealias Lease = VigilAPI.Lease
        return DBusInterface(
            api: VigilAPI.lease,
            properties: [
                read(Lease.id) { $0.snapshot.id.rawValue },
                read(Lease.strategy) { $0.snapshot.strategy },
                read(Lease.kind) { $0.kind },
                read(Lease.holds) { $0.snapshot.holds },
                read(Lease.reason) { $0.snapshot.reason },
                read(Lease.acquiredAt) { UInt64(clamping: $0.snapshot.acquiredWallMicros) },
                read(Lease.deadline) { HostBusValues.deadlineWallMicros($0.snapshot) },
                read(Lease.renewals) { UInt32(clamping: $0.snapshot.renewals) },
                read(Lease.state) { $0.snapshot.state.rawValue },
                .immediate(Lease.status, encoded: { [weak api] path in try readEntry(api, path) { HostBusValues.status($0.snapshot.status) } }),
            ]
        )
    }

    /// `value` read from the entry of the lease whose object is at `path`.
    private static func readEntry<T>(_ api: HostBusAPI?, _ path: String, _ value: (borrowing HostBusAPI.LeaseEntry) -> T) throws(DBusError) -> T {
        guard let api else { throw gone() }
        guard let id = VigilAPI.leaseID(path: path), let read = api.readLease(id, value) else {
            throw DBusError.unknownObject("the lease at \(ClientText.excerpt(path)) has ended")
        }
        return read
    }

    /// The id of the lease whose object the call is on.
    private static func leaseID(_ call: DBusMethodCall) throws(DBusError) -> LeaseID {
        guard let id = VigilAPI.leaseID(path: call.path) else {
            throw DBusError.unknownObject("no lease object at \(ClientText.excerpt(call.path))")
        }
        return id
    }

    // MARK: ClientLease

    /// `org.vigil.Vigil1.ClientLease` on a client lease's object: End,
    /// Renew, the owner's identity, and the Expiring/Expired signals. One
    /// value for every client lease object, like ``lease(_:)``.
    static func clientLease(_ api: HostBusAPI?) -> DBusInterface {
        func read<T>(_ property: Property<T>, _ value: @escaping @Sendable (ClientIdentity) -> T) -> DBusProperty {
            .immediate(property) { [weak api] path in
                guard let client = try readEntry(api, path, { $0.snapshot.client }) else {
                    throw DBusError.unknownObject("the lease at \(ClientText.excerpt(path)) was not begun by a D-Bus client")
                }
                return value(client)
            }
        }
        return DBusInterface(
            api: VigilAPI.clientLease,
            methods: [
                .brief(VigilAPI.ClientLease.end) { [weak api] call in
                    guard let api else { throw gone() }
                    try await api.endClientLease(try leaseID(call), call)
                    return BusTuple()
                },
                .brief(VigilAPI.ClientLease.renew) { [weak api] call, budget in
                    guard let api else { throw gone() }
                    try await api.renewClientLease(try leaseID(call), call, budgetMicros: budget)
                    return BusTuple()
                },
            ],
            properties: [
                read(VigilAPI.ClientLease.owner) { $0.owner },
                read(VigilAPI.ClientLease.uid) { $0.uid },
                read(VigilAPI.ClientLease.pid) { $0.pid },
                read(VigilAPI.ClientLease.name) { $0.name },
            ]
        )
    }

    // MARK: introspection

    /// The introspection XML of the whole API, generated from the contract:
    /// the root object's standard interfaces followed by every interface
    /// vigild can export, with a comment saying where each lives. This is
    /// `docs/org.vigil.Vigil1.xml` (`vigild --print-introspection`).
    static func introspectionXML() -> String {
        document(VigilAPI.interfaces.map(DBusInterface.init(declaration:)), isObjectManager: true, comment: """
            The \(VigilAPI.busName) D-Bus API of vigild (see docs/dbus-api.md).
                 Generated from its declaration (VigilKit's APIContract.swift) by
                 vigild's print-introspection option; do not edit. Where each interface lives:

            """ + VigilAPI.interfaces.map { "     \($0.name): \($0.objects)\n" }.joined())
    }

    /// An introspection document of `interfaces` (with the standard ones)
    /// with `comment` between the DOCTYPE and the node: the form
    /// gdbus-codegen takes.
    static func document(_ interfaces: [DBusInterface], isObjectManager: Bool, comment: String) -> String {
        let xml = DBusIntrospection.xml(interfaces: interfaces, isObject: true, isObjectManager: isObjectManager, children: [])
        // After the DOCTYPE (its two lines), before the node.
        guard let node = xml.range(of: "<node>") else { return xml }
        return String(xml[..<node.lowerBound]) + "<!-- " + comment + "-->\n" + String(xml[node.lowerBound...])
    }
}
