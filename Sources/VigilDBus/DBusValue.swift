import CDBusShim
import Glibc

/// One value of the D-Bus type system, with enough information to know its
/// exact signature (including the element type of an empty array).
///
/// Only the containers are `indirect` (boxed): a string or a number is held
/// inline, so building a value allocates nothing beyond its String or
/// Array storage. With the whole enum indirect, every string and number
/// of every message cost a heap box of its own.
public enum DBusValue: Sendable, Equatable, CustomStringConvertible {
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
    case unixFD(DBusFileDescriptor)
    /// An array whose elements all have `elementSignature` (one complete type).
    indirect case array(elementSignature: String, [DBusValue])
    /// A dictionary (`a{kv}`) kept in wire order; keys must be a basic type.
    indirect case dict(keySignature: String, valueSignature: String, [DBusDictEntry])
    case structure([DBusValue])
    indirect case variant(DBusValue)

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

    public static func == (lhs: DBusValue, rhs: DBusValue) -> Bool {
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

    public var description: String {
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
        case let .array(_, items): "[" + items.map(\.description).joined(separator: ", ") + "]"
        case let .dict(_, _, entries):
            "{" + entries.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        case let .structure(fields): "(" + fields.map(\.description).joined(separator: ", ") + ")"
        case let .variant(v): "<\(v)>"
        }
    }

    /// Checks everything libdbus would otherwise abort the process on:
    /// strings (UTF-8, no NUL), object paths, signatures, and that array and
    /// dictionary contents match their declared element signatures.
    public func validate() throws(DBusError) {
        try validate(depth: 0)
        // Only a container's signature can be too long or nested too deeply:
        // any other value's is one type code.
        switch self {
        case .array, .dict, .structure: break
        default: return
        }
        let sig = signature
        guard DBusSignatureSyntax.isValid(sig, singleCompleteType: true) else {
            throw .invalidArgs("value has an invalid signature \"\(sig)\" (too long or nested too deeply)")
        }
    }

    private func validate(depth: Int) throws(DBusError) {
        // The D-Bus specification limits total nesting to 64 (32 arrays + 32 structs).
        guard depth <= 64 else { throw .invalidArgs("value is nested more than 64 levels deep") }
        switch self {
        case .byte, .bool, .int16, .uint16, .int32, .uint32, .int64, .uint64, .double, .unixFD:
            return
        case let .string(text):
            guard DBusSignatureSyntax.isValidString(text) else {
                throw .invalidArgs("string is not valid D-Bus UTF-8 (it must not contain NUL characters)")
            }
        case let .objectPath(path):
            guard DBusObjectPath.isValid(path) else {
                throw .invalidArgs("\"\(path)\" is not a valid object path")
            }
        case let .signature(sig):
            guard DBusSignatureSyntax.isValid(sig, singleCompleteType: false) else {
                throw .invalidArgs("\"\(sig)\" is not a valid signature")
            }
        case let .array(element, items):
            guard DBusSignatureSyntax.isValid(element, singleCompleteType: true), !element.hasPrefix("{") else {
                throw .invalidArgs("\"\(element)\" is not a valid array element signature")
            }
            for item in items {
                guard item.signature == element else {
                    throw .invalidArgs("array of \"\(element)\" contains an element of signature \"\(item.signature)\"")
                }
                try item.validate(depth: depth + 1)
            }
        case let .dict(key, value, entries):
            guard DBusSignatureSyntax.isBasic(key) else {
                throw .invalidArgs("dictionary key signature \"\(key)\" is not a basic type")
            }
            guard DBusSignatureSyntax.isValid(value, singleCompleteType: true) else {
                throw .invalidArgs("\"\(value)\" is not a valid dictionary value signature")
            }
            for entry in entries {
                guard entry.key.signature == key, entry.value.signature == value else {
                    throw .invalidArgs("dictionary a{\(key)\(value)} contains an entry of signature {\(entry.key.signature)\(entry.value.signature)}")
                }
                try entry.key.validate(depth: depth + 2)
                try entry.value.validate(depth: depth + 2)
            }
        case let .structure(fields):
            guard !fields.isEmpty else { throw .invalidArgs("a struct must have at least one field") }
            for field in fields { try field.validate(depth: depth + 1) }
        case let .variant(inner):
            try inner.validate(depth: depth + 1)
        }
    }
}

