/// One D-Bus interface of the `org.vigil.Vigil1` API as introspection
/// shows it: the entries of its typed members (``Method``, ``Signal``,
/// ``Property``; APIMember.swift) with their names and signatures, in
/// order. The introspection XML (docs/org.vigil.Vigil1.xml) is generated
/// from it, and vigild checks its bindings against it.
public struct APIInterface: Sendable, Hashable {
    public var name: String
    /// Where objects with this interface live, for the XML's comment
    /// (`/org/vigil/Vigil1/Lease/<id>`).
    public var objects: String
    public var methods: [APIMethod]
    public var properties: [APIProperty]
    public var signals: [APISignal]

    public init(_ name: String, objects: String, methods: [APIMethod] = [], properties: [APIProperty] = [], signals: [APISignal] = []) {
        self.name = name
        self.objects = objects
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    /// Checks that an implementation binds exactly the declared members:
    /// every declared method and property has a handler, and no handler
    /// is for a member the contract lacks.
    public func checkBinding(methods bound: some Collection<String>, properties boundProperties: some Collection<String>) throws(APIBindingError) {
        // The usual case, without building the lists an error names (a
        // client lease's two interfaces are bound on every BeginBackgroundTask).
        if bound.count == methods.count, boundProperties.count == properties.count,
           methods.allSatisfy({ method in bound.contains(method.name) }),
           properties.allSatisfy({ property in boundProperties.contains(property.name) }) {
            return
        }
        func compare(_ kind: String, declared: [String], bound: some Collection<String>) throws(APIBindingError) {
            let missing = declared.filter { !bound.contains($0) }
            let extra = bound.filter { !declared.contains($0) }.sorted()
            if !missing.isEmpty { throw APIBindingError("\(name): declared \(kind) without a handler: \(missing.joined(separator: ", "))") }
            if !extra.isEmpty { throw APIBindingError("\(name): \(kind) handler for an undeclared member: \(extra.joined(separator: ", "))") }
        }
        try compare("method", declared: methods.map(\.name), bound: bound)
        try compare("property", declared: properties.map(\.name), bound: boundProperties)
    }
}

/// An implementation does not match the contract.
public struct APIBindingError: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// A method's introspection entry (``Method/declaration``): its arguments
/// in and out, named, with the signatures its types give.
public struct APIMethod: Sendable, Hashable {
    public var name: String
    public var inArguments: [BusArgument]
    public var outArguments: [BusArgument]
    public init(_ name: String, in inArguments: [BusArgument] = [], out outArguments: [BusArgument] = []) {
        self.name = name
        self.inArguments = inArguments
        self.outArguments = outArguments
    }
    /// The signature a call must have.
    public var inSignature: String { inArguments.map(\.signature).joined() }
    /// The signature of the reply.
    public var outSignature: String { outArguments.map(\.signature).joined() }
}

/// A property's introspection entry (``Property/declaration``, or a row's field).
public struct APIProperty: Sendable, Hashable {
    public enum Access: String, Sendable, Hashable {
        case read, write, readwrite
        public var isReadable: Bool { self != .write }
        public var isWritable: Bool { self != .read }
    }

    /// The `org.freedesktop.DBus.Property.EmitsChangedSignal` annotation:
    /// what a client is told when the value changes.
    public enum EmitsChange: String, Sendable, Hashable {
        /// PropertiesChanged carries the new value.
        case `true`
        /// PropertiesChanged names the property without its value.
        case invalidates
        /// The value never changes during the object's lifetime.
        case const
        /// The value changes without a signal (read it again).
        case `false`
    }

    public var name: String
    public var signature: String
    public var access: Access
    public var emitsChange: EmitsChange
    public init(_ name: String, _ signature: String, access: Access = .read, emitsChange: EmitsChange = .true) {
        self.name = name
        self.signature = signature
        self.access = access
        self.emitsChange = emitsChange
    }
}

/// A signal's introspection entry (``Signal/declaration``).
public struct APISignal: Sendable, Hashable {
    public var name: String
    public var arguments: [BusArgument]
    public init(_ name: String, _ arguments: [BusArgument] = []) {
        self.name = name
        self.arguments = arguments
    }
    public var signature: String { arguments.map(\.signature).joined() }
}
