/// A Swift type whose values all have one D-Bus signature.
///
/// The one family of typed bus values: the contract's rows (``APIField``)
/// and the D-Bus library (VigilDBus: typed arguments, replies and
/// properties) both read and write Swift values through it.
public protocol BusTyped: Sendable {
    /// The signature every value of this type has (one complete type).
    static var busSignature: String { get }
}

/// A Swift type that can be written as one D-Bus complete type.
public protocol BusEncodable: BusTyped {
    /// This value as a `BusValue` (its signature is `Self.busSignature`).
    var busValue: BusValue { get }
}

/// A Swift type that can be read from one D-Bus value; a value of another
/// signature (or one its type refuses) throws, never traps.
public protocol BusDecodable: BusTyped {
    init(busValue: BusValue) throws(BusValueMismatch)
}

public typealias BusCodable = BusEncodable & BusDecodable

/// A value that is not what a ``BusDecodable`` type reads: another
/// signature, or a value its type refuses (an invalid object path). VigilDBus
/// answers it as `InvalidArgs`.
public struct BusValueMismatch: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }

    /// "expected a value of signature "s", got "u"".
    public init(expected: String, got value: BusValue) {
        description = "expected a value of signature \"\(expected)\", got \"\(value.signature)\""
    }
}

extension UInt8: BusCodable {
    public static var busSignature: String { "y" }
    public var busValue: BusValue { .byte(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .byte(v) = busValue else { throw BusValueMismatch(expected: "y", got: busValue) }
        self = v
    }
}

extension Bool: BusCodable {
    public static var busSignature: String { "b" }
    public var busValue: BusValue { .bool(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .bool(v) = busValue else { throw BusValueMismatch(expected: "b", got: busValue) }
        self = v
    }
}

extension Int16: BusCodable {
    public static var busSignature: String { "n" }
    public var busValue: BusValue { .int16(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .int16(v) = busValue else { throw BusValueMismatch(expected: "n", got: busValue) }
        self = v
    }
}

extension UInt16: BusCodable {
    public static var busSignature: String { "q" }
    public var busValue: BusValue { .uint16(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .uint16(v) = busValue else { throw BusValueMismatch(expected: "q", got: busValue) }
        self = v
    }
}

extension Int32: BusCodable {
    public static var busSignature: String { "i" }
    public var busValue: BusValue { .int32(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .int32(v) = busValue else { throw BusValueMismatch(expected: "i", got: busValue) }
        self = v
    }
}

extension UInt32: BusCodable {
    public static var busSignature: String { "u" }
    public var busValue: BusValue { .uint32(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .uint32(v) = busValue else { throw BusValueMismatch(expected: "u", got: busValue) }
        self = v
    }
}

extension Int64: BusCodable {
    public static var busSignature: String { "x" }
    public var busValue: BusValue { .int64(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .int64(v) = busValue else { throw BusValueMismatch(expected: "x", got: busValue) }
        self = v
    }
}

extension UInt64: BusCodable {
    public static var busSignature: String { "t" }
    public var busValue: BusValue { .uint64(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .uint64(v) = busValue else { throw BusValueMismatch(expected: "t", got: busValue) }
        self = v
    }
}

extension Double: BusCodable {
    public static var busSignature: String { "d" }
    public var busValue: BusValue { .double(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .double(v) = busValue else { throw BusValueMismatch(expected: "d", got: busValue) }
        self = v
    }
}

extension String: BusCodable {
    public static var busSignature: String { "s" }
    public var busValue: BusValue { .string(self) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .string(v) = busValue else { throw BusValueMismatch(expected: "s", got: busValue) }
        self = v
    }
}

extension BusFileDescriptor: BusCodable {
    public static var busSignature: String { "h" }
    public var busValue: BusValue { .unixFD(self) }
    /// Takes the descriptor out of the value (a descriptor has one owner:
    /// the value's copy is left closed, -1).
    public convenience init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .unixFD(fd) = busValue else { throw BusValueMismatch(expected: "h", got: busValue) }
        self.init(owning: fd.take())
    }
}

extension Array: BusTyped where Element: BusTyped {
    public static var busSignature: String { "a" + Element.busSignature }
}

extension Array: BusEncodable where Element: BusEncodable {
    // A closure, not `map(\.busValue)`: in this generic context the key
    // path is instantiated at run time on every call (_swift_getKeyPath),
    // which cost vigild about 5 µs a lease in InterfacesRemoved's list.
    public var busValue: BusValue { .array(elementSignature: Element.busSignature, map { $0.busValue }) }
}

extension Array: BusDecodable where Element: BusDecodable {
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .array(element, items) = busValue, element == Element.busSignature else {
            throw BusValueMismatch(expected: "a" + Element.busSignature, got: busValue)
        }
        var result: [Element] = []
        result.reserveCapacity(items.count)
        for item in items { result.append(try Element(busValue: item)) }
        self = result
    }
}

extension Dictionary: BusTyped where Key: BusTyped, Value: BusTyped {
    public static var busSignature: String { "a{" + Key.busSignature + Value.busSignature + "}" }
}

extension Dictionary: BusEncodable where Key: BusEncodable, Value: BusEncodable {
    public var busValue: BusValue {
        .dict(keySignature: Key.busSignature, valueSignature: Value.busSignature,
              map { BusDictEntry(key: $0.key.busValue, value: $0.value.busValue) })
    }
}

extension Dictionary: BusDecodable where Key: BusDecodable, Value: BusDecodable {
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .dict(key, value, entries) = busValue,
              key == Key.busSignature, value == Value.busSignature
        else { throw BusValueMismatch(expected: "a{" + Key.busSignature + Value.busSignature + "}", got: busValue) }
        var result: [Key: Value] = [:]
        for entry in entries {
            result[try Key(busValue: entry.key)] = try Value(busValue: entry.value)
        }
        self = result
    }
}
