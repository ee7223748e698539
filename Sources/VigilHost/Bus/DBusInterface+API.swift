import VigilDBus
import VigilKit

/// How vigild answers a method the contract declares.
struct APIMethodHandler: Sendable {
    fileprivate let make: @Sendable (_ name: String, _ in: [DBusArgument], _ out: [DBusArgument]) -> DBusMethod

    /// In a task of its own: the handler may wait.
    static func task(_ handler: @escaping DBusMethod.Handler) -> Self {
        Self { DBusMethod($0, in: $1, out: $2, handler: handler) }
    }

    /// In a task on the connection's thread (``DBusMethod/brief(_:in:out:_:)``):
    /// the handler waits only for actors and does little work itself.
    static func brief(_ handler: @escaping DBusMethod.Handler) -> Self {
        Self { .brief($0, in: $1, out: $2, handler) }
    }

    /// On the connection's queue, at once: the handler must not wait
    /// (reads of state published behind a lock).
    static func immediate(_ handler: @escaping @Sendable (DBusMethodCall) throws -> [BusValue]) -> Self {
        Self { .immediate($0, in: $1, out: $2, handler) }
    }

    /// At once, with a reply body marshalled beforehand (``DBusPreparedBody``).
    static func prepared(_ handler: @escaping @Sendable (DBusMethodCall) throws -> DBusPreparedBody) -> Self {
        Self { .prepared($0, in: $1, out: $2, handler) }
    }
}

/// How vigild reads a property the contract declares.
struct APIPropertyGetter: Sendable {
    fileprivate let make: @Sendable (_ name: String, _ signature: String, _ access: DBusProperty.Access, _ emitsChange: DBusProperty.EmitsChange) -> DBusProperty

    /// In a task of its own: the getter may wait.
    static func task(_ getter: @escaping DBusProperty.Getter) -> Self {
        Self { DBusProperty($0, signature: $1, access: $2, emitsChange: $3, get: getter) }
    }

    /// On the connection's queue, at once: a constant or a value behind a lock.
    static func immediate(_ getter: @escaping DBusProperty.ImmediateGetter) -> Self {
        immediateAt { _ in try getter() }
    }

    /// ``immediate(_:)`` given the path of the object read: one interface
    /// value serves every object of its kind (every lease's).
    static func immediateAt(_ getter: @escaping DBusProperty.ImmediateObjectGetter) -> Self {
        Self { name, signature, access, emitsChange in
            // Immediate answers serve reads only; a writable property keeps its task.
            access == .read
                ? DBusProperty(name, signature: signature, emitsChange: emitsChange, immediateAt: getter)
                : DBusProperty(name, signature: signature, access: access, emitsChange: emitsChange, getAt: getter)
        }
    }
}

extension DBusInterface {
    /// The interface declared by the contract, with a handler for each
    /// declared method and a getter for each declared property. Throws when
    /// a declared member has no handler or a handler has no declaration.
    init(checking api: APIInterface, methods: [String: APIMethodHandler] = [:],
         properties: [String: APIPropertyGetter] = [:]) throws(APIBindingError) {
        try api.checkBinding(methods: methods.keys, properties: properties.keys)
        let interface = DBusInterface(
            api.name,
            methods: api.methods.compactMap { method in
                methods[method.name].map { $0.make(method.name, method.inArguments, method.outArguments) }
            },
            properties: api.properties.compactMap { property in
                properties[property.name].map {
                    $0.make(property.name, property.signature, property.access, property.emitsChange)
                }
            },
            signals: api.signals.map { DBusSignal($0.name, arguments: $0.arguments) }
        )
        // With every declared member bound (checked above), what the
        // object server validates depends on `api` alone: check each
        // contract interface once, not on every lease's export.
        if !Self.validatedContract.withLock({ $0.contains(api.name) }) {
            do {
                try interface.validate()
            } catch {
                throw APIBindingError("\(api.name): \(error.message)")
            }
            Self.validatedContract.withLock { _ = $0.insert(api.name) }
        }
        self = interface.markedValid()
    }

    /// Names of the contract's interfaces that passed ``validate()``.
    private static let validatedContract = Lock<Set<String>>([])

    /// ``init(checking:methods:properties:)`` for vigild's own interfaces,
    /// whose bindings are fixed in the source: a mismatch stops vigild at
    /// start-up (and every bus test) with the member named.
    init(api: APIInterface, methods: [String: APIMethodHandler] = [:], properties: [String: APIPropertyGetter] = [:]) {
        do {
            try self.init(checking: api, methods: methods, properties: properties)
        } catch {
            preconditionFailure("vigild's D-Bus API does not match the contract: \(error)")
        }
    }

    /// The contract's declaration alone, for introspection: every handler
    /// fails.
    init(declaration api: APIInterface) {
        let method = APIMethodHandler.task { call in throw DBusError.failed("\(call.interface).\(call.member) is only declared here") }
        let getter = APIPropertyGetter.task { throw DBusError.failed("\(api.name) is only declared here") }
        self.init(api: api, methods: Dictionary(uniqueKeysWithValues: api.methods.map { ($0.name, method) }),
                  properties: Dictionary(uniqueKeysWithValues: api.properties.map { ($0.name, getter) }))
    }
}
