import VigilDBus
import VigilKit

extension ClientLeaseError {
    var dbusError: DBusError { DBusError(name: dbusName, message: description) }
}

extension HostBusAPI {
    func beginBackgroundTask(_ call: DBusMethodCall) async throws -> [DBusValue] {
        let name = try call.argument(0, as: String.self)
        let reason = try call.argument(1, as: String.self)
        let budget = try call.argument(2, as: UInt64.self)
        do {
            try ClientInputLimit.leaseName.check(name)
            try ClientInputLimit.leaseReason.check(reason)
        } catch {
            throw DBusError(name: error.name, message: error.message)
        }
        let (uid, pid) = try await credentials(of: call)
        let identity = ClientIdentity(owner: call.sender, uid: uid, pid: pid, name: name)
        let granted: (id: LeaseID, fd: Int32)
        do {
            granted = try await runtime.clientLeases.begin(identity, reason: reason, budgetMicros: budget)
        } catch {
            throw error.dbusError
        }
        // libdbus duplicates the fd into the reply; this copy closes with
        // the value, so only the client's copies keep the lease's pipe open.
        let fd = DBusFileDescriptor(owning: granted.fd)
        // The reply names the lease object: make sure it exists first, so the
        // client can call End or Renew at once.
        await waitUntilShown(granted.id)
        return [.objectPath(HostBusNames.leasePath(granted.id)), .unixFD(fd)]
    }

    func endClientLease(_ id: LeaseID, _ call: DBusMethodCall) async throws {
        let privileged = try await callerIsPrivileged(call)
        do {
            try await runtime.clientLeases.endByClient(id, caller: call.sender, privileged: privileged)
        } catch {
            throw error.dbusError
        }
    }

    func renewClientLease(_ id: LeaseID, _ call: DBusMethodCall, budgetMicros: UInt64) async throws {
        let privileged = try await callerIsPrivileged(call)
        do {
            try await runtime.clientLeases.renew(id, caller: call.sender, privileged: privileged, budgetMicros: budgetMicros)
        } catch {
            throw error.dbusError
        }
    }

    /// Root and vigild's own uid may end or renew any client's lease.
    private func callerIsPrivileged(_ call: DBusMethodCall) async throws -> Bool {
        let (uid, _) = try await credentials(of: call)
        return Self.mayMutate(callerUID: uid, hostUID: hostUID)
    }

    /// The caller's uid and pid (0: unknown), asked of the bus once per
    /// connection (GetConnectionCredentials) and remembered until it leaves
    /// the bus: a unique name's credentials never change and the name is
    /// never reused.
    func credentials(of call: DBusMethodCall) async throws -> (uid: UInt32, pid: UInt32) {
        if let known = knownCredentials[call.sender] { return known }
        let reply = try await call.connection.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "GetConnectionCredentials", arguments: [call.sender], returning: [String: DBusVariant].self)
        guard case .uint32(let uid)? = reply["UnixUserID"]?.value else {
            throw DBusError.failed("the bus did not tell the uid of \(call.sender)")
        }
        var pid: UInt32 = 0
        if case .uint32(let value)? = reply["ProcessID"]?.value { pid = value }
        // A call racing its caller's departure can re-add a gone name; the
        // bound keeps such leftovers from piling up.
        if knownCredentials.count >= 4096 { knownCredentials.removeAll() }
        knownCredentials[call.sender] = (uid, pid)
        return (uid, pid)
    }

    /// Follows the bus's NameOwnerChanged: a unique name that lost its
    /// owner is a client that left, and its leases end. Only the bus
    /// driver's own signal counts: a peer can send vigild a unicast copy
    /// naming someone else (the connection drops those; checked here too).
    func followDisconnects() async throws -> Task<Void, Never> {
        let changes = try await connection.signals(matching: DBusMatchRule(
            sender: DBusConnection.busDriverName, path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        let clientLeases = runtime.clientLeases
        return Task { [weak self] in
            for await message in changes {
                guard message.sender == DBusConnection.busDriverName, message.body.count == 3, case .string(let name) = message.body[0],
                      case .string(let newOwner) = message.body[2],
                      name.hasPrefix(":"), newOwner.isEmpty else { continue }
                await self?.forgetCredentials(of: name)
                await clientLeases.ownerVanished(name)
                await self?.inhibitorVanished(name)
            }
        }
    }
}
