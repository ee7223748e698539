import VigilAPI
import CDBus
import CDBusShim
import Glibc

/// A D-Bus message read off the bus, with its body decoded into values.
public struct DBusMessage: Sendable {
    public enum Kind: Sendable, Equatable {
        case methodCall, methodReturn, error, signal
    }

    public var kind: Kind
    public var serial: UInt32
    public var replySerial: UInt32
    /// The sender's unique name (`:1.42`), set by the bus.
    public var sender: String?
    public var destination: String?
    public var path: String?
    public var interface: String?
    public var member: String?
    public var errorName: String?
    public var noReplyExpected: Bool
    public var body: [BusValue]

    /// The signature of the body (the concatenation of its values' signatures).
    public var signature: String { body.map(\.signature).joined() }

    /// For an error message: the error it carries (its first string argument
    /// is the message, by convention).
    public var error: DBusError? {
        guard kind == .error, let errorName else { return nil }
        if case let .string(text)? = body.first { return DBusError(name: errorName, message: text) }
        return DBusError(name: errorName, message: "")
    }

    /// Decodes body argument `index` as `T`; a missing argument or another
    /// signature throws `InvalidArgs`.
    public func argument<T: BusDecodable>(_ index: Int, as type: T.Type = T.self) throws(DBusError) -> T {
        guard body.indices.contains(index) else {
            throw .invalidArgs("expected an argument #\(index) of signature \"\(T.busSignature)\", the message has \(body.count)")
        }
        do { return try T(busValue: body[index]) } catch { throw DBusError(error) }
    }
}

/// A reference to a libdbus message.
///
/// `@unchecked Sendable`: libdbus reference counts messages atomically, and
/// a handle is only read (never modified) once it has been received or sent.
final class DBusMessageHandle: @unchecked Sendable {
    let raw: OpaquePointer

    /// Takes over one reference (from a `dbus_message_new*` call).
    init(owning raw: OpaquePointer) { self.raw = raw }

    /// Adds a reference to a message libdbus lends us.
    init(retaining raw: OpaquePointer) {
        dbus_message_ref(raw)
        self.raw = raw
    }

    deinit { dbus_message_unref(raw) }
}

// MARK: - Building messages (Swift → libdbus)

enum DBusMarshal {
    /// Appends `values` to `message`; validates first so libdbus never sees
    /// input it would abort on.
    static func append(_ values: [BusValue], to message: OpaquePointer) throws(DBusError) {
        for value in values { try value.validate() }
        try withIterator { (iter) throws(DBusError) in
            dbus_message_iter_init_append(message, iter)
            for value in values { try append(value, to: iter) }
        }
    }

    /// Runs `body` with a libdbus iterator on the stack: a malloc and free
    /// for each container was a visible share of building a signal.
    private static func withIterator<R>(_ body: (UnsafeMutablePointer<DBusMessageIter>) throws(DBusError) -> R) throws(DBusError) -> R {
        try withUnsafeTemporaryAllocation(of: DBusMessageIter.self, capacity: 1) { (buffer) throws(DBusError) -> R in
            // Capacity 1: the buffer has an address.
            guard let iter = buffer.baseAddress else { preconditionFailure("a temporary allocation of one iterator has no address") }
            return try body(iter)
        }
    }

    private static func appendBasic<T>(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ type: Int32, _ value: T) throws(DBusError) {
        var copy = value
        let ok = withUnsafePointer(to: &copy) { dbus_message_iter_append_basic(iter, type, $0) }
        guard ok != 0 else { throw DBusError(name: DBusError.Name.noMemory, message: "out of memory while building a message") }
    }

    private static func appendString(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ type: Int32, _ text: String) throws(DBusError) {
        // libdbus takes a pointer to the `const char *`, not the string itself.
        let ok = text.withCString { cString in
            var pointer: UnsafePointer<CChar>? = cString
            return withUnsafePointer(to: &pointer) { dbus_message_iter_append_basic(iter, type, $0) }
        }
        guard ok != 0 else { throw DBusError(name: DBusError.Name.noMemory, message: "out of memory while building a message") }
    }

