/// A D-Bus value as a strategy sees it: the basic types, arrays, and
/// `a{sv}` dictionaries. The host converts it to and from the wire format.
public indirect enum BusValue: Sendable, Hashable, CustomStringConvertible {
    case string(String)
    case int64(Int64)
    case uint64(UInt64)
    case int32(Int32)
    case uint32(UInt32)
    case double(Double)
    case bool(Bool)
    case objectPath(String)
    /// An array of values of one type, given by its D-Bus signature (`s`, `o`, ...).
    case array(elementSignature: String, [BusValue])
    /// `a{sv}`: string keys, each value in a variant.
    case dictionary([String: BusValue])
    /// A struct: its fields in order (the rows of docs/dbus-api.md, see ``APIRow``).
    case structure([BusValue])

    /// The D-Bus type signature.
    public var signature: String {
        switch self {
        case .string: "s"
        case .int64: "x"
        case .uint64: "t"
        case .int32: "i"
        case .uint32: "u"
        case .double: "d"
        case .bool: "b"
        case .objectPath: "o"
        case .array(let element, _): "a" + element
        case .dictionary: "a{sv}"
        case .structure(let fields): "(" + fields.map(\.signature).joined() + ")"
        }
    }

    public var description: String {
        switch self {
        case .string(let v), .objectPath(let v): v
        case .int64(let v): String(v)
        case .uint64(let v): String(v)
        case .int32(let v): String(v)
        case .uint32(let v): String(v)
        case .double(let v): String(v)
        case .bool(let v): String(v)
        case .array(_, let items): "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .dictionary(let d): "{" + d.keys.sorted().map { "\($0): \(d[$0]?.description ?? "")" }.joined(separator: ", ") + "}"
        case .structure(let fields): "(" + fields.map(\.description).joined(separator: ", ") + ")"
        }
    }

    public var stringValue: String? { if case .string(let v) = self { v } else { nil } }
    public var boolValue: Bool? { if case .bool(let v) = self { v } else { nil } }
    /// Any integer type, as Int64 when it fits.
    public var integerValue: Int64? {
        switch self {
        case .int64(let v): v
        case .uint64(let v): Int64(exactly: v)
        case .int32(let v): Int64(v)
        case .uint32(let v): Int64(v)
        default: nil
        }
    }
}

/// A named argument of a strategy's bus method.
public struct BusArgument: Sendable, Hashable {
    public var name: String
    /// D-Bus signature: one of the types ``BusValue`` can hold.
    public var signature: String
    public init(_ name: String, _ signature: String) {
        self.name = name
        self.signature = signature
    }
}

/// Identifies a lease for the life of the host process.
public struct LeaseID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var description: String { String(rawValue) }
}
