import Glibc
import Synchronization

/// One value of the D-Bus type system: what vigild's API sends and
/// receives, what a strategy's methods take and return, and what the rows
/// of the contract (``APIRow``) encode to. One type from the wire to the
/// strategy: VigilDBus marshals it, VigilKit hands it to plugins.
///
/// It carries enough to know its exact signature (the element type of an
/// empty array). Only the containers are `indirect` (boxed): a string or a
/// number is held inline, so building a value allocates nothing beyond its
/// String or Array storage.
public enum BusValue: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    case byte(UInt8)
    case bool(Bool)
    case int16(Int16)
    case uint16(UInt16)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    case unixFD(BusFileDescriptor)
    /// An array whose elements all have `elementSignature` (one complete type).
    indirect case array(elementSignature: String, [BusValue])
    /// A dictionary (`a{kv}`) kept in wire order; keys must be a basic type.
    /// `a{sv}`, the API's options and property sets: ``dictionary(_:)``.
    indirect case dict(keySignature: String, valueSignature: String, [BusDictEntry])
    /// A struct: its fields in order (the rows of docs/dbus-api.md).
    case structure([BusValue])
    indirect case variant(BusValue)

    /// `a{sv}`: string keys in sorted order, each value in a variant.
    public static func dictionary(_ entries: [String: BusValue]) -> BusValue {
        .dict(keySignature: "s", valueSignature: "v", entries.keys.sorted().map { key in
            BusDictEntry(key: .string(key), value: .variant(entries[key] ?? .string("")))
        })
    }

    /// The D-Bus signature of this value (one complete type).
    public var signature: String {
        switch self {
        case .byte: "y"
        case .bool: "b"
        case .int16: "n"
        case .uint16: "q"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .unixFD: "h"
        case let .array(element, _): "a" + element
        case let .dict(key, value, _): "a{" + key + value + "}"
        case let .structure(fields): "(" + fields.map(\.signature).joined() + ")"
        case .variant: "v"
        }
    }

    public static func == (lhs: BusValue, rhs: BusValue) -> Bool {
        switch (lhs, rhs) {
        case let (.byte(a), .byte(b)): a == b
        case let (.bool(a), .bool(b)): a == b
        case let (.int16(a), .int16(b)): a == b
        case let (.uint16(a), .uint16(b)): a == b
        case let (.int32(a), .int32(b)): a == b
        case let (.uint32(a), .uint32(b)): a == b
        case let (.int64(a), .int64(b)): a == b
        case let (.uint64(a), .uint64(b)): a == b
        case let (.double(a), .double(b)): a == b || (a.isNaN && b.isNaN)
        case let (.string(a), .string(b)): a == b
        case let (.objectPath(a), .objectPath(b)): a == b
        case let (.signature(a), .signature(b)): a == b
        case let (.unixFD(a), .unixFD(b)): a === b
        case let (.array(sa, a), .array(sb, b)): sa == sb && a == b
        case let (.dict(ka, va, a), .dict(kb, vb, b)): ka == kb && va == vb && a == b
        case let (.structure(a), .structure(b)): a == b
        case let (.variant(a), .variant(b)): a == b
        default: false
        }
    }

    /// The value as a person reads it: strings bare, containers bracketed,
    /// variants unwrapped.
    public var description: String {
        switch self {
        case .string(let v), .objectPath(let v), .signature(let v): v
        case .byte(let v): String(v)
        case .int16(let v): String(v)
        case .uint16(let v): String(v)
        case .int32(let v): String(v)
        case .uint32(let v): String(v)
        case .int64(let v): String(v)
        case .uint64(let v): String(v)
        case .double(let v): String(v)
        case .bool(let v): String(v)
        case .unixFD(let v): v.description
        case .array(_, let items): "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .dict(_, _, let entries): "{" + entries.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        case .structure(let fields): "(" + fields.map(\.description).joined(separator: ", ") + ")"
        case .variant(let inner): inner.description
        }
    }

    /// The value with its types, as a message dump shows it.
    public var debugDescription: String {
        switch self {
        case let .byte(v): "byte \(v)"
        case let .bool(v): "\(v)"
        case let .int16(v): "int16 \(v)"
        case let .uint16(v): "uint16 \(v)"
        case let .int32(v): "int32 \(v)"
        case let .uint32(v): "uint32 \(v)"
        case let .int64(v): "int64 \(v)"
        case let .uint64(v): "uint64 \(v)"
        case let .double(v): "\(v)"
        case let .string(v): "\"\(v)\""
        case let .objectPath(v): "objpath \(v)"
        case let .signature(v): "signature \(v)"
        case let .unixFD(v): v.description
        case let .array(_, items): "[" + items.map(\.debugDescription).joined(separator: ", ") + "]"
        case let .dict(_, _, entries):
            "{" + entries.map { "\($0.key.debugDescription): \($0.value.debugDescription)" }.joined(separator: ", ") + "}"
        case let .structure(fields): "(" + fields.map(\.debugDescription).joined(separator: ", ") + ")"
        case let .variant(v): "<\(v.debugDescription)>"
        }
    }

    /// The value inside any variants.
    public var unwrapped: BusValue {
        if case .variant(let inner) = self { inner.unwrapped } else { self }
    }

    public var stringValue: String? { if case .string(let v) = unwrapped { v } else { nil } }
    public var boolValue: Bool? { if case .bool(let v) = unwrapped { v } else { nil } }
    /// Any integer type, as Int64 when it fits.
    public var integerValue: Int64? {
        switch unwrapped {
        case .byte(let v): Int64(v)
        case .int16(let v): Int64(v)
        case .uint16(let v): Int64(v)
        case .int32(let v): Int64(v)
        case .uint32(let v): Int64(v)
        case .int64(let v): v
        case .uint64(let v): Int64(exactly: v)
        default: nil
        }
    }

    /// An `a{sv}` (or any string-keyed dictionary) as Swift's, variants
    /// unwrapped; nil for any other value.
    public var dictionaryValue: [String: BusValue]? {
        guard case .dict("s", _, let entries) = unwrapped else { return nil }
        var out: [String: BusValue] = [:]
        for entry in entries {
            guard case .string(let key) = entry.key else { return nil }
            out[key] = entry.value.unwrapped
        }
        return out
    }
}