    private static func container(
        _ iter: UnsafeMutablePointer<DBusMessageIter>, _ type: Int32, _ signature: String?,
        _ body: (UnsafeMutablePointer<DBusMessageIter>) throws(DBusError) -> Void
    ) throws(DBusError) {
        try withIterator { (sub) throws(DBusError) in
            let opened: UInt32
            if let signature {
                opened = signature.withCString { dbus_message_iter_open_container(iter, type, $0, sub) }
            } else {
                opened = dbus_message_iter_open_container(iter, type, nil, sub)
            }
            guard opened != 0 else { throw DBusError(name: DBusError.Name.noMemory, message: "out of memory while building a message") }
            do throws(DBusError) {
                try body(sub)
            } catch {
                dbus_message_iter_abandon_container(iter, sub)
                throw error
            }
            guard dbus_message_iter_close_container(iter, sub) != 0 else {
                throw DBusError(name: DBusError.Name.noMemory, message: "out of memory while building a message")
            }
        }
    }

    private static func append(_ value: BusValue, to iter: UnsafeMutablePointer<DBusMessageIter>) throws(DBusError) {
        switch value {
        case let .byte(v): try appendBasic(iter, CDBUS_TYPE_BYTE, v)
        case let .bool(v): try appendBasic(iter, CDBUS_TYPE_BOOLEAN, dbus_bool_t(v ? 1 : 0))
        case let .int16(v): try appendBasic(iter, CDBUS_TYPE_INT16, v)
        case let .uint16(v): try appendBasic(iter, CDBUS_TYPE_UINT16, v)
        case let .int32(v): try appendBasic(iter, CDBUS_TYPE_INT32, v)
        case let .uint32(v): try appendBasic(iter, CDBUS_TYPE_UINT32, v)
        case let .int64(v): try appendBasic(iter, CDBUS_TYPE_INT64, v)
        case let .uint64(v): try appendBasic(iter, CDBUS_TYPE_UINT64, v)
        case let .double(v): try appendBasic(iter, CDBUS_TYPE_DOUBLE, v)
        case let .string(v): try appendString(iter, CDBUS_TYPE_STRING, v)
        case let .objectPath(v): try appendString(iter, CDBUS_TYPE_OBJECT_PATH, v)
        case let .signature(v): try appendString(iter, CDBUS_TYPE_SIGNATURE, v)
        case let .unixFD(fd):
            let raw = fd.rawValue
            guard raw >= 0 else { throw .invalidArgs("cannot send a file descriptor that was already closed or taken") }
            // libdbus dup()s the descriptor; `fd` keeps ownership of the original.
            errno = 0
            do throws(DBusError) {
                try appendBasic(iter, CDBUS_TYPE_UNIX_FD, raw)
            } catch {
                // The dup fails with EMFILE when this process has no
                // descriptors left: not a lack of memory, and the caller
                // should hear which limit it met.
                let code = errno
                guard code == EMFILE || code == ENFILE else { throw error }
                var limit = rlimit()
                let soft = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? String(limit.rlim_cur) : "?"
                throw .limitsExceeded("cannot pass a file descriptor: this process has no file descriptors left (\(String(cString: strerror(code))); RLIMIT_NOFILE = \(soft); a service's LimitNOFILE=)")
            }
        case let .array(element, items):
            try container(iter, CDBUS_TYPE_ARRAY, element) { (sub) throws(DBusError) in
                for item in items { try append(item, to: sub) }
            }
        case let .dict(key, valueSignature, entries):
            try container(iter, CDBUS_TYPE_ARRAY, "{" + key + valueSignature + "}") { (sub) throws(DBusError) in
                for entry in entries {
                    try container(sub, CDBUS_TYPE_DICT_ENTRY, nil) { (pair) throws(DBusError) in
                        try append(entry.key, to: pair)
                        try append(entry.value, to: pair)
                    }
                }
            }
        case let .structure(fields):
            try container(iter, CDBUS_TYPE_STRUCT, nil) { (sub) throws(DBusError) in
                for field in fields { try append(field, to: sub) }
            }
        case let .variant(inner):
            try container(iter, CDBUS_TYPE_VARIANT, inner.signature) { (sub) throws(DBusError) in
                try append(inner, to: sub)
            }
        }
    }

