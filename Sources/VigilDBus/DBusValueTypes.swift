import VigilAPI
import CDBusShim

// The typed values themselves (`BusCodable`: the basic types, arrays and
// dictionaries) are VigilAPI's, shared with the contract's rows; here are
// the types that need libdbus to validate them, and the mapping of a
// mismatch to `InvalidArgs`.

extension DBusError {
    /// A value that is not what its type reads, as the D-Bus error a caller gets.
    public init(_ mismatch: BusValueMismatch) {
        self = .invalidArgs(mismatch.description)
    }
}

extension BusFileDescriptor {
    /// Extracts the descriptor from an `h` value (a descriptor owns its fd:
    /// it is taken from the value, not decoded as a copy).
    public static func decode(_ value: BusValue) throws(DBusError) -> BusFileDescriptor {
        guard case let .unixFD(v) = value else { throw DBusError(BusValueMismatch(expected: "h", got: value)) }
        return v
    }
}

/// A validated D-Bus object path (`o`).
public struct DBusObjectPath: BusCodable, Hashable, Comparable, CustomStringConvertible {
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

    public static var busSignature: String { "o" }
    public var busValue: BusValue { .objectPath(rawValue) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .objectPath(v) = busValue else { throw BusValueMismatch(expected: "o", got: busValue) }
        do { try self.init(v) } catch { throw BusValueMismatch(error.message) }
    }
    public var description: String { rawValue }
    public static func < (lhs: DBusObjectPath, rhs: DBusObjectPath) -> Bool { lhs.rawValue < rhs.rawValue }

    /// True when `self` is `ancestor` or lies below it.
    public func isDescendant(ofOrEqualTo ancestor: DBusObjectPath) -> Bool {
        ancestor.rawValue == "/" || rawValue == ancestor.rawValue || rawValue.hasPrefix(ancestor.rawValue + "/")
    }
}

/// A D-Bus signature value (`g`).
public struct DBusSignature: BusCodable, Hashable, CustomStringConvertible {
    public let rawValue: String
    public init(_ rawValue: String) throws(DBusError) {
        guard DBusSignatureSyntax.isValid(rawValue, singleCompleteType: false) else {
            throw .invalidArgs("\"\(ClientText.excerpt(rawValue))\" is not a valid signature")
        }
        self.rawValue = rawValue
    }
    public static var busSignature: String { "g" }
    public var busValue: BusValue { .signature(rawValue) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .signature(v) = busValue else { throw BusValueMismatch(expected: "g", got: busValue) }
        do { try self.init(v) } catch { throw BusValueMismatch(error.message) }
    }
    public var description: String { rawValue }
}

/// A variant (`v`): any value together with its signature.
public struct DBusVariant: BusCodable, Equatable, CustomStringConvertible {
    public var value: BusValue
    public init(_ value: BusValue) { self.value = value }
    public init(_ value: some BusEncodable) { self.value = value.busValue }
    public static var busSignature: String { "v" }
    public var busValue: BusValue { .variant(value) }
    public init(busValue: BusValue) throws(BusValueMismatch) {
        guard case let .variant(v) = busValue else { throw BusValueMismatch(expected: "v", got: busValue) }
        value = v
    }
    /// Decodes the contained value as `T`.
    public func decode<T: BusDecodable>(_ type: T.Type = T.self) throws(DBusError) -> T {
        try value.decode(type)
    }
    public var description: String { "<\(value)>" }
}

extension BusValue {
    /// Decodes this value as `T`, throwing `InvalidArgs` on a signature mismatch.
    public func decode<T: BusDecodable>(_ type: T.Type = T.self) throws(DBusError) -> T {
        do { return try T(busValue: self) } catch { throw DBusError(error) }
    }
}
