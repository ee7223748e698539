import VigilAPI
import CDBusShim

/// A Swift type whose values all have one D-Bus signature.
public protocol DBusTyped: Sendable {
    /// The signature every value of this type has (one complete type).
    static var dbusSignature: String { get }
}

/// A Swift type that can be written as one D-Bus complete type.
public protocol DBusEncodable: DBusTyped {
    /// This value as a `BusValue` (its signature is `Self.dbusSignature`).
    var dbusValue: BusValue { get }
}

/// A Swift type that can be read from one D-Bus value; a value of another
/// signature throws `InvalidArgs`, never traps.
public protocol DBusDecodable: DBusTyped {
    init(dbusValue: BusValue) throws(DBusError)
}

public typealias DBusCodable = DBusEncodable & DBusDecodable

@usableFromInline
func signatureMismatch(_ expected: String, _ value: BusValue) -> DBusError {
    .invalidArgs("expected a value of signature \"\(expected)\", got \"\(value.signature)\"")
}

extension UInt8: DBusCodable {
    public static var dbusSignature: String { "y" }
    public var dbusValue: BusValue { .byte(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .byte(v) = dbusValue else { throw signatureMismatch("y", dbusValue) }
        self = v
    }
}

extension Bool: DBusCodable {
    public static var dbusSignature: String { "b" }
    public var dbusValue: BusValue { .bool(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .bool(v) = dbusValue else { throw signatureMismatch("b", dbusValue) }
        self = v
    }
}

extension Int16: DBusCodable {
    public static var dbusSignature: String { "n" }
    public var dbusValue: BusValue { .int16(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .int16(v) = dbusValue else { throw signatureMismatch("n", dbusValue) }
        self = v
    }
}

extension UInt16: DBusCodable {
    public static var dbusSignature: String { "q" }
    public var dbusValue: BusValue { .uint16(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .uint16(v) = dbusValue else { throw signatureMismatch("q", dbusValue) }
        self = v
    }
}

extension Int32: DBusCodable {
    public static var dbusSignature: String { "i" }
    public var dbusValue: BusValue { .int32(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .int32(v) = dbusValue else { throw signatureMismatch("i", dbusValue) }
        self = v
    }
}

extension UInt32: DBusCodable {
    public static var dbusSignature: String { "u" }
    public var dbusValue: BusValue { .uint32(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .uint32(v) = dbusValue else { throw signatureMismatch("u", dbusValue) }
        self = v
    }
}

extension Int64: DBusCodable {
    public static var dbusSignature: String { "x" }
    public var dbusValue: BusValue { .int64(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .int64(v) = dbusValue else { throw signatureMismatch("x", dbusValue) }
        self = v
    }
}

extension UInt64: DBusCodable {
    public static var dbusSignature: String { "t" }
    public var dbusValue: BusValue { .uint64(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .uint64(v) = dbusValue else { throw signatureMismatch("t", dbusValue) }
        self = v
    }
}

extension Double: DBusCodable {
    public static var dbusSignature: String { "d" }
    public var dbusValue: BusValue { .double(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .double(v) = dbusValue else { throw signatureMismatch("d", dbusValue) }
        self = v
    }
}

extension String: DBusCodable {
    public static var dbusSignature: String { "s" }
    public var dbusValue: BusValue { .string(self) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .string(v) = dbusValue else { throw signatureMismatch("s", dbusValue) }
        self = v
    }
}

extension BusFileDescriptor: DBusEncodable {
    public static var dbusSignature: String { "h" }
    public var dbusValue: BusValue { .unixFD(self) }
    /// Extracts the descriptor from a `h` value.
    public static func decode(_ value: BusValue) throws(DBusError) -> BusFileDescriptor {
        guard case let .unixFD(v) = value else { throw signatureMismatch("h", value) }
        return v
    }
}

/// A validated D-Bus object path (`o`).
public struct DBusObjectPath: DBusCodable, Hashable, Comparable, CustomStringConvertible {
    public let rawValue: String

    /// Fails with `InvalidArgs` when `rawValue` is not a valid object path.
    public init(_ rawValue: String) throws(DBusError) {
        guard Self.isValid(rawValue) else { throw .invalidArgs("\"\(ClientText.excerpt(rawValue))\" is not a valid object path") }
        self.rawValue = rawValue
    }