/// One entry of a `DBusValue.dict`.
public struct DBusDictEntry: Sendable, Equatable {
    public var key: DBusValue
    public var value: DBusValue
    public init(key: DBusValue, value: DBusValue) {
        self.key = key
        self.value = value
    }
}

/// Syntax checks on signatures and names, done in Swift or through libdbus's
/// non-aborting validators.
public enum DBusSignatureSyntax {
    static let basicCodes: Set<Character> = ["y", "b", "n", "q", "i", "u", "x", "t", "d", "s", "o", "g", "h"]

    /// True when `signature` is valid; with `singleCompleteType`, exactly one complete type.
    public static func isValid(_ signature: String, singleCompleteType: Bool) -> Bool {
        guard signature.utf8.count <= 255, checkCString(signature, { cdbus_validate_signature($0) }) else { return false }
        guard singleCompleteType else { return true }
        var signature = signature
        return signature.withUTF8 { codes in
            !codes.isEmpty && endOfCompleteType(codes, from: 0, depth: 0) == codes.count
        }
    }

    /// True when `signature` is one basic type code.
    public static func isBasic(_ signature: String) -> Bool {
        signature.count == 1 && basicCodes.contains(signature.first!) // count == 1 proves first exists
    }

    private static let basicBytes: Set<UInt8> = Set(basicCodes.compactMap(\.asciiValue))

    /// Containers nest at most 64 deep (32 arrays and 32 structs in the
    /// specification); deeper is malformed, and the recursion stays bounded.
    private static func endOfCompleteType(_ codes: UnsafeBufferPointer<UInt8>, from start: Int, depth: Int) -> Int? {
        guard start < codes.count, depth <= 64 else { return nil }
        switch codes[start] {
        case UInt8(ascii: "a"):
            return endOfCompleteType(codes, from: start + 1, depth: depth + 1)
        case UInt8(ascii: "("), UInt8(ascii: "{"):
            let close = codes[start] == UInt8(ascii: "(") ? UInt8(ascii: ")") : UInt8(ascii: "}")
            var index = start + 1
            while index < codes.count, codes[index] != close {
                guard let end = endOfCompleteType(codes, from: index, depth: depth + 1) else { return nil }
                index = end
            }
            return index < codes.count ? index + 1 : nil
        case UInt8(ascii: "v"):
            return start + 1
        case let code where basicBytes.contains(code):
            return start + 1
        default:
            return nil
        }
    }

    /// True when `text` holds no NUL byte and libdbus's `validator` accepts
    /// it. The string is passed with `withCString`, which lends a native
    /// string's own NUL-terminated storage: an implicit String-to-pointer
    /// argument copies it into a new array on every call, and these run on
    /// every string of every outgoing value. A NUL inside would end the C
    /// string early, so the C length must be the whole UTF-8 length.
    static func checkCString(_ text: String, _ validator: (UnsafePointer<CChar>) -> Int32) -> Bool {
        text.withCString { pointer in
            strlen(pointer) == text.utf8.count && validator(pointer) == 1
        }
    }

    /// True when `text` can be sent as a D-Bus string.
    public static func isValidString(_ text: String) -> Bool {
        checkCString(text) { cdbus_validate_utf8($0) }
    }

    public static func isValidInterfaceName(_ name: String) -> Bool {
        checkCString(name) { cdbus_validate_interface($0) }
    }

    public static func isValidMemberName(_ name: String) -> Bool {
        checkCString(name) { cdbus_validate_member($0) }
    }

    public static func isValidBusName(_ name: String) -> Bool {
        checkCString(name) { cdbus_validate_bus_name($0) }
    }

    public static func isValidErrorName(_ name: String) -> Bool {
        checkCString(name) { cdbus_validate_error_name($0) }
    }
}
