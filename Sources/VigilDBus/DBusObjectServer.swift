import CDBus
import VigilAPI
import VigilKit
import CDBusShim

/// Exports objects (declared `DBusInterface`s at object paths) on a
/// connection and answers calls to them, including the standard
/// Introspectable, Properties and ObjectManager interfaces (libdbus answers
/// Peer itself).
///
/// Create the server and export objects before requesting a bus name, so
/// clients that see the name find the objects. Each method call runs in its
/// own Task; replies and signals are sent from the connection's queue.
///
/// `@unchecked Sendable`: `objects`, `managers` and the held calls (`held`,
/// `heldStart`, `heldBySender`, `waitingForDrain`) are only touched on the
/// connection's queue.
public final class DBusObjectServer: @unchecked Sendable {
    public let connection: DBusConnection
    /// Exported objects: path → interfaces, in declaration order.
    var objects: [String: [DBusInterface]] = [:]
    /// Paths where an ObjectManager lives.
    var managers: Set<String> = []
    /// Where the server says what went wrong that no caller sees whole: a
    /// handler that failed with something other than a `DBusError` or
    /// returned the wrong types (error), a reply that could not be sent
    /// (debug), a call refused as malformed or unknown (debug: a client can
    /// send many). Nothing on the path of a call that succeeds.
    public let logger: Logger

    /// Logs nothing: the default of a library that was not given a logger
    /// (as in AsyncHTTPClient), so a client (vigilctl, a test) that exports
    /// an object writes no lines of its own.
    public static var loggingDisabled: Logger {
        Logger(label: "dbus") { _ in SwiftLogNoOpLogHandler() }
    }

    /// Attaches an object server to `connection` (one per connection).
    public init(connection: DBusConnection, logger: Logger = DBusObjectServer.loggingDisabled) async throws {
        self.connection = connection
        self.logger = logger
        try await connection.onQueueThrowing { [self] connection in
            guard let raw = connection.raw else { throw DBusError.disconnected("the connection is closed") }
            guard !connection.hasObjectServer else {
                throw DBusError.failed("an object server is already attached to this connection")
            }
            // A filter receives every message, and the server decides which
            // paths exist. Not an object-path fallback at "/": libdbus's
            // object tree splits each call's path into a freshly allocated
            // array of its elements before it finds the fallback.
            let userData = Unmanaged.passRetained(WeakServer(self)).toOpaque()
            let added = dbus_connection_add_filter(raw, { _, message, data in
                guard let message, let data,
                      let server = Unmanaged<WeakServer>.fromOpaque(data).takeUnretainedValue().server
                else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
                return server.handle(message)
            }, userData, { data in
                if let data { Unmanaged<WeakServer>.fromOpaque(data).release() }
            })
            guard added != 0 else {
                Unmanaged<WeakServer>.fromOpaque(userData).release()
                throw DBusError(name: DBusError.Name.noMemory, message: "out of memory while attaching the object server")
            }
            connection.hasObjectServer = true
        }
    }

    // MARK: - Exporting

    /// Exports `interfaces` at `path`. Under an ObjectManager this emits
    /// `InterfacesAdded`.
    public func export(_ path: String, interfaces: [DBusInterface]) async throws {
        try await apply([.export(path: path, interfaces: interfaces)])
    }

    /// Removes the object at `path`. Under an ObjectManager this emits
    /// `InterfacesRemoved`.
    public func unexport(_ path: String) async throws {
        try await apply([.unexport(path: path)])
    }

    /// Emits `InterfacesAdded` (with the interfaces' properties) for `path`
    /// from each ObjectManager in `managerPaths`.
    func announceAdded(_ interfaces: [DBusInterface], at path: String, to managerPaths: [String]) async throws {
        guard !managerPaths.isEmpty else { return }
        let added = await Self.interfacesAndProperties(interfaces, at: path)
        for manager in managerPaths {
            try await connection.emitSignal(
                path: manager, interface: DBusStandardInterfaces.objectManager, name: "InterfacesAdded",
                arguments: [.objectPath(path), added])
        }
    }

