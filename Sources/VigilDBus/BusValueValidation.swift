@_exported import VigilAPI
import CDBusShim
import Glibc

/// What libdbus checks, in Swift first: a value it would abort on is an
/// error here instead.
extension BusValue {
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
