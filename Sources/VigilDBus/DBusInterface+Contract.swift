import VigilAPI

// Serving a typed declaration (VigilAPI's ``Method`` and ``Signal``): the
// handler's parameters are the method's argument types and its result the
// reply type, so a handler of other types does not compile. The name and
// the argument list come from the declaration, never from a string here.

extension DBusMethod {
    /// `method`, answered by `handler` in a task of its own (it may wait).
    public init<each In, Out>(_ method: Method<repeat each In, Out>,
                              _ handler: @escaping @Sendable (DBusMethodCall, repeat each In) async throws -> Out) {
        self.init(method.name, in: method.declaration.inArguments, out: method.declaration.outArguments) { call in
            let arguments = try Self.decode(method, call)
            return try await handler(call, repeat each arguments).arguments
        }
    }

    /// `method` in a task on the connection's loop (see
    /// ``brief(_:in:out:_:)``): the handler waits only for actors.
    public static func brief<each In, Out>(_ method: Method<repeat each In, Out>,
                                           _ handler: @escaping @Sendable (DBusMethodCall, repeat each In) async throws -> Out) -> DBusMethod {
        var bound = DBusMethod(method, handler)
        bound.runsOnConnectionThread = true
        return bound
    }

    /// `method` answered at once on the connection's queue (see
    /// ``immediateHandler``): the handler must not wait.
    public static func immediate<each In, Out>(_ method: Method<repeat each In, Out>,
                                               _ handler: @escaping @Sendable (DBusMethodCall, repeat each In) throws -> Out) -> DBusMethod {
        .immediate(method.name, in: method.declaration.inArguments, out: method.declaration.outArguments) { call in
            let arguments = try Self.decode(method, call)
            return try handler(call, repeat each arguments).arguments
        }
    }

    /// `method` answered at once with a reply marshalled beforehand
    /// (``DBusPreparedReply``, made from the declared reply type).
    public static func prepared<each In, Out>(_ method: Method<repeat each In, Out>,
                                              _ handler: @escaping @Sendable (DBusMethodCall, repeat each In) throws -> DBusPreparedReply<Out>) -> DBusMethod {
        .prepared(method.name, in: method.declaration.inArguments, out: method.declaration.outArguments) { call in
            let arguments = try Self.decode(method, call)
            return try handler(call, repeat each arguments).body
        }
    }

    /// The call's arguments as `method` declares them; `InvalidArgs` otherwise.
    private static func decode<each In, Out>(_ method: Method<repeat each In, Out>, _ call: DBusMethodCall) throws(DBusError) -> (repeat each In) {
        do { return try method.decode(call.arguments) } catch { throw DBusError(error) }
    }
}

/// A reply of type `Out` marshalled once (``DBusPreparedBody``), for a
/// method bound with `DBusMethod.prepared(method) { ... }`.
public struct DBusPreparedReply<Out: BusBody>: Sendable {
    let body: DBusPreparedBody
    public init(_ reply: Out) throws(DBusError) {
        body = try DBusPreparedBody(reply.arguments)
    }
}

extension DBusProperty {
    /// `property`, read at once on the connection's queue (a constant or a
    /// value behind a lock); the getter is given the object's path.
    public static func immediate<T>(_ property: Property<T>, _ get: @escaping @Sendable (_ path: String) throws -> T) -> DBusProperty {
        DBusProperty(property.name, signature: property.declaration.signature, emitsChange: property.declaration.emitsChange,
                     immediateAt: { path in try get(path).busValue })
    }

    /// `property`, read at once from a value encoded beforehand (a cache
    /// kept per change).
    public static func immediate<T>(_ property: Property<T>, encoded get: @escaping @Sendable (_ path: String) throws -> BusEncoded<T>) -> DBusProperty {
        DBusProperty(property.name, signature: property.declaration.signature, emitsChange: property.declaration.emitsChange,
                     immediateAt: { path in try get(path).busValue })
    }

    /// `property`, read in a task of its own (the getter may wait).
    public static func task<T>(_ property: Property<T>, _ get: @escaping @Sendable () async throws -> T) -> DBusProperty {
        DBusProperty(property.name, signature: property.declaration.signature, access: .read,
                     emitsChange: property.declaration.emitsChange, get: { try await get().busValue })
    }

    /// A property declared by its entry alone (a row's field), read at once.
    public init(_ declaration: APIProperty, immediateAt get: @escaping ImmediateObjectGetter) {
        self.init(declaration.name, signature: declaration.signature, emitsChange: declaration.emitsChange, immediateAt: get)
    }
}

extension DBusConnection {
    /// Reads `property` of the object at `path` of `destination`, decoded
    /// as declared.
    public func get<T>(_ property: Property<T>, destination: String, path: String, timeout: Duration) async throws -> T {
        let reply = try await call(destination: destination, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
                                   arguments: [.string(property.interface), .string(property.name)], timeout: timeout)
        do throws(BusValueMismatch) {
            guard reply.body.count == 1, case .variant(let value) = reply.body[0] else {
                throw APIDecodingError("expected one variant, got \"\(reply.body.map(\.signature).joined())\"")
            }
            return try T(busValue: value)
        } catch {
            throw APIDecodingError("\(property.interface).\(property.name) is not what the contract declares: \(error.description)")
        }
    }
}

extension DBusObjectServer.Change {
    /// `signal` with `body` from the object at `path`.
    public static func signal<Body>(_ signal: Signal<Body>, at path: String, _ body: Body) -> Self {
        .emit(path: path, interface: signal.interface, signal: signal.name, arguments: body.arguments)
    }
}

extension DBusObjectServer {
    /// Emits `signal` with `body` from the object at `path`.
    public func emit<Body>(_ signal: Signal<Body>, at path: String, _ body: Body) async throws {
        try await apply([.signal(signal, at: path, body)])
    }
}

extension DBusConnection {
    /// Calls `method` on the object at `path` of `destination` with typed
    /// arguments; the reply decoded as declared. A reply of another shape
    /// throws ``APIDecodingError`` naming the method.
    public func call<each In, Out>(_ method: Method<repeat each In, Out>, destination: String, path: String,
                                   _ arguments: repeat each In, timeout: Duration) async throws -> Out {
        let reply = try await call(destination: destination, path: path, interface: method.interface, member: method.name,
                                   arguments: method.encode(repeat each arguments), timeout: timeout)
        do {
            return try Out(arguments: reply.body)
        } catch {
            throw APIDecodingError("the reply to \(method.interface).\(method.name) is not what the contract declares: \(error.description)")
        }
    }
}