    /// Emits `InterfacesRemoved` for `path` from each ObjectManager in `managerPaths`.
    func announceRemoved(_ names: [String], at path: String, to managerPaths: [String]) async throws {
        for manager in managerPaths {
            try await connection.emitSignal(
                path: manager, interface: DBusStandardInterfaces.objectManager, name: "InterfacesRemoved",
                arguments: [.objectPath(path), names.busValue])
        }
    }

    /// `a{sa{sv}}` for ObjectManager, when every readable property has an
    /// immediate getter (nil otherwise); a getter that fails is left out.
    static func immediateInterfacesAndProperties(_ interfaces: [DBusInterface], at path: String) -> BusValue? {
        var entries: [BusDictEntry] = []
        entries.reserveCapacity(interfaces.count)
        for interface in interfaces {
            var properties: [BusDictEntry] = []
            properties.reserveCapacity(interface.properties.count)
            for property in interface.properties where property.access.isReadable && property.getter != nil {
                guard let immediate = property.immediateGetter else { return nil }
                guard let value = try? checkedValue(of: property, in: interface.name, at: path, immediate) else { continue }
                properties.append(BusDictEntry(key: .string(property.name), value: .variant(value)))
            }
            entries.append(BusDictEntry(key: .string(interface.name), value: .dict(keySignature: "s", valueSignature: "v", properties)))
        }
        return .dict(keySignature: "s", valueSignature: "a{sv}", entries)
    }

    /// Adds an `org.freedesktop.DBus.ObjectManager` at `path`, managing
    /// every object exported below it.
    public func addObjectManager(at path: String) async throws {
        guard DBusObjectPath.isValid(path) else { throw DBusError.invalidArgs("\"\(path)\" is not a valid object path") }
        await connection.onQueue { [self] _ in _ = managers.insert(path) }
    }

    /// The paths currently exported.
    public var exportedPaths: [String] {
        get async { await connection.onQueue { [self] _ in objects.keys.sorted() } }
    }

    // MARK: - Signals

    /// Emits a declared signal; the object, interface and signal must be
    /// exported and the arguments must match the declared signature.
    public func emit(path: String, interface: String, signal: String, arguments: [BusValue] = []) async throws {
        try await apply([.emit(path: path, interface: interface, signal: signal, arguments: arguments)])
    }

    /// Emits `PropertiesChanged` for `properties` of `interface` at `path`:
    /// new values for `emitsChange: .true`, names for `.invalidates`.
    public func emitPropertiesChanged(path: String, interface: String, properties: [String]) async throws {
        try await apply([.propertiesChanged(path: path, interface: interface, properties: properties)])
    }

    /// Emits `PropertiesChanged` with `values` as given (taken when the
    /// change was decided, e.g. by a rate limiter's flush, rather than read
    /// from the getters when the signal is built). Every property must be
    /// declared with `emitsChange: .true`, and each value must have its
    /// declared signature.
    public func emitPropertiesChanged(path: String, interface: String, values: [(name: String, value: BusValue)]) async throws {
        try await apply([.propertiesChangedValues(path: path, interface: interface, values: values)])
    }

    /// The declarations of `properties`, which must announce changes (on the queue).
    func changingPropertiesOnQueue(path: String, interface: String, properties: [String]) throws(DBusError) -> [DBusProperty] {
        guard let interfaces = objects[path] else { throw DBusError.unknownObject("no object is exported at \(path)") }
        guard let declaration = interfaces.first(where: { $0.name == interface }) else {
            throw DBusError.unknownInterface("the object at \(path) has no interface \(interface)")
        }
        var result: [DBusProperty] = []
        for name in properties {
            guard let property = declaration.property(named: name) else {
                throw DBusError.unknownProperty("\(interface) has no property \(name)")
            }
            guard property.emitsChange == .true || property.emitsChange == .invalidates else {
                throw DBusError.invalidArgs("\(interface).\(name) is declared with EmitsChangedSignal=\(property.emitsChange.rawValue)")
            }
            result.append(property)
        }
        return result
    }

    // MARK: - Dispatch (on the connection's queue)

