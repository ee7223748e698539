import VigilAPI
import CDBus
import CDBusShim

/// A reply body marshalled once and sent to every caller until it changes:
/// a large read (a list of a thousand rows) costs a copy per call, not an
/// encoding. Declare the method with `DBusMethod.prepared(name, out:) { call in ... }`.
///
/// `@unchecked Sendable`: `template` is never modified after `init`; replies
/// are made with `dbus_message_copy`, which only reads it.
public final class DBusPreparedBody: @unchecked Sendable {
    /// The values, for callers that want them rather than the wire form.
    public let values: [BusValue]
    public let signature: String
    private let template: DBusMessageHandle

    public init(_ values: [BusValue]) throws(DBusError) {
        guard let raw = dbus_message_new(CDBUS_MESSAGE_TYPE_METHOD_RETURN) else { throw .failed("cannot allocate a message") }
        let template = DBusMessageHandle(owning: raw)
        try DBusMarshal.append(values, to: raw)
        self.template = template
        self.values = values
        self.signature = values.map(\.signature).joined()
    }

    /// A method return for `call` carrying this body.
    func reply(to call: DBusMessageHandle) -> DBusMessageHandle? {
        guard let copy = dbus_message_copy(template.raw) else { return nil }
        let reply = DBusMessageHandle(owning: copy)
        dbus_message_set_no_reply(copy, 1)
        guard dbus_message_set_reply_serial(copy, dbus_message_get_serial(call.raw)) != 0 else { return nil }
        if let sender = dbus_message_get_sender(call.raw), dbus_message_set_destination(copy, sender) == 0 { return nil }
        return reply
    }
}
