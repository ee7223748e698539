import VigilDBus
import VigilKit

extension DBusInterface {
    /// The interface declared by the contract, with each declared method
    /// bound to its typed handler (``DBusMethod/init(_:_:)``) and each
    /// declared property to its typed getter (``DBusProperty/immediate(_:_:)``),
    /// in any order. Throws when a declared member has no handler, or a
    /// handler is for a member `api` lacks or declares otherwise.
    init(checking api: APIInterface, methods: [DBusMethod] = [], properties: [DBusProperty] = []) throws(APIBindingError) {
        try api.checkBinding(methods: methods.map(\.name), properties: properties.map(\.name))
        for method in methods where api.methods.first(where: { $0.name == method.name }).map({
            $0.inArguments != method.inArguments || $0.outArguments != method.outArguments
        }) ?? true {
            throw APIBindingError("\(api.name).\(method.name) is bound with another interface's declaration")
        }
        for property in properties where api.properties.first(where: { $0.name == property.name }).map({
            $0.signature != property.signature || $0.emitsChange != property.emitsChange || $0.access != property.access
        }) ?? true {
            throw APIBindingError("\(api.name).\(property.name) is bound with another interface's declaration")
        }
        let interface = DBusInterface(
            api.name,
            methods: api.methods.compactMap { declared in methods.first { $0.name == declared.name } },
            properties: api.properties.compactMap { declared in properties.first { $0.name == declared.name } },
            signals: api.signals
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
    init(api: APIInterface, methods: [DBusMethod] = [], properties: [DBusProperty] = []) {
        do {
            try self.init(checking: api, methods: methods, properties: properties)
        } catch {
            preconditionFailure("vigild's D-Bus API does not match the contract: \(error)")
        }
    }

    /// The contract's declaration alone, for introspection: every handler
    /// fails.
    init(declaration api: APIInterface) {
        self.init(api: api, methods: api.methods.map { declared in
            DBusMethod(declared.name, in: declared.inArguments, out: declared.outArguments) { call in
                throw DBusError.failed("\(call.interface).\(call.member) is only declared here")
            }
        }, properties: api.properties.map { declared in
            DBusProperty(declared) { _ in throw DBusError.failed("\(api.name).\(declared.name) is only declared here") }
        })
    }
}
