import VigilAPI

/// The declaration of one D-Bus interface: its methods, properties and
/// signals with their signatures and handlers. Introspection XML, argument
/// checks and `org.freedesktop.DBus.Properties` are all derived from it.
public struct DBusInterface: Sendable {
    public var name: String { didSet { checked = false } }
    public var methods: [DBusMethod] { didSet { checked = false } }
    public var properties: [DBusProperty] { didSet { checked = false } }
    public var signals: [DBusSignal] { didSet { checked = false } }
    /// The declaration is known to pass ``validate()`` (``markedValid()``)
    /// and has not changed since: exporting it checks nothing.
    private var checked = false

    public init(_ name: String, methods: [DBusMethod] = [], properties: [DBusProperty] = [], signals: [DBusSignal] = []) {
        self.name = name
        self.methods = methods
        self.properties = properties
        self.signals = signals
    }

    public func method(named name: String) -> DBusMethod? { methods.first { $0.name == name } }
    public func property(named name: String) -> DBusProperty? { properties.first { $0.name == name } }
    public func signal(named name: String) -> DBusSignal? { signals.first { $0.name == name } }

    /// This interface, with ``validate()`` skipped when it is exported: for
    /// a caller that builds many interfaces from one declaration it has
    /// validated once (vigild's contract, whose lease interfaces are built
    /// for every lease). Any change to it afterwards clears the mark.
    public func markedValid() -> DBusInterface {
        var copy = self
        copy.checked = true
        return copy
    }

    /// Checks names, signatures and that each property's access matches its handlers.
    public func validate() throws(DBusError) {
        if checked { return }
        guard DBusSignatureSyntax.isValidInterfaceName(name) else { throw .invalidArgs("\"\(name)\" is not a valid interface name") }
        guard !DBusStandardInterfaces.names.contains(name) else {
            throw .invalidArgs("\(name) is provided by the object server and cannot be declared again")
        }
        var seen = Set<String>()
        func member(_ member: String, _ kind: String) throws(DBusError) {
            guard DBusSignatureSyntax.isValidMemberName(member) else { throw .invalidArgs("\(name): \"\(member)\" is not a valid \(kind) name") }
            guard seen.insert(kind + " " + member).inserted else { throw .invalidArgs("\(name): \(kind) \(member) is declared twice") }
        }
        func arguments(_ args: [DBusArgument], of owner: String) throws(DBusError) {
            for arg in args where !DBusSignatureSyntax.isValid(arg.signature, singleCompleteType: true) {
                throw .invalidArgs("\(name).\(owner): argument \(arg.name) has an invalid signature \"\(arg.signature)\"")
            }
        }
        for method in methods {
            try member(method.name, "method")
            try arguments(method.inArguments, of: method.name)
            try arguments(method.outArguments, of: method.name)
        }
        for property in properties {
            try member(property.name, "property")
            guard DBusSignatureSyntax.isValid(property.signature, singleCompleteType: true) else {
                throw .invalidArgs("\(name).\(property.name): invalid signature \"\(property.signature)\"")
            }
            if property.access.isReadable, property.getter == nil {
                throw .invalidArgs("\(name).\(property.name) is readable but has no getter")
            }
            if property.access.isWritable, property.setter == nil {
                throw .invalidArgs("\(name).\(property.name) is writable but has no setter")
            }
        }
        for signal in signals {
            try member(signal.name, "signal")
            try arguments(signal.arguments, of: signal.name)
        }
    }
}

/// A named argument of a method or signal: the contract's own
/// (``BusArgument``), one type for the API's declarations and the wire's.
public typealias DBusArgument = BusArgument

extension BusArgument {
    /// An argument whose signature comes from a Swift type.
    public init<T: BusTyped>(_ name: String, _ type: T.Type) {
        self.init(name, T.busSignature)
    }
}

/// An incoming method call, as seen by a handler.
public struct DBusMethodCall: Sendable {
    /// The whole message (arguments are in `message.body`).
    public let message: DBusMessage
    /// The connection the call arrived on (to emit signals, ask the bus for
    /// the caller's uid, ...).
    public let connection: DBusConnection
    public let path: String
    public let interface: String
    public let member: String

    /// The caller's unique bus name (`:1.42`).
    public var sender: String { message.sender ?? "" }
    public var arguments: [BusValue] { message.body }