    // MARK: - Reading messages (libdbus → Swift)

    /// Decodes a received libdbus message.
    static func decode(_ message: OpaquePointer) throws(DBusError) -> DBusMessage {
        var decoded = decodeHeader(message)
        decoded.body = try decodeBody(message)
        return decoded
    }

    /// The header fields only, with an empty body: the body of a call is
    /// decoded once its signature (`dbus_message_get_signature`) is known
    /// to be the declared one, so a huge body of another type costs nothing.
    static func decodeHeader(_ message: OpaquePointer) -> DBusMessage {
        let kind: DBusMessage.Kind
        switch dbus_message_get_type(message) {
        case CDBUS_MESSAGE_TYPE_METHOD_CALL: kind = .methodCall
        case CDBUS_MESSAGE_TYPE_METHOD_RETURN: kind = .methodReturn
        case CDBUS_MESSAGE_TYPE_ERROR: kind = .error
        default: kind = .signal
        }
        func string(_ pointer: UnsafePointer<CChar>?) -> String? { pointer.map { String(cString: $0) } }
        return DBusMessage(
            kind: kind,
            serial: dbus_message_get_serial(message),
            replySerial: dbus_message_get_reply_serial(message),
            sender: string(dbus_message_get_sender(message)),
            destination: string(dbus_message_get_destination(message)),
            path: string(dbus_message_get_path(message)),
            interface: string(dbus_message_get_interface(message)),
            member: string(dbus_message_get_member(message)),
            errorName: string(dbus_message_get_error_name(message)),
            noReplyExpected: dbus_message_get_no_reply(message) != 0,
            body: []
        )
    }

    /// The signature of a message's body, read from its header.
    static func signature(of message: OpaquePointer) -> String {
        dbus_message_get_signature(message).map { String(cString: $0) } ?? ""
    }

    /// Decodes the body; `maximumValues` bounds how many values (arguments,
    /// elements, entries, bytes) it may hold, so a call of the declared
    /// signature but a huge body is refused before it is turned into values.
    static func decodeBody(_ message: OpaquePointer, maximumValues: Int = .max) throws(DBusError) -> [BusValue] {
        try withIterator { (iter) throws(DBusError) in
            guard dbus_message_iter_init(message, iter) != 0 else { return [] }
            var budget = DecodeBudget(limit: maximumValues)
            return try readAll(iter, &budget)
        }
    }

    /// How many more values a body may hold.
    private struct DecodeBudget {
        let limit: Int
        var remaining: Int
        init(limit: Int) {
            self.limit = limit
            remaining = limit
        }

        mutating func take(_ count: Int) throws(DBusError) {
            guard count <= remaining else {
                throw .invalidArgs("the call carries more than \(limit) values (arguments, elements, entries and bytes), the most accepted")
            }
            remaining -= count
        }
    }

    private static func readAll(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ budget: inout DecodeBudget) throws(DBusError) -> [BusValue] {
        var values: [BusValue] = []
        while dbus_message_iter_get_arg_type(iter) != CDBUS_TYPE_INVALID {
            values.append(try read(iter, &budget))
            dbus_message_iter_next(iter)
        }
        return values
    }

    private static func basic<T>(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ initial: T) -> T {
        var value = initial
        withUnsafeMutablePointer(to: &value) { dbus_message_iter_get_basic(iter, $0) }
        return value
    }

    private static func currentSignature(_ iter: UnsafeMutablePointer<DBusMessageIter>) -> String {
        guard let raw = dbus_message_iter_get_signature(iter) else { return "" }
        defer { dbus_free(raw) }
        return String(cString: raw)
    }