    /// True for "/", or "/" followed by non-empty elements of [A-Za-z0-9_]
    /// separated by single slashes, with no trailing slash.
    public static func isValid(_ path: String) -> Bool {
        DBusSignatureSyntax.checkCString(path) { cdbus_validate_path($0) }
    }

    public static var dbusSignature: String { "o" }
    public var dbusValue: BusValue { .objectPath(rawValue) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .objectPath(v) = dbusValue else { throw signatureMismatch("o", dbusValue) }
        try self.init(v)
    }
    public var description: String { rawValue }
    public static func < (lhs: DBusObjectPath, rhs: DBusObjectPath) -> Bool { lhs.rawValue < rhs.rawValue }

    /// True when `self` is `ancestor` or lies below it.
    public func isDescendant(ofOrEqualTo ancestor: DBusObjectPath) -> Bool {
        ancestor.rawValue == "/" || rawValue == ancestor.rawValue || rawValue.hasPrefix(ancestor.rawValue + "/")
    }
}

/// A D-Bus signature value (`g`).
public struct DBusSignature: DBusCodable, Hashable, CustomStringConvertible {
    public let rawValue: String
    public init(_ rawValue: String) throws(DBusError) {
        guard DBusSignatureSyntax.isValid(rawValue, singleCompleteType: false) else {
            throw .invalidArgs("\"\(ClientText.excerpt(rawValue))\" is not a valid signature")
        }
        self.rawValue = rawValue
    }
    public static var dbusSignature: String { "g" }
    public var dbusValue: BusValue { .signature(rawValue) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .signature(v) = dbusValue else { throw signatureMismatch("g", dbusValue) }
        try self.init(v)
    }
    public var description: String { rawValue }
}

/// A variant (`v`): any value together with its signature.
public struct DBusVariant: DBusCodable, Equatable, CustomStringConvertible {
    public var value: BusValue
    public init(_ value: BusValue) { self.value = value }
    public init(_ value: some DBusEncodable) { self.value = value.dbusValue }
    public static var dbusSignature: String { "v" }
    public var dbusValue: BusValue { .variant(value) }
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .variant(v) = dbusValue else { throw signatureMismatch("v", dbusValue) }
        value = v
    }
    /// Decodes the contained value as `T`.
    public func decode<T: DBusDecodable>(_ type: T.Type = T.self) throws(DBusError) -> T {
        try T(dbusValue: value)
    }
    public var description: String { "<\(value)>" }
}

extension Array: DBusTyped where Element: DBusTyped {
    public static var dbusSignature: String { "a" + Element.dbusSignature }
}

extension Array: DBusEncodable where Element: DBusEncodable {
    public var dbusValue: BusValue { .array(elementSignature: Element.dbusSignature, map(\.dbusValue)) }
}

extension Array: DBusDecodable where Element: DBusDecodable {
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .array(element, items) = dbusValue, element == Element.dbusSignature else {
            throw signatureMismatch("a" + Element.dbusSignature, dbusValue)
        }
        var result: [Element] = []
        result.reserveCapacity(items.count)
        for item in items { result.append(try Element(dbusValue: item)) }
        self = result
    }
}

extension Dictionary: DBusTyped where Key: DBusTyped, Value: DBusTyped {
    public static var dbusSignature: String { "a{" + Key.dbusSignature + Value.dbusSignature + "}" }
}

extension Dictionary: DBusEncodable where Key: DBusEncodable, Value: DBusEncodable {
    public var dbusValue: BusValue {
        .dict(keySignature: Key.dbusSignature, valueSignature: Value.dbusSignature,
              map { BusDictEntry(key: $0.key.dbusValue, value: $0.value.dbusValue) })
    }
}

extension Dictionary: DBusDecodable where Key: DBusDecodable, Value: DBusDecodable {
    public init(dbusValue: BusValue) throws(DBusError) {
        guard case let .dict(key, value, entries) = dbusValue,
              key == Key.dbusSignature, value == Value.dbusSignature
        else { throw signatureMismatch("a{" + Key.dbusSignature + Value.dbusSignature + "}", dbusValue) }
        var result: [Key: Value] = [:]
        for entry in entries {
            result[try Key(dbusValue: entry.key)] = try Value(dbusValue: entry.value)
        }
        self = result
    }
}

extension BusValue {
    /// Decodes this value as `T`, throwing `InvalidArgs` on a signature mismatch.
    public func decode<T: DBusDecodable>(_ type: T.Type = T.self) throws(DBusError) -> T {
        try T(dbusValue: self)
    }
}
