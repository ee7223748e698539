// D-Bus value decoding (Sources/VigilDBus/DBusMessage.swift): any bytes
// libdbus accepts as a message (dbus_message_demarshal) are read as the
// object server reads a call, header then body under its value budget;
// every value is then checked, described, encoded again and decoded again,
// which must give the same values.
import CDBus
@testable import VigilDBus

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDBusMessage(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    var error = CDBus.DBusError()
    dbus_error_init(&error)
    defer { dbus_error_free(&error) }
    let message = data.withMemoryRebound(to: CChar.self, capacity: size) { dbus_message_demarshal($0, Int32(clamping: size), &error) }
    guard let message else { return 0 }
    defer { dbus_message_unref(message) }
    let header = DBusMarshal.decodeHeader(message)
    _ = DBusMarshal.signature(of: message)
    let body: [BusValue]
    do {
        body = try DBusMarshal.decodeBody(message, maximumValues: DBusObjectServer.maximumCallValues)
    } catch {
        _ = error.message
        return 0
    }
    for value in body {
        _ = value.description
        _ = try? value.validate()
        _ = try? DBusVariant(busValue: value)
    }
    var full = header
    full.body = body
    _ = full.error
    // A value read from a message is one libdbus accepted: it encodes again
    // unchanged (unix fds aside: they are not in the bytes).
    guard !body.contains(where: { $0.signature.contains("h") }) else { return 0 }
    guard let copy = dbus_message_new_method_call(nil, "/", nil, "Fuzz") else { return 0 }
    defer { dbus_message_unref(copy) }
    do {
        try DBusMarshal.append(body, to: copy)
        let again = try DBusMarshal.decodeBody(copy)
        if again != body { fatalError("re-encoding changed the values: \(body) became \(again)") }
    } catch {
        fatalError("values libdbus read could not be written again: \(error)")
    }
    return 0
}