    /// Decodes argument `index` as `T` (the signature was already checked
    /// against the declaration, so this only fails on a type mismatch in the
    /// declaration itself).
    public func argument<T: BusDecodable>(_ index: Int, as type: T.Type = T.self) throws(DBusError) -> T {
        try message.argument(index, as: type)
    }
}

/// A method: its arguments and its async handler, which returns the out values.
public struct DBusMethod: Sendable {
    public typealias Handler = @Sendable (DBusMethodCall) async throws -> [BusValue]

    public var name: String
    public var inArguments: [DBusArgument]
    public var outArguments: [DBusArgument]
    public var handler: Handler
    /// Set for a method that answers without waiting for anything (reads of
    /// state published behind a lock): it is answered on the connection's
    /// queue, without a task per call. It must not block.
    public var immediateHandler: (@Sendable (DBusMethodCall) throws -> [BusValue])?
    /// Set for an immediate method whose reply body is marshalled once and
    /// reused (``DBusPreparedBody``).
    public var preparedHandler: (@Sendable (DBusMethodCall) throws -> DBusPreparedBody)?
    /// The handler's task prefers the connection's loop, the host loop's
    /// thread (``brief(_:in:out:_:)``).
    public var runsOnConnectionThread = false

    public init(_ name: String, in inArguments: [DBusArgument] = [], out outArguments: [DBusArgument] = [], handler: @escaping Handler) {
        self.name = name
        self.inArguments = inArguments
        self.outArguments = outArguments
        self.handler = handler
    }

    /// A method answered at once (see ``immediateHandler``).
    public static func immediate(_ name: String, in inArguments: [DBusArgument] = [], out outArguments: [DBusArgument] = [],
                                 _ handler: @escaping @Sendable (DBusMethodCall) throws -> [BusValue]) -> DBusMethod {
        var method = DBusMethod(name, in: inArguments, out: outArguments, handler: { call in try handler(call) })
        method.immediateHandler = handler
        return method
    }

    /// A method answered at once with a body marshalled beforehand (see
    /// ``DBusPreparedBody``).
    public static func prepared(_ name: String, in inArguments: [DBusArgument] = [], out outArguments: [DBusArgument] = [],
                                _ handler: @escaping @Sendable (DBusMethodCall) throws -> DBusPreparedBody) -> DBusMethod {
        var method = immediate(name, in: inArguments, out: outArguments) { call in try handler(call).values }
        method.preparedHandler = handler
        return method
    }

    /// A method whose handler waits only for actors and replies, and does
    /// little work itself: its task runs on the connection's loop (the
    /// task's preferred executor; actors it calls run there too when they
    /// are free), so a call needs no thread woken to start it, to hop into
    /// an actor, or to queue its reply. A handler that computes for long
    /// holds up the loop (every connection, timer and, in vigild, task)
    /// meanwhile: use ``init(_:in:out:handler:)`` for that.
    public static func brief(_ name: String, in inArguments: [DBusArgument] = [], out outArguments: [DBusArgument] = [],
                             _ handler: @escaping Handler) -> DBusMethod {
        var method = DBusMethod(name, in: inArguments, out: outArguments, handler: handler)
        method.runsOnConnectionThread = true
        return method
    }

    /// The signature a call must have.
    public var inSignature: String { inArguments.map(\.signature).joined() }
    /// The signature the handler must return.
    public var outSignature: String { outArguments.map(\.signature).joined() }
}

/// A property: its type, access, change-signal behaviour and accessors.
public struct DBusProperty: Sendable {
    /// Read, write or both: the contract's own (``APIProperty/Access``).
    public typealias Access = APIProperty.Access
    /// The `org.freedesktop.DBus.Property.EmitsChangedSignal` annotation:
    /// the contract's own (``APIProperty/EmitsChange``).
    public typealias EmitsChange = APIProperty.EmitsChange

    public typealias Getter = @Sendable () async throws -> BusValue
    /// A getter that answers at once, without waiting for anything (a
    /// value behind a lock, a constant): `Get` and `GetAll` are answered
    /// with it on the connection's queue, without a task per call.
    public typealias ImmediateGetter = @Sendable () throws -> BusValue
    /// A getter given the path of the object it reads, so one interface
    /// value can be exported at many paths (an object per lease) with no
    /// getters made per object.
    public typealias ObjectGetter = @Sendable (_ path: String) async throws -> BusValue
    /// An ``ImmediateGetter`` given the object's path (see ``ObjectGetter``).
    public typealias ImmediateObjectGetter = @Sendable (_ path: String) throws -> BusValue
    public typealias Setter = @Sendable (BusValue, DBusMethodCall) async throws -> Void

