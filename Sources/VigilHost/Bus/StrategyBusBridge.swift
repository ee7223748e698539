import VigilDBus
import VigilKit

/// Puts what strategies offer through ``StrategyBus`` on the host's D-Bus
/// connection: extra interfaces (methods) on a strategy's object and child
/// objects below it with read-only, rate-limited properties.
///
/// It exists for the whole run, with or without a bus: registrations made
/// before the bus is attached (or with no bus at all) are kept and exported
/// when ``HostBusAPI`` attaches the object server and exports the strategy
/// object. When a strategy's `run` ends, everything it put on the bus goes.
public actor StrategyBusBridge {
    private let log: Logger
    private var server: DBusObjectServer?
    private var hostUID: UInt32 = 0
    /// The callers' credentials on the attached connection.
    private var credentials: CallerCredentials?
    /// Child objects' PropertiesChanged, at most one per object per second
    /// (the projection's limiter, shared with the lease objects).
    private var limiter: PropertiesChangedLimiter?
    /// Strategy objects HostBusAPI has exported.
    private var exportedStrategies: Set<String> = []
    /// strategy → interface name → declaration.
    private var registrations: [String: [String: DBusInterface]] = [:]
    /// strategy → interfaces currently added to its object.
    private var addedInterfaces: [String: Set<String>] = [:]
    /// path → child object.
    private var children: [String: Child] = [:]
    /// path → the children's property values, read by Properties.Get
    /// without a hop onto this actor. Kept beside `children` entry by entry
    /// (where a child is added, updated or removed), so an update costs one
    /// entry, not a copy of every child's values.
    private nonisolated let shownValues = Lock<[String: [String: BusValue]]>([:])

    struct Child {
        var strategy: String
        var interface: String
        var properties: [BusProperty]
        var values: [String: BusValue]
        var exported = false
    }

    public init(logging: HostLogging) {
        self.log = logging.logger("dbus")
    }

    /// The ``StrategyBus`` a strategy's context carries.
    public nonisolated func bus(for strategy: String) -> any StrategyBus {
        BridgedStrategyBus(bridge: self, strategy: strategy)
    }

    // MARK: hooks for HostBusAPI and the supervisor

    /// The host's object server is ready; export the children known so far.
    func attach(server: DBusObjectServer, hostUID: UInt32, credentials: CallerCredentials, limiter: PropertiesChangedLimiter) async {
        self.server = server
        self.hostUID = hostUID
        self.credentials = credentials
        self.limiter = limiter
        for path in children.keys.sorted() { await exportChild(path) }
    }

    /// The server's connection is gone: forget what was exported on it, so
    /// the next ``attach(server:hostUID:credentials:limiter:)`` exports everything again.
    func detach() {
        server = nil
        credentials = nil
        limiter = nil
        exportedStrategies = []
        addedInterfaces = [:]
        for path in children.keys { children[path]?.exported = false }
    }

    /// HostBusAPI exported the strategy's object: add its registered interfaces.
    func strategyExported(_ strategy: String) async {
        exportedStrategies.insert(strategy)
        await syncInterfaces(strategy)
    }

    /// HostBusAPI removed the strategy's object.
    func strategyUnexported(_ strategy: String) async {
        exportedStrategies.remove(strategy)
        addedInterfaces[strategy] = nil
    }

    /// A run of `strategy` ended: remove its interfaces and child objects.
    public func runEnded(_ strategy: String) async {
        registrations[strategy] = nil
        await syncInterfaces(strategy)
        for (path, child) in children where child.strategy == strategy {
            await removeChild(path)
        }
    }

    // MARK: what strategies call

    func register(strategy: String, interface api: APIInterface, methods: [BusMethod]) async throws {
        let interface = api.name
        // The contract's own interfaces only in the contract's shape (a
        // plugin's copy of an older SDK would declare them otherwise).
        do {
            try VigilAPI.interface(named: interface)?.check(methods)
            try api.check(methods)
        } catch {
            throw BusMethodError.invalidArgs("cannot register \(interface): \(error)")
        }
        let declaration = try Self.declaration(interface, methods: methods, strategy: strategy, bridge: self)
        do { try declaration.validate() } catch { throw BusMethodError.invalidArgs("cannot register \(interface): \(error)") }
        // Replace an earlier registration: take it off the object first.
        if addedInterfaces[strategy]?.contains(interface) == true, let server {
            try? await server.removeInterfaces([interface], at: VigilAPI.strategyPath(strategy))
            addedInterfaces[strategy]?.remove(interface)
        }
        registrations[strategy, default: [:]][interface] = declaration
        await syncInterfaces(strategy)
    }

    func exportObject(strategy: String, relativePath: String, interface: String, properties: [BusProperty],
                      values: [String: BusValue]) async throws -> String {
        let path = VigilAPI.strategyPath(strategy) + "/" + relativePath
        guard DBusObjectPath.isValid(path) else { throw BusMethodError.invalidArgs("\"\(path)\" is not a valid object path") }
        guard children[path] == nil else { throw BusMethodError.invalidArgs("an object is already exported at \(path)") }
        do { try VigilAPI.interface(named: interface)?.check(properties) } catch { throw BusMethodError.invalidArgs("cannot export \(path): \(error)") }
        for (name, value) in values {
            guard let p = properties.first(where: { $0.name == name }) else { throw BusMethodError.invalidArgs("\(interface) has no property \(name)") }
            guard p.signature == value.signature else { throw BusMethodError.invalidArgs("\(interface).\(name) is \(p.signature), got \(value.signature)") }
        }
        children[path] = Child(strategy: strategy, interface: interface, properties: properties, values: values)
        shownValues.withLock { $0[path] = values }
        await exportChild(path)
        return path
    }

    func update(path: String, values: [String: BusValue], immediately: Bool) async {
        guard var child = children[path] else { return }
        var changed: Set<String> = []
        for (name, value) in values {
            guard let property = child.properties.first(where: { $0.name == name && $0.signature == value.signature }) else { continue }
            // A const or unannounced property changes without PropertiesChanged.
            if child.values[name] != value, property.emitsChange == .true || property.emitsChange == .invalidates { changed.insert(name) }
            child.values[name] = value
        }
        children[path] = child
        shownValues.withLock { $0[path] = child.values }
        guard child.exported, !changed.isEmpty, let limiter else { return }
        await limiter.changed(path, properties: changed, immediately: immediately)
    }

    func removeChild(_ path: String) async {
        guard let child = children.removeValue(forKey: path) else { return }
        shownValues.withLock { $0[path] = nil }
        await limiter?.forget(path)
        if child.exported, let server {
            do { try await server.unexport(path) } catch { log.warning("cannot remove \(path) from D-Bus: \(error)") }
        }
    }

    nonisolated func value(path: String, property: String) -> BusValue? { shownValues.withLock { $0[path]?[property] } }

    // MARK: internals

    private func exportChild(_ path: String) async {
        guard let server, let child = children[path], !child.exported else { return }
        let properties = child.properties.map { p in
            DBusProperty(p.name, signature: p.signature, emitsChange: p.emitsChange) { [weak self] in
                guard let self, let value = self.value(path: path, property: p.name) else {
                    throw DBusError.unknownObject("\(path) is gone")
                }
                return value
            }
        }
        do {
            let declaration = DBusInterface(child.interface, properties: properties)
            try await server.export(path, interfaces: [declaration])
            // Only the flag: values updated while the export was awaited
            // stay (writing back `child` would lose them).
            children[path]?.exported = true
            await limiter?.track(path, interface: declaration, startsInterval: true)
        } catch {
            log.warning("cannot export \(path) on D-Bus: \(error)")
        }
    }

    /// Makes the interfaces on a strategy's object match its registrations.
    private func syncInterfaces(_ strategy: String) async {
        guard let server, exportedStrategies.contains(strategy) else { return }
        let path = VigilAPI.strategyPath(strategy)
        let wanted = registrations[strategy] ?? [:]
        let present = addedInterfaces[strategy] ?? []
        let stale = present.subtracting(wanted.keys)
        if !stale.isEmpty {
            try? await server.removeInterfaces(Array(stale), at: path)
        }
        let missing = wanted.keys.filter { !present.contains($0) }.sorted()
        if !missing.isEmpty {
            do {
                try await server.addInterfaces(missing.compactMap { wanted[$0] }, at: path)
            } catch {
                log.warning("cannot add \(missing.joined(separator: ", ")) to \(path): \(error)")
                addedInterfaces[strategy] = present.subtracting(stale)
                return
            }
        }
        addedInterfaces[strategy] = present.subtracting(stale).union(missing)
    }

    /// The uid vigild runs as and the credentials cache, for the handlers.
    private func caller() throws(DBusError) -> (hostUID: UInt32, credentials: CallerCredentials) {
        guard let credentials else { throw DBusError.failed("vigild is not on its bus") }
        return (hostUID, credentials)
    }

    /// The D-Bus declaration of a strategy's interface: each method checks
    /// the caller (mutating ones with the Reload rule), converts the
    /// arguments and maps errors.
    static func declaration(_ interface: String, methods: [BusMethod], strategy: String, bridge: StrategyBusBridge) throws -> DBusInterface {
        DBusInterface(interface, methods: methods.map { method in
            DBusMethod(
                method.name,
                in: method.inArguments,
                out: method.outArguments
            ) { [weak bridge] call in
                guard let bridge else { throw DBusError.failed("vigild's D-Bus API is shutting down") }
                let (hostUID, credentials) = try await bridge.caller()
                let uid = try await credentials.of(call.sender).uid
                if method.mutating {
                    try HostBusAPI.requireMayMutate(callerUID: uid, hostUID: hostUID, method: "\(interface).\(method.name)")
                }
                // Already checked against the method's declared arguments.
                let arguments = call.arguments
                let results: [BusValue]
                do {
                    results = try await method.handler(arguments, BusCaller(sender: call.sender, uid: uid))
                } catch let error as BusMethodError {
                    throw DBusError(name: error.name, message: error.message)
                } catch let error as DBusError {
                    throw error
                } catch {
                    throw DBusError.failed("\(error)")
                }
                return results
            }
        })
    }
}

/// A strategy's view of the bridge.
struct BridgedStrategyBus: StrategyBus {
    let bridge: StrategyBusBridge
    let strategy: String

    var objectPath: String { VigilAPI.strategyPath(strategy) }

    func register(_ interface: APIInterface, methods: [BusMethod]) async throws {
        try await bridge.register(strategy: strategy, interface: interface, methods: methods)
    }

    func exportObject(relativePath: String, interface: String, properties: [BusProperty],
                      values: [String: BusValue]) async throws -> any BusObjectHandle {
        let path = try await bridge.exportObject(strategy: strategy, relativePath: relativePath, interface: interface,
                                                 properties: properties, values: values)
        return BridgedObject(bridge: bridge, path: path)
    }
}

struct BridgedObject: BusObjectHandle {
    let bridge: StrategyBusBridge
    let path: String

    func update(_ values: [String: BusValue], immediately: Bool) async {
        await bridge.update(path: path, values: values, immediately: immediately)
    }

    func remove() async { await bridge.removeChild(path) }
}
