/// A contract member declared once, with Swift types (docs/dbus-api.md,
/// "How the contract is declared"): ``Method`` and ``Signal``. The D-Bus
/// signature and the introspection entry (``APIMethod``, ``APISignal``) are
/// computed from the types; vigild binds a handler whose parameters are the
/// argument types and whose result is the reply type, VigilClient calls with
/// the same types, and a handler or a call of other types does not compile.
/// There is no member name string outside these declarations.

/// A named argument of type `T`: the name is what introspection shows; the
/// signature is `T`'s.
public struct Arg<T: BusTyped>: Sendable {
    public let name: String
    public init(_ name: String, _ type: T.Type = T.self) { self.name = name }
    var erased: BusArgument { BusArgument(name, T.busSignature) }
}

/// The arguments of one message, in order: a method's reply or a signal's
/// body. ``BusTuple`` holds them as a Swift tuple; a contract row
/// (``APIRow``) holds them as named fields (`ReloadReply`).
public protocol BusBody: Sendable {
    /// Each argument's signature, in order.
    static var signatures: [String] { get }
    /// The body as it goes on the wire.
    var arguments: [BusValue] { get }
    /// The body of a message; another shape throws, never traps.
    init(arguments: [BusValue]) throws(BusValueMismatch)
}

/// Message arguments as a tuple of Swift values: `BusTuple<ObjectPath,
/// BusFileDescriptor>` is a reply `oh`; `BusTuple< >` an empty one. With one
/// element, ``values`` is the value itself.
public struct BusTuple<each T: BusCodable>: BusBody {
    public var values: (repeat each T)

    public init(_ values: repeat each T) {
        self.values = (repeat each values)
    }

    public static var signatures: [String] {
        var signatures: [String] = []
        for type in repeat (each T).self { signatures.append(type.busSignature) }
        return signatures
    }

    public var arguments: [BusValue] {
        var arguments: [BusValue] = []
        for value in repeat each values { arguments.append(value.busValue) }
        return arguments
    }

    public init(arguments: [BusValue]) throws(BusValueMismatch) {
        var reader = try BusArgumentReader(arguments, Self.signatures)
        self.values = try reader.read(repeat (each T).self)
    }
}

/// Reads a body's arguments in order, each as the type its declaration gives.
struct BusArgumentReader {
    private let arguments: [BusValue]
    private var next = 0

    /// Throws when the count or any signature differs from `signatures`,
    /// naming both (the arguments are not decoded one by one before that).
    /// `signatures` may be a lazy view (a declaration's arguments): no list
    /// is built for a call that matches.
    init<Signatures: Collection<String>>(_ arguments: [BusValue], _ signatures: Signatures) throws(BusValueMismatch) {
        guard arguments.count == signatures.count,
              zip(arguments, signatures).allSatisfy({ $0.signature == $1 }) else {
            throw BusValueMismatch("expected arguments \"\(signatures.joined())\", got \"\(arguments.map(\.signature).joined())\"")
        }
        self.arguments = arguments
    }

    mutating func read<each T: BusDecodable>(_ types: repeat (each T).Type) throws(BusValueMismatch) -> (repeat each T) {
        // A pack expansion cannot carry a typed throw through a closure
        // yet: decode through an untyped helper and restore the type.
        do {
            return (repeat try one((each T).self))
        } catch let mismatch as BusValueMismatch {
            throw mismatch
        } catch {
            throw BusValueMismatch("\(error)")
        }
    }

    private mutating func one<T: BusDecodable>(_ type: T.Type) throws -> T {
        defer { next += 1 }
        return try T(busValue: arguments[next])
    }
}

extension APIRow {
    /// A row as a message body: its fields are the arguments.
    public static var signatures: [String] { fields.map(\.signature) }
}

/// A method of interface `interface`: arguments `In`, reply `Out`.
public struct Method<each In: BusCodable, Out: BusBody>: Sendable {
    /// The interface that declares it.
    public let interface: String
    /// Its introspection entry: names and signatures.
    public let declaration: APIMethod

    public var name: String { declaration.name }