    public var name: String
    public var signature: String
    public var access: Access
    public var emitsChange: EmitsChange
    /// Reads the value of the object at the path given.
    public var getter: ObjectGetter?
    /// Set when the value can be read without waiting (see ``ImmediateGetter``).
    public var immediateGetter: ImmediateObjectGetter?
    public var setter: Setter?

    public init(_ name: String, signature: String, access: Access, emitsChange: EmitsChange = .true,
                get getter: Getter?, set setter: Setter? = nil) {
        let atPath: ObjectGetter? = if let getter { { _ in try await getter() } } else { nil }
        self.init(name, signature: signature, access: access, emitsChange: emitsChange, getAt: atPath, set: setter)
    }

    /// A property whose getter reads the object at the path it is given.
    public init(_ name: String, signature: String, access: Access, emitsChange: EmitsChange = .true,
                getAt getter: ObjectGetter?, set setter: Setter? = nil) {
        self.name = name
        self.signature = signature
        self.access = access
        self.emitsChange = emitsChange
        self.getter = getter
        self.setter = setter
    }

    /// A read-only property whose value is read without waiting: a
    /// constant, or state published behind a lock. It must not block.
    public init(_ name: String, signature: String, emitsChange: EmitsChange = .true,
                immediate getter: @escaping ImmediateGetter) {
        self.init(name, signature: signature, emitsChange: emitsChange, immediateAt: { _ in try getter() })
    }

    /// ``init(_:signature:emitsChange:immediate:)`` with a getter given the
    /// object's path (``ImmediateObjectGetter``).
    public init(_ name: String, signature: String, emitsChange: EmitsChange = .true,
                immediateAt getter: @escaping ImmediateObjectGetter) {
        self.init(name, signature: signature, access: .read, emitsChange: emitsChange, getAt: getter)
        self.immediateGetter = getter
    }

    /// A read-only property of Swift type `T`.
    public static func readOnly<T: BusEncodable>(
        _ name: String, _ type: T.Type, emitsChange: EmitsChange = .true,
        get: @escaping @Sendable () async throws -> T
    ) -> DBusProperty {
        DBusProperty(name, signature: T.busSignature, access: .read, emitsChange: emitsChange,
                     get: { try await get().busValue })
    }

    /// A read-write property of Swift type `T`; the setter receives the
    /// decoded value and the call (for access checks).
    public static func readWrite<T: BusCodable>(
        _ name: String, _ type: T.Type, emitsChange: EmitsChange = .true,
        get: @escaping @Sendable () async throws -> T,
        set: @escaping @Sendable (T, DBusMethodCall) async throws -> Void
    ) -> DBusProperty {
        DBusProperty(name, signature: T.busSignature, access: .readwrite, emitsChange: emitsChange,
                     get: { try await get().busValue },
                     set: { value, call in try await set(try value.decode(T.self), call) })
    }
}

/// A signal and its arguments: the contract's entry (``APISignal``, a
/// typed ``Signal``'s `declaration`), one type for the API's declarations
/// and the wire's.
public typealias DBusSignal = APISignal

extension APISignal {
    /// A signal named `name` with `arguments`.
    public init(_ name: String, arguments: [BusArgument]) {
        self.init(name, arguments)
    }
}

/// The interfaces the object server implements itself.
enum DBusStandardInterfaces {
    static let peer = "org.freedesktop.DBus.Peer"
    static let introspectable = "org.freedesktop.DBus.Introspectable"
    static let properties = "org.freedesktop.DBus.Properties"
    static let objectManager = "org.freedesktop.DBus.ObjectManager"
    static let names: Set<String> = [peer, introspectable, properties, objectManager]

