/// Who called a method, as the bus daemon says.
public struct BusCaller: Sendable, Hashable {
    /// The caller's unique bus name (`:1.42`).
    public var sender: String
    /// The caller's uid.
    public var uid: UInt32
    public init(sender: String, uid: UInt32) {
        self.sender = sender
        self.uid = uid
    }
}

/// An error a method handler throws; the caller receives it as a D-Bus
/// error named `name` with `message`.
public struct BusMethodError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A D-Bus error name. The common ones are below.
    public var name: String
    public var message: String
    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }
    public var description: String { "\(name): \(message)" }

    public static func invalidArgs(_ message: String) -> Self { Self("org.freedesktop.DBus.Error.InvalidArgs", message) }
    public static func failed(_ message: String) -> Self { Self("org.freedesktop.DBus.Error.Failed", message) }
    public static func unknownObject(_ message: String) -> Self { Self("org.freedesktop.DBus.Error.UnknownObject", message) }
}

/// A method a strategy offers on its D-Bus object: a contract ``Method``
/// bound to a handler (``Method/bind(mutating:_:)``).
public struct BusMethod: Sendable {
    public typealias Handler = @Sendable (_ arguments: [BusValue], _ caller: BusCaller) async throws -> [BusValue]

    /// The method's name and arguments, from its ``Method``.
    public let declaration: APIMethod
    /// Changes something: the host lets only root and the uid vigild runs
    /// as call it (the rule of `Host.Reload`) and answers `AccessDenied`
    /// to everyone else before the handler runs.
    public let mutating: Bool
    /// Decodes the arguments as declared, runs the typed handler and
    /// encodes its reply.
    public let handler: Handler

    public var name: String { declaration.name }
    public var inArguments: [BusArgument] { declaration.inArguments }
    public var outArguments: [BusArgument] { declaration.outArguments }
}

extension Method {
    /// This method with `handler`, as a strategy registers it
    /// (``StrategyBus/register(_:methods:)``): the handler gets the caller
    /// and the arguments as the declared Swift types and returns the
    /// declared reply, so a handler of other types does not compile. Throw
    /// ``BusMethodError`` for a specific D-Bus error; any other error
    /// becomes `Failed`.
    public func bind(mutating: Bool, _ handler: @escaping @Sendable (BusCaller, repeat each In) async throws -> Out) -> BusMethod {
        BusMethod(declaration: declaration, mutating: mutating) { arguments, caller in
            let decoded: (repeat each In)
            do throws(BusValueMismatch) { decoded = try decode(arguments) } catch { throw BusMethodError.invalidArgs(error.description) }
            return try await handler(caller, repeat each decoded).arguments
        }
    }
}

/// A read-only property of a child object: the contract's property entry
/// (a `.const` one is never announced).
public typealias BusProperty = APIProperty

/// A child object a strategy exported; its properties change through it.
public protocol BusObjectHandle: Sendable {
    /// The full object path.
    var path: String { get }
    /// Sets property values. Clients are told with PropertiesChanged at a
    /// bounded rate (at most about once a second per object; the newest
    /// values are always what a read returns). `immediately` skips the rate
    /// limit, for state changes a client waits for.
    func update(_ values: [String: BusValue], immediately: Bool) async
    /// Removes the object (`InterfacesRemoved`). Removing twice does nothing.
    func remove() async
}

extension BusObjectHandle {
    public func update(_ values: [String: BusValue]) async { await update(values, immediately: false) }
}

/// What a strategy may put on D-Bus: methods on its own object
/// (`/org/vigil/Vigil1/Strategy/<name>`) under an extra interface, and child
/// objects below it with read-only properties. Everything is removed when
/// the strategy stops. Before the host is on a bus, registrations
/// are kept and exported once it is.
public protocol StrategyBus: Sendable {
    /// The strategy object's path (also where there is no bus).
    var objectPath: String { get }
    /// Adds `interface` with `methods` (one bound ``Method`` per declared
    /// method, in declaration order) to the strategy's object, replacing an
    /// earlier registration of the same interface (a restarted strategy).
    func register(_ interface: APIInterface, methods: [BusMethod]) async throws
    /// Exports a child object at `objectPath + "/" + relativePath` with one
    /// interface of read-only `properties`, starting with `values`.
    func exportObject(relativePath: String, interface: String, properties: [BusProperty],
                      values: [String: BusValue]) async throws -> any BusObjectHandle
}

/// The bus of a context with no host D-Bus: accepts everything, exports nothing.
public struct DetachedStrategyBus: StrategyBus {
    public let objectPath: String
    public init(objectPath: String = VigilAPI.strategyPath("")) { self.objectPath = objectPath }
    public func register(_ interface: APIInterface, methods: [BusMethod]) async throws {}
    public func exportObject(relativePath: String, interface: String, properties: [BusProperty],
                             values: [String: BusValue]) async throws -> any BusObjectHandle {
        DetachedObject(path: objectPath + "/" + relativePath)
    }

    struct DetachedObject: BusObjectHandle {
        let path: String
        func update(_ values: [String: BusValue], immediately: Bool) async {}
        func remove() async {}
    }
}

/// A limit on what a D-Bus client may give: a string's length in bytes
/// (UTF-8), or a dictionary's number of entries. Checked before any work;
/// each is listed in docs/security.md.
public struct ClientInputLimit: Sendable, Hashable {
    /// What is limited, as the error names it ("lease name").
    public let what: String
    public let maximum: Int
    public let unit: String

    public init(_ what: String, maximum: Int, unit: String = "bytes") {
        self.what = what
        self.maximum = maximum
        self.unit = unit
    }

    public static let leaseName = ClientInputLimit("lease name", maximum: 256)
    public static let leaseReason = ClientInputLimit("lease reason", maximum: 1024)
    public static let downloadURL = ClientInputLimit("download URL", maximum: 8192)
    public static let downloadDestination = ClientInputLimit("download destination", maximum: 4096)
    public static let optionEntries = ClientInputLimit("options dictionary", maximum: 16, unit: "entries")

    /// InvalidArgs naming the limit when `string` is longer; quotes none of it.
    public func check(_ string: String) throws(BusMethodError) {
        try check(count: string.utf8.count)
    }

    /// InvalidArgs naming the limit when `count` is over it.
    public func check(count: Int) throws(BusMethodError) {
        guard count > maximum else { return }
        throw .invalidArgs("the \(what) has \(count) \(unit), over the limit of \(maximum) \(unit)")
    }
}