    private static func read(_ iter: UnsafeMutablePointer<DBusMessageIter>, _ budget: inout DecodeBudget) throws(DBusError) -> BusValue {
        let type = dbus_message_iter_get_arg_type(iter)
        try budget.take(1)
        switch type {
        case CDBUS_TYPE_BYTE: return .byte(basic(iter, UInt8(0)))
        case CDBUS_TYPE_BOOLEAN: return .bool(basic(iter, dbus_bool_t(0)) != 0)
        case CDBUS_TYPE_INT16: return .int16(basic(iter, Int16(0)))
        case CDBUS_TYPE_UINT16: return .uint16(basic(iter, UInt16(0)))
        case CDBUS_TYPE_INT32: return .int32(basic(iter, Int32(0)))
        case CDBUS_TYPE_UINT32: return .uint32(basic(iter, UInt32(0)))
        case CDBUS_TYPE_INT64: return .int64(basic(iter, Int64(0)))
        case CDBUS_TYPE_UINT64: return .uint64(basic(iter, UInt64(0)))
        case CDBUS_TYPE_DOUBLE: return .double(basic(iter, Double(0)))
        case CDBUS_TYPE_STRING, CDBUS_TYPE_OBJECT_PATH, CDBUS_TYPE_SIGNATURE:
            let pointer = basic(iter, UnsafePointer<CChar>?.none)
            let text = pointer.map { String(cString: $0) } ?? ""
            if type == CDBUS_TYPE_STRING { return .string(text) }
            return type == CDBUS_TYPE_OBJECT_PATH ? .objectPath(text) : .signature(text)
        case CDBUS_TYPE_UNIX_FD:
            // libdbus hands out a dup() of the received descriptor: ours to close.
            let fd = basic(iter, Int32(-1))
            guard fd >= 0 else { throw .failed("could not read a file descriptor from the message") }
            return .unixFD(BusFileDescriptor(owning: fd))
        case CDBUS_TYPE_ARRAY:
            let signature = currentSignature(iter)
            let element = String(signature.dropFirst())
            let sub = UnsafeMutablePointer<DBusMessageIter>.allocate(capacity: 1)
            defer { sub.deallocate() }
            dbus_message_iter_recurse(iter, sub)
            if element == "y" {
                // Fast path for byte arrays: one copy instead of one value per byte.
                var bytes: UnsafeMutableRawPointer? = nil
                var count: Int32 = 0
                dbus_message_iter_get_fixed_array(sub, &bytes, &count)
                try budget.take(Int(count))
                let buffer = UnsafeRawBufferPointer(start: bytes, count: Int(count))
                return .array(elementSignature: "y", buffer.map { BusValue.byte($0) })
            }
            if element.hasPrefix("{") {
                let inner = Array(element.dropFirst().dropLast())
                let key = String(inner.prefix(1))
                let value = String(inner.dropFirst())
                var entries: [BusDictEntry] = []
                let pair = UnsafeMutablePointer<DBusMessageIter>.allocate(capacity: 1)
                defer { pair.deallocate() }
                while dbus_message_iter_get_arg_type(sub) == CDBUS_TYPE_DICT_ENTRY {
                    dbus_message_iter_recurse(sub, pair)
                    let k = try read(pair, &budget)
                    dbus_message_iter_next(pair)
                    let v = try read(pair, &budget)
                    entries.append(BusDictEntry(key: k, value: v))
                    dbus_message_iter_next(sub)
                }
                return .dict(keySignature: key, valueSignature: value, entries)
            }
            return .array(elementSignature: element, try readAll(sub, &budget))
        case CDBUS_TYPE_STRUCT:
            let sub = UnsafeMutablePointer<DBusMessageIter>.allocate(capacity: 1)
            defer { sub.deallocate() }
            dbus_message_iter_recurse(iter, sub)
            return .structure(try readAll(sub, &budget))
        case CDBUS_TYPE_VARIANT:
            let sub = UnsafeMutablePointer<DBusMessageIter>.allocate(capacity: 1)
            defer { sub.deallocate() }
            dbus_message_iter_recurse(iter, sub)
            return .variant(try read(sub, &budget))
        default:
            throw .failed("unexpected type code \(type) in a received message")
        }
    }
}