    static let peerXML = """
      <interface name="org.freedesktop.DBus.Peer">
        <method name="Ping"/>
        <method name="GetMachineId">
          <arg type="s" name="machine_uuid" direction="out"/>
        </method>
      </interface>

    """
    static let introspectableXML = """
      <interface name="org.freedesktop.DBus.Introspectable">
        <method name="Introspect">
          <arg type="s" name="xml_data" direction="out"/>
        </method>
      </interface>

    """
    static let propertiesXML = """
      <interface name="org.freedesktop.DBus.Properties">
        <method name="Get">
          <arg type="s" name="interface_name" direction="in"/>
          <arg type="s" name="property_name" direction="in"/>
          <arg type="v" name="value" direction="out"/>
        </method>
        <method name="GetAll">
          <arg type="s" name="interface_name" direction="in"/>
          <arg type="a{sv}" name="properties" direction="out"/>
        </method>
        <method name="Set">
          <arg type="s" name="interface_name" direction="in"/>
          <arg type="s" name="property_name" direction="in"/>
          <arg type="v" name="value" direction="in"/>
        </method>
        <signal name="PropertiesChanged">
          <arg type="s" name="interface_name"/>
          <arg type="a{sv}" name="changed_properties"/>
          <arg type="as" name="invalidated_properties"/>
        </signal>
      </interface>

    """
    static let objectManagerXML = """
      <interface name="org.freedesktop.DBus.ObjectManager">
        <method name="GetManagedObjects">
          <arg type="a{oa{sa{sv}}}" name="object_paths_interfaces_and_properties" direction="out"/>
        </method>
        <signal name="InterfacesAdded">
          <arg type="o" name="object_path"/>
          <arg type="a{sa{sv}}" name="interfaces_and_properties"/>
        </signal>
        <signal name="InterfacesRemoved">
          <arg type="o" name="object_path"/>
          <arg type="as" name="interfaces"/>
        </signal>
      </interface>

    """
}

/// Generates introspection XML from declarations.
public enum DBusIntrospection {
    /// The XML document for one node.
    /// - Parameters:
    ///   - interfaces: the declared interfaces of the object at this path (empty if none).
    ///   - isObject: whether an object is exported here (adds Properties).
    ///   - isObjectManager: whether an ObjectManager lives here.
    ///   - children: names of direct child nodes.
    public static func xml(interfaces: [DBusInterface], isObject: Bool, isObjectManager: Bool, children: [String]) -> String {
        var xml = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>

        """
        xml += DBusStandardInterfaces.peerXML
        xml += DBusStandardInterfaces.introspectableXML
        if isObject { xml += DBusStandardInterfaces.propertiesXML }
        if isObjectManager { xml += DBusStandardInterfaces.objectManagerXML }
        for interface in interfaces {
            xml += "  <interface name=\"\(escape(interface.name))\">\n"
            for method in interface.methods {
                let args = method.inArguments.map { ($0, "in") } + method.outArguments.map { ($0, "out") }
                if args.isEmpty {
                    xml += "    <method name=\"\(escape(method.name))\"/>\n"
                    continue
                }
                xml += "    <method name=\"\(escape(method.name))\">\n"
                for (arg, direction) in args {
                    xml += "      <arg type=\"\(escape(arg.signature))\" name=\"\(escape(arg.name))\" direction=\"\(direction)\"/>\n"
                }
                // gdbus-codegen passes fds only for methods so annotated:
                // without it, the generated C client drops the reply's fd.
                if args.contains(where: { $0.0.signature.contains("h") }) {
                    xml += "      <annotation name=\"org.gtk.GDBus.C.UnixFD\" value=\"true\"/>\n"
                }
                xml += "    </method>\n"
            }
            for signal in interface.signals {
                if signal.arguments.isEmpty {
                    xml += "    <signal name=\"\(escape(signal.name))\"/>\n"
                    continue
                }
                xml += "    <signal name=\"\(escape(signal.name))\">\n"
                for arg in signal.arguments {
                    xml += "      <arg type=\"\(escape(arg.signature))\" name=\"\(escape(arg.name))\"/>\n"
                }
                xml += "    </signal>\n"
            }
            for property in interface.properties {
                let open = "    <property name=\"\(escape(property.name))\" type=\"\(escape(property.signature))\" access=\"\(property.access.rawValue)\""
                if property.emitsChange == .true {
                    xml += open + "/>\n"
                } else {
                    xml += open + ">\n"
                    xml += "      <annotation name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"\(property.emitsChange.rawValue)\"/>\n"
                    xml += "    </property>\n"
                }
            }
            xml += "  </interface>\n"
        }
        for child in children {
            xml += "  <node name=\"\(escape(child))\"/>\n"
        }
        xml += "</node>\n"
        return xml
    }

    static func escape(_ text: String) -> String {
        XMLText.escaped(text)
    }
}