    /// The most values (arguments, elements, entries, bytes) an incoming
    /// call may carry; more get InvalidArgs before they are decoded into
    /// values (docs/security.md).
    public static let maximumCallValues = 65_536

    private func handle(_ raw: OpaquePointer) -> DBusHandlerResult {
        guard dbus_message_get_type(raw) == CDBUS_MESSAGE_TYPE_METHOD_CALL else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        // Read once: holding and routing both look at the header.
        let header = DBusMarshal.decodeHeader(raw)
        if header.interface == DBusStandardInterfaces.peer { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        let handle = DBusMessageHandle(retaining: raw)
        if heldStart < held.count { answerHeld() }
        if mustHold(header) {
            hold(handle, header: header)
        } else {
            answer(handle, header: header)
        }
        return DBUS_HANDLER_RESULT_HANDLED
    }

    // MARK: - Calls held while replies pile up (on the connection's queue)

    /// Calls held back, oldest first, while the bus has not read what was
    /// sent (``DBusConnection/sendingIsBacklogged()``): a reply built now
    /// would only wait behind the others in the socket, and so would the
    /// replies of brief calls (Begin, End) that could go ahead. One reader
    /// asking again and again for a large reply would otherwise keep every
    /// other caller's reply queued behind its own.
    /// Each with its header, read when it arrived.
    private var held: [(call: DBusMessageHandle, header: DBusMessage)] = []
    private var heldStart = 0
    /// How many calls each sender has in `held`: its later calls wait
    /// behind them, so every sender's calls are answered in order.
    private var heldBySender: [String: Int] = [:]
    private var waitingForDrain = false

    /// How many calls are held (on the queue).
    var heldCallCount: Int { held.count - heldStart }

    /// Whether the call waits in `held`: the sender has calls held already,
    /// or replies pile up and the method is not a brief one (whose
    /// handler's reply is small and which must stay fast under read load).
    private func mustHold(_ header: DBusMessage) -> Bool {
        if !heldBySender.isEmpty, heldBySender[Self.sender(header)] != nil { return true }
        if isBrief(header) { return false }
        return heldStart < held.count || connection.sendingIsBacklogged()
    }

    /// The call's sender, the key of `heldBySender` ("" on a connection
    /// without a bus).
    private static func sender(_ header: DBusMessage) -> String { header.sender ?? "" }

    private func isBrief(_ header: DBusMessage) -> Bool {
        guard let path = header.path, let name = header.member, let interfaces = objects[path] else { return false }
        let interface = header.interface
        let target = interface.flatMap { wanted in interfaces.first { $0.name == wanted } }
            ?? (interface == nil ? interfaces.first { $0.method(named: name) != nil } : nil)
        return target?.method(named: name)?.runsOnConnectionThread == true
    }

    private func hold(_ call: DBusMessageHandle, header: DBusMessage) {
        held.append((call, header))
        heldBySender[Self.sender(header), default: 0] += 1
        waitForDrain()
    }

    private func waitForDrain() {
        guard !waitingForDrain else { return }
        waitingForDrain = true
        connection.whenSendingDrains { [weak self] in
            guard let self else { return }
            waitingForDrain = false
            answerHeld()
        }
    }

    /// Answers held calls, oldest first, until replies pile up again.
    private func answerHeld() {
        while heldStart < held.count {
            guard !connection.sendingIsBacklogged() else { return waitForDrain() }
            let (call, header) = held[heldStart]
            heldStart += 1
            let sender = Self.sender(header)
            if let count = heldBySender[sender], count > 1 { heldBySender[sender] = count - 1 } else { heldBySender[sender] = nil }
            answer(call, header: header)
        }
        held.removeAll(keepingCapacity: held.capacity <= 64)
        heldStart = 0
    }

    private func answer(_ handle: DBusMessageHandle, header: DBusMessage) {
        let raw = handle.raw
        // Route on the header; the body is decoded only once its signature
        // (from the header) is the declared one.
        let route = self.route(header, signature: DBusMarshal.signature(of: raw)) {
            () throws(DBusError) -> [BusValue] in try DBusMarshal.decodeBody(raw, maximumValues: Self.maximumCallValues)
        }
        switch route {
        case let .reply(result):
            if case let .failure(error) = result { refused(header, error) }
            connection.replyOnQueue(to: handle, result: result, logger: logger)
        case let .replyPrepared(body):
            connection.replyOnQueue(to: handle, prepared: body, logger: logger)
        case let .run(work, onConnectionThread):
            let connection = self.connection
            let logger = self.logger
            // Unstructured task: not cancelled: one method call's handler; it ends with the call's
            // reply.
            Task(executorPreference: onConnectionThread ? connection.queue : nil) {
                let result: Result<[BusValue], DBusError>
                do {
                    result = .success(try await work())
                } catch let error as DBusError {
                    result = .failure(error)
                } catch {
                    Self.handlerFailed(header, error, logger: logger)
                    result = .failure(.failed(String(describing: error)))
                }
                // Queued without waiting for it: nothing follows the reply.
                connection.queue.async { connection.replyOnQueue(to: handle, result: result, logger: logger) }
            }
        }
    }

    /// A call answered with an error at once (unknown object, interface or
    /// method, wrong signature, a handler's own `DBusError`): debug, since
    /// a client can send any number of them. The path is the client's and
    /// may be megabytes long: quoted as an excerpt, as errors quote it
    /// (libdbus bounds names to 255 bytes; the log handler escapes it all).
    private func refused(_ call: DBusMessage, _ error: DBusError) {
        logger.debug("refused \(call.interface ?? "(no interface)").\(call.member ?? "") on \(ClientText.excerpt(call.path ?? "/")): \(error.name): \(error.message)",
                     metadata: ["sender": "\(call.sender ?? "")"])
    }

    /// A handler failed with an error that is not a `DBusError`: the caller
    /// gets `Failed` with its description, and the service's log says so.
    static func handlerFailed(_ call: DBusMessage, _ error: any Error, logger: Logger) {
        logger.error("\(call.interface ?? "(no interface)").\(call.member ?? "") on \(call.path ?? "/") failed: \(error)",
                     metadata: ["sender": "\(call.sender ?? "")"])
    }

    private enum Route {
        case reply(Result<[BusValue], DBusError>)
        case replyPrepared(DBusPreparedBody)
        case run(@Sendable () async throws -> [BusValue], onConnectionThread: Bool = false)
    }

    /// Routes a call from its header (`header.body` is empty) and body
    /// `signature`; `decodeBody` is called only after the signature check.
    private func route(_ header: DBusMessage, signature: String, decodeBody: () throws(DBusError) -> [BusValue]) -> Route {
        let message = header
        let path = message.path ?? "/"
        let member = message.member ?? ""
        let interfaces = objects[path]
        let isManager = managers.contains(path)
        // Scanning for children costs a pass over every exported object: do it
        // only for Introspect, or for a path that is not an object itself.
        let nodeExists = interfaces != nil || isManager || path == "/" || !childNames(of: path).isEmpty
        func expect(_ declared: String) -> DBusError? {
            signature == declared ? nil
                : .invalidArgs("\(message.interface ?? "").\(member) expects arguments of signature \"\(declared)\", got \"\(signature)\"")
        }
        /// The whole message, for a call whose signature was checked.
        func decoded() -> Result<DBusMessage, DBusError> {
            var full = message
            do { full.body = try decodeBody() } catch { return .failure(error) }
            return .success(full)
        }

        // Standard interfaces first (an absent interface name matches by member).
        let interface = message.interface
        if interface == DBusStandardInterfaces.introspectable || (interface == nil && member == "Introspect" && nodeExists) {
            guard nodeExists else { return .reply(.failure(.unknownObject("no object at \(ClientText.excerpt(path))"))) }
            guard member == "Introspect" else { return .reply(.failure(.unknownMethod("\(DBusStandardInterfaces.introspectable) has no method \(member)"))) }
            if let error = expect("") { return .reply(.failure(error)) }
            let xml = DBusIntrospection.xml(interfaces: interfaces ?? [], isObject: interfaces != nil,
                                            isObjectManager: isManager, children: childNames(of: path))
            return .reply(.success([.string(xml)]))
        }
        if interface == DBusStandardInterfaces.objectManager {
            guard isManager else {
                return .reply(.failure(nodeExists ? .unknownInterface("no ObjectManager at \(ClientText.excerpt(path))") : .unknownObject("no object at \(ClientText.excerpt(path))")))
            }
            guard member == "GetManagedObjects" else { return .reply(.failure(.unknownMethod("\(DBusStandardInterfaces.objectManager) has no method \(member)"))) }
            if let error = expect("") { return .reply(.failure(error)) }
            let managed = objects.filter { Self.isStrictDescendant($0.key, of: path) }.sorted { $0.key < $1.key }
            return .run {
                var entries: [BusDictEntry] = []
                for (objectPath, objectInterfaces) in managed {
                    entries.append(BusDictEntry(key: .objectPath(objectPath), value: await Self.interfacesAndProperties(objectInterfaces, at: objectPath)))
                }
                return [.dict(keySignature: "o", valueSignature: "a{sa{sv}}", entries)]
            }
        }
        guard let interfaces else {
            return .reply(.failure(.unknownObject("no object at \(ClientText.excerpt(path))")))
        }
        if interface == DBusStandardInterfaces.properties || (interface == nil && ["Get", "GetAll", "Set"].contains(member)
            && !interfaces.contains { $0.method(named: member) != nil }) {
            let expected: String
            switch member {
            case "Get": expected = "ss"
            case "GetAll": expected = "s"
            case "Set": expected = "ssv"
            default: return .reply(.failure(.unknownMethod("\(DBusStandardInterfaces.properties) has no method \(member)")))
            }
            if let error = expect(expected) { return .reply(.failure(error)) }
            switch decoded() {
            case let .success(full):
                return routeProperties(full, member: member, path: path, interfaces: interfaces)
            case let .failure(error):
                return .reply(.failure(error))
            }
        }

        let target: DBusInterface
        if let interface {
            guard let found = interfaces.first(where: { $0.name == interface }) else {
                return .reply(.failure(.unknownInterface("the object at \(ClientText.excerpt(path)) has no interface \(interface)")))
            }
            target = found
        } else {
            guard let found = interfaces.first(where: { $0.method(named: member) != nil }) else {
                return .reply(.failure(.unknownMethod("the object at \(ClientText.excerpt(path)) has no method \(member)")))
            }
            target = found
        }
        guard let method = target.method(named: member) else {
            return .reply(.failure(.unknownMethod("\(target.name) has no method \(member)")))
        }
        guard signature == method.inSignature else {
            return .reply(.failure(.invalidArgs(
                "\(target.name).\(member) expects arguments of signature \"\(method.inSignature)\", got \"\(signature)\"")))
        }
        let full: DBusMessage
        switch decoded() {
        case let .success(message): full = message
        case let .failure(error): return .reply(.failure(error))
        }
        let typedCall = DBusMethodCall(message: full, connection: connection, path: path, interface: target.name, member: member)
        let handler = method.handler
        let outSignature = method.outSignature
        let qualified = "\(target.name).\(member)"
        let logger = self.logger
        if let prepared = method.preparedHandler {
            do {
                let body = try prepared(typedCall)
                guard body.signature == outSignature else {
                    return .reply(.failure(.failed("\(qualified) returned signature \"\(body.signature)\" but is declared to return \"\(outSignature)\"")))
                }
                return .replyPrepared(body)
            } catch let error as DBusError {
                return .reply(.failure(error))
            } catch {
                Self.handlerFailed(message, error, logger: logger)
                return .reply(.failure(.failed(String(describing: error))))
            }
        }
        if let immediate = method.immediateHandler {
            return .reply(Result { () throws(DBusError) -> [BusValue] in
                let values: [BusValue]
                do { values = try immediate(typedCall) } catch let error as DBusError { throw error } catch {
                    Self.handlerFailed(message, error, logger: logger)
                    throw .failed(String(describing: error))
                }
                guard values.map(\.signature).joined() == outSignature else {
                    throw .failed("\(qualified) returned signature \"\(values.map(\.signature).joined())\" but is declared to return \"\(outSignature)\"")
                }
                return values
            })
        }
        return .run({
            let values = try await handler(typedCall)
            let actual = values.map(\.signature).joined()
            // A handler that returns the wrong types is a bug in the service:
            // the caller gets Failed, the service keeps running and says so.
            guard actual == outSignature else {
                let error = DBusError.failed("\(qualified) returned signature \"\(actual)\" but is declared to return \"\(outSignature)\"")
                logger.error("\(error.message)")
                throw error
            }
            return values
        }, onConnectionThread: method.runsOnConnectionThread)
    }

    /// Properties.Get, GetAll and Set; `message` is whole, its signature checked.
    private func routeProperties(_ message: DBusMessage, member: String, path: String, interfaces: [DBusInterface]) -> Route {
        func find(_ interfaceName: String) -> Result<DBusInterface, DBusError> {
            // The D-Bus specification lets the interface name be empty: then
            // every interface of the object is searched, the first one
            // declared winning when two have a property of the same name.
            if interfaceName.isEmpty {
                var seen = Set<String>()
                let merged = interfaces.flatMap(\.properties).filter { seen.insert($0.name).inserted }
                return .success(DBusInterface("", properties: merged))
            }
            if let found = interfaces.first(where: { $0.name == interfaceName }) { return .success(found) }
            if DBusStandardInterfaces.names.contains(interfaceName) { return .success(DBusInterface(interfaceName)) }
            return .failure(.unknownInterface("the object at \(ClientText.excerpt(path)) has no interface \(ClientText.excerpt(interfaceName))"))
        }
        func findProperty(_ interfaceName: String, _ name: String) -> Result<DBusProperty, DBusError> {
            find(interfaceName).flatMap { interface in
                guard let property = interface.property(named: name) else {
                    return .failure(.unknownProperty("\(ClientText.excerpt(interfaceName)) has no property \(ClientText.excerpt(name))"))
                }
                return .success(property)
            }
        }
        switch member {
        case "Get":
            guard case let .string(interfaceName) = message.body[0], case let .string(name) = message.body[1] else {
                return .reply(.failure(.invalidArgs("Get expects (interface_name, property_name)")))
            }
            let property: DBusProperty
            switch findProperty(interfaceName, name) {
            case let .success(found): property = found
            case let .failure(error): return .reply(.failure(error))
            }
            guard property.access.isReadable, let getter = property.getter else {
                return .reply(.failure(.accessDenied("\(interfaceName).\(name) is write-only")))
            }
            if let immediate = property.immediateGetter {
                return .reply(Result { () throws(DBusError) -> [BusValue] in
                    [.variant(try Self.checkedValue(of: property, in: interfaceName, at: path, immediate))]
                })
            }
            return .run {
                let value = try await Self.checkedValue(of: property, in: interfaceName, at: path, getter)
                return [.variant(value)]
            }
        case "GetAll":
            guard case let .string(interfaceName) = message.body[0] else {
                return .reply(.failure(.invalidArgs("GetAll expects (interface_name)")))
            }
            let interface: DBusInterface
            switch find(interfaceName) {
            case let .success(found): interface = found
            case let .failure(error): return .reply(.failure(error))
            }
            let readable = interface.properties.filter { $0.access.isReadable && $0.getter != nil }
            if readable.allSatisfy({ $0.immediateGetter != nil }) {
                return .reply(Result { () throws(DBusError) -> [BusValue] in
                    var entries: [BusDictEntry] = []
                    for property in readable {
                        guard let immediate = property.immediateGetter else { continue }
                        let value = try Self.checkedValue(of: property, in: interfaceName, at: path, immediate)
                        entries.append(BusDictEntry(key: .string(property.name), value: .variant(value)))
                    }
                    return [.dict(keySignature: "s", valueSignature: "v", entries)]
                })
            }
            return .run {
                var entries: [BusDictEntry] = []
                for property in interface.properties where property.access.isReadable {
                    guard let getter = property.getter else { continue }
                    let value = try await Self.checkedValue(of: property, in: interfaceName, at: path, getter)
                    entries.append(BusDictEntry(key: .string(property.name), value: .variant(value)))
                }
                return [.dict(keySignature: "s", valueSignature: "v", entries)]
            }
        case "Set":
            guard case let .string(interfaceName) = message.body[0], case let .string(name) = message.body[1],
                  case let .variant(value) = message.body[2] else {
                return .reply(.failure(.invalidArgs("Set expects (interface_name, property_name, value)")))
            }
            let property: DBusProperty
            switch findProperty(interfaceName, name) {
            case let .success(found): property = found
            case let .failure(error): return .reply(.failure(error))
            }
            guard property.access.isWritable, let setter = property.setter else {
                return .reply(.failure(.propertyReadOnly("\(interfaceName).\(name) is read-only")))
            }
            guard value.signature == property.signature else {
                return .reply(.failure(.invalidArgs(
                    "\(interfaceName).\(name) has signature \"\(property.signature)\", got a value of signature \"\(value.signature)\"")))
            }
            let setCall = DBusMethodCall(message: message, connection: connection, path: path, interface: interfaceName, member: name)
            return .run { [self] in
                try await setter(value, setCall)
                if property.emitsChange == .true || property.emitsChange == .invalidates {
                    try? await emitPropertiesChanged(path: path, interface: interfaceName, properties: [name])
                }
                return []
            }
        default:
            return .reply(.failure(.unknownMethod("\(DBusStandardInterfaces.properties) has no method \(member)")))
        }
    }

    /// Runs an immediate getter and checks its value against the declared signature.
    private static func checkedValue(of property: DBusProperty, in interface: String, at path: String,
                                     _ getter: DBusProperty.ImmediateObjectGetter) throws(DBusError) -> BusValue {
        let value: BusValue
        do { value = try getter(path) } catch let error as DBusError { throw error } catch { throw .failed(String(describing: error)) }
        guard value.signature == property.signature else {
            throw DBusError.failed("\(interface).\(property.name) returned signature \"\(value.signature)\" but is declared \"\(property.signature)\"")
        }
        return value
    }

    /// Runs a getter and checks its value against the declared signature.
    private static func checkedValue(of property: DBusProperty, in interface: String, at path: String,
                                     _ getter: DBusProperty.ObjectGetter) async throws -> BusValue {
        let value = try await getter(path)
        guard value.signature == property.signature else {
            throw DBusError.failed("\(interface).\(property.name) returned signature \"\(value.signature)\" but is declared \"\(property.signature)\"")
        }
        return value
    }

    /// `a{sa{sv}}` for ObjectManager: each interface with its readable
    /// properties (a property whose getter fails is left out).
    static func interfacesAndProperties(_ interfaces: [DBusInterface], at path: String) async -> BusValue {
        var entries: [BusDictEntry] = []
        entries.reserveCapacity(interfaces.count)
        for interface in interfaces {
            var properties: [BusDictEntry] = []
            properties.reserveCapacity(interface.properties.count)
            for property in interface.properties where property.access.isReadable {
                guard let getter = property.getter,
                      let value = try? await checkedValue(of: property, in: interface.name, at: path, getter) else { continue }
                properties.append(BusDictEntry(key: .string(property.name), value: .variant(value)))
            }
            entries.append(BusDictEntry(key: .string(interface.name), value: .dict(keySignature: "s", valueSignature: "v", properties)))
        }
        return .dict(keySignature: "s", valueSignature: "a{sv}", entries)
    }

    /// Names of the direct children of `path` among exported objects and managers.
    private func childNames(of path: String) -> [String] {
        let prefix = path == "/" ? "/" : path + "/"
        var names = Set<String>()
        for candidate in objects.keys.map({ $0 }) + managers where candidate.hasPrefix(prefix) && candidate != path {
            if let first = candidate.dropFirst(prefix.count).split(separator: "/").first {
                names.insert(String(first))
            }
        }
        return names.sorted()
    }

    static func isStrictDescendant(_ path: String, of ancestor: String) -> Bool {
        path != ancestor && (ancestor == "/" || path.hasPrefix(ancestor + "/"))
    }
}

/// Weak user data for the libdbus object-path registration.
private final class WeakServer {
    weak var server: DBusObjectServer?
    init(_ server: DBusObjectServer) { self.server = server }
}

extension DBusConnection {
    /// Sends a method return or error for `call` (on the queue). A reply
    /// that cannot be built (invalid values) becomes a Failed error.
    func replyOnQueue(to call: DBusMessageHandle, result: Result<[BusValue], DBusError>, logger: Logger) {
        guard dbus_message_get_no_reply(call.raw) == 0 else { return }
        let reply: DBusMessageHandle?
        switch result {
        case let .success(values):
            do {
                guard let raw = dbus_message_new_method_return(call.raw) else { return }
                let handle = DBusMessageHandle(owning: raw)
                try DBusMarshal.append(values, to: raw)
                reply = handle
            } catch where error.name == DBusError.Name.limitsExceeded {
                logger.warning("a reply to \(Self.describe(call)) exceeds D-Bus limits; the caller gets an error: \(error.message)")
                reply = Self.makeError(for: call, error)
            } catch {
                logger.error("the reply to \(Self.describe(call)) could not be built: \(error.message)")
                reply = Self.makeError(for: call, .failed("the reply could not be built: \(error.message)"))
            }
        case let .failure(error):
            reply = Self.makeError(for: call, error)
        }
        guard let reply else { return }
        // A reply with fds that the caller's connection cannot receive is
        // refused by the bus: the caller then gets this error instead.
        let ifRefused = dbus_message_contains_unix_fds(reply.raw) == 0 ? nil : Self.makeError(for: call, .notSupported(Self.callerCannotReceiveFDs))
        do {
            try sendOnQueue(reply, ifRefused: ifRefused)
        } catch {
            // e.g. fds on a connection that cannot pass them: tell the caller.
            logger.debug("cannot send the reply to \(Self.describe(call)): \(error.message)")
            if let fallback = Self.makeError(for: call, error) { try? sendOnQueue(fallback) }
        }
    }