    /// A method replying `BusTuple<each O>`, with its arguments named.
    public init<each O: BusCodable>(_ interface: String, _ name: String, in arguments: repeat Arg<each In>,
                                    out results: repeat Arg<each O>) where Out == BusTuple<repeat each O> {
        var inArguments: [BusArgument] = []
        for argument in repeat each arguments { inArguments.append(argument.erased) }
        var outArguments: [BusArgument] = []
        for result in repeat each results { outArguments.append(result.erased) }
        self.interface = interface
        self.declaration = APIMethod(name, in: inArguments, out: outArguments)
    }

    /// A method replying a row: its out arguments are the row's fields.
    public init(_ interface: String, _ name: String, in arguments: repeat Arg<each In>, reply: Out.Type) where Out: APIRow {
        var inArguments: [BusArgument] = []
        for argument in repeat each arguments { inArguments.append(argument.erased) }
        self.interface = interface
        self.declaration = APIMethod(name, in: inArguments, out: Out.fields.map { BusArgument($0.name, $0.signature) })
    }

    /// A call's arguments, decoded as declared; another signature throws.
    public func decode(_ arguments: [BusValue]) throws(BusValueMismatch) -> (repeat each In) {
        // The declaration's signatures are the argument types' (each
        // `Arg<In>` erased), made once: a call builds no list of them.
        var reader = try BusArgumentReader(arguments, declaration.inArguments.lazy.map { $0.signature })
        return try reader.read(repeat (each In).self)
    }

    /// A call's arguments, encoded.
    public func encode(_ arguments: repeat each In) -> [BusValue] {
        var values: [BusValue] = []
        for argument in repeat each arguments { values.append(argument.busValue) }
        return values
    }
}

/// A signal of interface `interface` with body `Body`.
public struct Signal<Body: BusBody>: Sendable {
    public let interface: String
    /// Its introspection entry: names and signatures.
    public let declaration: APISignal

    public var name: String { declaration.name }

    /// A signal whose arguments are a tuple, named.
    public init<each T: BusCodable>(_ interface: String, _ name: String, _ arguments: repeat Arg<each T>) where Body == BusTuple<repeat each T> {
        var erased: [BusArgument] = []
        for argument in repeat each arguments { erased.append(argument.erased) }
        self.interface = interface
        self.declaration = APISignal(name, erased)
    }

    /// A signal whose arguments are a row's fields.
    public init(_ interface: String, _ name: String, _ body: Body.Type) where Body: APIRow {
        self.interface = interface
        self.declaration = APISignal(name, Body.fields.map { BusArgument($0.name, $0.signature) })
    }
}

/// A read-only property of interface `interface`, of type `T`.
public struct Property<T: BusCodable>: Sendable {
    public let interface: String
    /// Its introspection entry: name, signature, change signal.
    public let declaration: APIProperty

    public var name: String { declaration.name }

    public init(_ interface: String, _ name: String, _ type: T.Type, emitsChange: APIProperty.EmitsChange) {
        self.interface = interface
        self.declaration = APIProperty(name, T.busSignature, emitsChange: emitsChange)
    }
}

/// A value of type `T` encoded already: a getter's cache, encoded once per
/// change and read many times, keeps its type.
public struct BusEncoded<T: BusEncodable>: Sendable {
    public let busValue: BusValue
    public init(_ value: T) { busValue = value.busValue }
}

extension BusEncoded where T == [String: BusValue] {
    /// An `a{sv}` with its keys in order (``BusValue/dictionary(_:)``), as
    /// a client that prints it sees them.
    public init(keyOrder entries: [String: BusValue]) { busValue = .dictionary(entries) }
}

// MARK: values the contract's members carry

/// An object path (`o`). The wire checks it: libdbus refuses to send or
/// deliver a message with an invalid one, so this type does not.
public struct ObjectPath: BusCodable, Hashable, Comparable, CustomStringConvertible {
    public var rawValue: String
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public static var busSignature: String { "o" }
    public var busValue: BusValue { .objectPath(rawValue) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .objectPath(v) = busValue else { throw BusValueMismatch(expected: "o", got: busValue) }
        rawValue = v
    }
    public var description: String { rawValue }
    public static func < (lhs: ObjectPath, rhs: ObjectPath) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A value in a variant (`v`): `[String: BusValue]` is the API's `a{sv}`.
extension BusValue: BusCodable {
    public static var busSignature: String { "v" }
    public var busValue: BusValue { .variant(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .variant(v) = busValue else { throw BusValueMismatch(expected: "v", got: busValue) }
        self = v.unwrapped
    }
}