/// One entry of a ``BusValue/dict(keySignature:valueSignature:_:)``.
public struct BusDictEntry: Sendable, Equatable {
    public var key: BusValue
    public var value: BusValue
    public init(key: BusValue, value: BusValue) {
        self.key = key
        self.value = value
    }
}

/// An owned unix file descriptor carried in a D-Bus message (type `h`).
///
/// A descriptor received in a message is a fresh copy that belongs to the
/// receiver: this type closes it when the last reference goes away, unless
/// `take()` transferred ownership out first. When sending, libdbus `dup()`s
/// the descriptor, so the sender keeps (and eventually closes) its own copy.
public final class BusFileDescriptor: Sendable, CustomStringConvertible {
    // One atomic word: `take()` swaps in -1, so exactly one caller gets
    // the descriptor (and closes it), whichever thread asks first.
    private let storage: Atomic<Int32>

    /// Takes ownership of `fd` (it will be closed by this object).
    public init(owning fd: Int32) {
        storage = Atomic(fd)
    }

    /// The descriptor, still owned by this object (-1 after `take()` or `close()`).
    public var rawValue: Int32 { storage.load(ordering: .acquiring) }

    /// Transfers ownership to the caller, who must close the returned fd.
    public func take() -> Int32 {
        storage.exchange(-1, ordering: .acquiringAndReleasing)
    }

    /// Closes the descriptor now rather than at deinit.
    public func close() {
        let fd = take()
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    public var description: String { "fd(\(rawValue))" }

    deinit {
        close()
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
