import VigilDBus
import VigilKit

extension ClientLeaseError {
    var dbusError: DBusError { DBusError(name: dbusName, message: description) }
}

extension HostBusAPI {
    nonisolated func beginBackgroundTask(_ call: DBusMethodCall, name: String, reason: String,
                                         budget: UInt64) async throws -> BusTuple<ObjectPath, BusFileDescriptor> {
        do {
            try ClientInputLimit.leaseName.check(name)
            try ClientInputLimit.leaseReason.check(reason)
        } catch {
            throw DBusError(name: error.name, message: error.message)
        }
        let caller = try await credentials.of(call.sender)
        let identity = ClientIdentity(owner: call.sender, uid: caller.uid, pid: caller.pid, name: name)
        let granted: (lease: LeaseSnapshot, fd: Int32)
        do {
            granted = try await parts.clientLeases.begin(identity, reason: reason, budgetMicros: budget)
        } catch {
            if error.code == .outOfDescriptors, DescriptorLimit.firstExhaustion() {
                log.error("refusing client leases: \(error.description) (logged once)")
            }
            throw error.dbusError
        }
        // libdbus duplicates the fd into the reply; this copy closes with
        // the value, so only the client's copies keep the lease's pipe open.
        let fd = BusFileDescriptor(owning: granted.fd)
        // The reply names the lease object: it must exist first, so the
        // client can call End or Renew at once. The registry's observer
        // (``showClientLeaseEvent(_:)``) queued its export on the connection
        // as the lease began, ahead of this reply.
        return BusTuple(ObjectPath(VigilAPI.leasePath(granted.lease.id)), fd)
    }

    nonisolated func endClientLease(_ id: LeaseID, _ call: DBusMethodCall) async throws {
        let privileged = try await callerIsPrivileged(call)
        do {
            try await parts.clientLeases.endByClient(id, caller: call.sender, privileged: privileged)
        } catch {
            throw error.dbusError
        }
    }

    nonisolated func renewClientLease(_ id: LeaseID, _ call: DBusMethodCall, budgetMicros: UInt64) async throws {
        let privileged = try await callerIsPrivileged(call)
        do {
            let renewed = try await parts.clientLeases.renew(id, caller: call.sender, privileged: privileged, budgetMicros: budgetMicros)
            // Shown before the reply: a client that reads the lease after
            // Renew returned sees the renewal.
            showRenewal(renewed, on: nil)
        } catch {
            throw error.dbusError
        }
    }

    /// Root and vigild's own uid may end or renew any client's lease.
    private nonisolated func callerIsPrivileged(_ call: DBusMethodCall) async throws -> Bool {
        let uid = try await credentials.of(call.sender).uid
        return Self.mayMutate(callerUID: uid, hostUID: hostUID)
    }

    /// Follows the bus's NameOwnerChanged: a unique name that lost its
    /// owner is a client that left, and its leases end. Only the bus
    /// driver's own signal counts: a peer can send vigild a unicast copy
    /// naming someone else (the connection drops those; checked here too).
    func followDisconnects() async throws -> Task<Void, Never> {
        let changes = try await connection.signals(matching: DBusMatchRule(
            sender: DBusConnection.busDriverName, path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        let clientLeases = parts.clientLeases
        let credentials = self.credentials
        // Unstructured task: returned; HostBusAPI keeps it in `followers`, cancelled by its stop()
        // (or deinit).
        return Task { [weak self] in
            for await message in changes {
                guard let name = credentials.follow(nameOwnerChangedFrom: message.sender, body: message.body) else { continue }
                await clientLeases.ownerVanished(name)
                await self?.inhibitorVanished(name)
            }
        }
    }
}
