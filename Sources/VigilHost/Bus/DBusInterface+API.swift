import VigilDBus
import VigilKit

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
    /// The interface declared by the contract, with each declared method
    /// bound to its typed handler (``DBusMethod/init(_:_:)``, in any order)
    /// and a getter for each declared property. Throws when a declared
    /// member has no handler or a handler is for a member `api` lacks.
    init(checking api: APIInterface, methods: [DBusMethod] = [],
         properties: [String: APIPropertyGetter] = [:]) throws(APIBindingError) {
        try api.checkBinding(methods: methods.map(\.name), properties: properties.keys)
        for method in methods where api.methods.first(where: { $0.name == method.name }).map({
            $0.inArguments != method.inArguments || $0.outArguments != method.outArguments
        }) ?? true {
            throw APIBindingError("\(api.name).\(method.name) is bound with another interface's declaration")
        }
        let interface = DBusInterface(
            api.name,
            methods: api.methods.compactMap { declared in methods.first { $0.name == declared.name } },
            properties: api.properties.compactMap { property in
                properties[property.name].map {
                    $0.make(property.name, property.signature, property.access, property.emitsChange)
                }
            },
            signals: api.signals.map(DBusSignal.init)
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
    init(api: APIInterface, methods: [DBusMethod] = [], properties: [String: APIPropertyGetter] = [:]) {
        do {
            try self.init(checking: api, methods: methods, properties: properties)
        } catch {
            preconditionFailure("vigild's D-Bus API does not match the contract: \(error)")
        }
    }

    /// The contract's declaration alone, for introspection: every handler
    /// fails.
    init(declaration api: APIInterface) {
        let getter = APIPropertyGetter.task { throw DBusError.failed("\(api.name) is only declared here") }
        self.init(api: api, methods: api.methods.map { declared in
            DBusMethod(declared.name, in: declared.inArguments, out: declared.outArguments) { call in
                throw DBusError.failed("\(call.interface).\(call.member) is only declared here")
            }
        }, properties: Dictionary(uniqueKeysWithValues: api.properties.map { ($0.name, getter) }))
    }
}
