import VigilKit
import VigilDBus

/// Callers' uid and pid, by unique name, on one connection: asked of the bus
/// once (GetConnectionCredentials) and remembered until the name leaves the
/// bus. A unique name's credentials never change and the name is never
/// reused, so an entry is right for as long as it is kept.
///
/// Every handler that checks its caller (the Host, ClientLease and
/// strategy methods, the freedesktop inhibit bridge) asks this one cache.
/// A hit is a lock, not an actor hop, so checking a caller never waits
/// behind other calls.
final class CallerCredentials: Sendable {
    struct Entry: Sendable, Equatable {
        var uid: UInt32
        /// 0 when the bus did not say.
        var pid: UInt32
    }

    /// At most this many names are kept: a call racing its caller's
    /// departure can re-add a gone name, and the bound keeps such
    /// leftovers from piling up.
    static let capacity = 4096

    let connection: DBusConnection
    private let known = Lock<[String: Entry]>([:])

    init(connection: DBusConnection) {
        self.connection = connection
    }

    /// The credentials of `sender`, from the cache or the bus.
    func of(_ sender: String) async throws -> Entry {
        if let entry = cached(sender) { return entry }
        let reply = try await connection.call(
            destination: DBusConnection.busDriverName, path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "GetConnectionCredentials", arguments: [sender], returning: [String: DBusVariant].self)
        guard case .uint32(let uid)? = reply["UnixUserID"]?.value else {
            throw DBusError.failed("the bus did not tell the uid of \(ClientText.excerpt(sender))")
        }
        var pid: UInt32 = 0
        if case .uint32(let value)? = reply["ProcessID"]?.value { pid = value }
        let entry = Entry(uid: uid, pid: pid)
        remember(sender, entry)
        return entry
    }

    func cached(_ sender: String) -> Entry? {
        known.withLock { $0[sender] }
    }

    func remember(_ sender: String, _ entry: Entry) {
        known.withLock { known in
            if known.count >= Self.capacity, known[sender] == nil { known.removeAll() }
            known[sender] = entry
        }
    }

    /// Follows one `NameOwnerChanged`: when it really came from the bus
    /// driver and says a unique name lost its owner, the name's entry is
    /// dropped and the name returned. Anything else (a peer's forged copy,
    /// a well-known name changing hands) changes nothing and returns nil.
    @discardableResult
    func follow(nameOwnerChangedFrom sender: String?, body: [BusValue]) -> String? {
        guard let name = Self.vanishedName(sender: sender, body: body) else { return nil }
        known.withLock { _ = $0.removeValue(forKey: name) }
        return name
    }

    /// The unique name a `NameOwnerChanged` says left the bus, when the
    /// signal came from the bus driver itself; nil otherwise. A peer can
    /// send vigild a unicast copy naming someone else: the connection drops
    /// those, and this check is kept as well.
    static func vanishedName(sender: String?, body: [BusValue]) -> String? {
        guard sender == DBusConnection.busDriverName, body.count == 3, case .string(let name) = body[0],
              case .string(let newOwner) = body[2], name.hasPrefix(":"), newOwner.isEmpty else { return nil }
        return name
    }
}
