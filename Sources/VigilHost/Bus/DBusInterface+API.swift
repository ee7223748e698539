import VigilDBus
import VigilKit

extension DBusInterface {
    /// The interface declared by the contract, with a handler for each
    /// declared method and a getter for each declared property. Throws when
    /// a declared member has no handler or a handler has no declaration.
    init(checking api: APIInterface, methods: [String: DBusMethod.Handler] = [:],
         properties: [String: DBusProperty.Getter] = [:]) throws(APIBindingError) {
        try api.checkBinding(methods: methods.keys, properties: properties.keys)
        self.init(
            api.name,
            methods: api.methods.compactMap { method in
                methods[method.name].map {
                    DBusMethod(method.name, in: method.inArguments.map(DBusArgument.init), out: method.outArguments.map(DBusArgument.init), handler: $0)
                }
            },
            properties: api.properties.compactMap { property in
                properties[property.name].map {
                    DBusProperty(property.name, signature: property.signature, access: DBusProperty.Access(property.access),
                                 emitsChange: DBusProperty.EmitsChange(property.emitsChange), get: $0)
                }
            },
            signals: api.signals.map { DBusSignal($0.name, arguments: $0.arguments.map(DBusArgument.init)) }
        )
    }

    /// ``init(checking:methods:properties:)`` for vigild's own interfaces,
    /// whose bindings are fixed in the source: a mismatch stops vigild at
    /// start-up (and every bus test) with the member named.
    init(api: APIInterface, methods: [String: DBusMethod.Handler] = [:], properties: [String: DBusProperty.Getter] = [:]) {
        do {
            try self.init(checking: api, methods: methods, properties: properties)
        } catch {
            preconditionFailure("vigild's D-Bus API does not match the contract: \(error)")
        }
    }

    /// The contract's declaration alone, for introspection: every handler
    /// fails.
    init(declaration api: APIInterface) {
        let method: DBusMethod.Handler = { call in throw DBusError.failed("\(call.interface).\(call.member) is only declared here") }
        let getter: DBusProperty.Getter = { throw DBusError.failed("\(api.name) is only declared here") }
        self.init(api: api, methods: Dictionary(uniqueKeysWithValues: api.methods.map { ($0.name, method) }),
                  properties: Dictionary(uniqueKeysWithValues: api.properties.map { ($0.name, getter) }))
    }
}

extension DBusArgument {
    init(_ argument: BusArgument) { self.init(argument.name, argument.signature) }
}

// The SDK's enums spell their cases as the annotation values, like VigilDBus's.
extension DBusProperty.Access {
    init(_ access: APIProperty.Access) { self = Self(rawValue: access.rawValue) ?? .read }
}

extension DBusProperty.EmitsChange {
    init(_ emitsChange: APIProperty.EmitsChange) { self = Self(rawValue: emitsChange.rawValue) ?? .true }
}