    /// Sends `body` as the reply to `call` (on the queue).
    func replyOnQueue(to call: DBusMessageHandle, prepared body: DBusPreparedBody, logger: Logger) {
        guard dbus_message_get_no_reply(call.raw) == 0 else { return }
        guard let reply = body.reply(to: call) else {
            replyOnQueue(to: call, result: .failure(.failed("the reply could not be built")), logger: logger)
            return
        }
        do {
            try sendOnQueue(reply)
        } catch {
            logger.debug("cannot send the reply to \(Self.describe(call)): \(error.message)")
            if let fallback = Self.makeError(for: call, error) { try? sendOnQueue(fallback) }
        }
    }

    /// `interface.member from sender`, for the log (escaped by the handler).
    static func describe(_ call: DBusMessageHandle) -> String {
        let interface = dbus_message_get_interface(call.raw).map { String(cString: $0) } ?? "(no interface)"
        let member = dbus_message_get_member(call.raw).map { String(cString: $0) } ?? ""
        let sender = dbus_message_get_sender(call.raw).map { String(cString: $0) } ?? "(no sender)"
        return "\(interface).\(member) from \(sender)"
    }

    static let callerCannotReceiveFDs = "the reply carries a unix fd, and the bus cannot pass fds to this caller's connection: negotiate fd passing (NEGOTIATE_UNIX_FD) on a unix socket"

    static func makeError(for call: DBusMessageHandle, _ error: DBusError) -> DBusMessageHandle? {
        let name = DBusSignatureSyntax.isValidErrorName(error.name) ? error.name : DBusError.Name.failed
        let text = DBusSignatureSyntax.isValidString(error.message) ? error.message : "(error message was not valid UTF-8)"
        guard let raw = name.withCString({ name in text.withCString { dbus_message_new_error(call.raw, name, $0) } }) else { return nil }
        return DBusMessageHandle(owning: raw)
    }
}
