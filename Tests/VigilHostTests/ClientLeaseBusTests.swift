import Foundation
import Testing
import VigilDBus
@testable import VigilHost
import VigilKit

/// BeginBackgroundTask and the lease objects it makes, from a Swift client
/// on a private bus, with the host on the manual clock (budgets in seconds
/// of test time). The python3-dbus client is in the end-to-end tests.
@Suite(.serialized) struct ClientLeaseBusTests {
    static let noStrategies = ""
    static let limits = """
        client_max_leases_per_uid = 2
        client_max_budget_per_uid = "10m"
        client_grace = "3s"
        """

    /// Calls BeginBackgroundTask from `connection` (the fixture's client by default).
    static func begin(_ f: HostBusFixture, on connection: DBusConnection? = nil, name: String = "backup",
                      reason: String = "nightly backup", budget seconds: UInt64) async throws -> (path: String, fd: BusFileDescriptor) {
        let reply = try await (connection ?? f.client).call(
            destination: f.hostName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface,
            member: "BeginBackgroundTask",
            arguments: [.string(name), .string(reason), .uint64(seconds * 1_000_000)], timeout: .seconds(10))
        #expect(reply.signature == "oh")
        guard reply.body.count == 2, case .objectPath(let path) = reply.body[0], case .unixFD(let fd) = reply.body[1] else {
            throw DBusError.failed("unexpected reply \(reply.body)")
        }
        return (path, fd)
    }

    static func leaseCall(_ f: HostBusFixture, _ path: String, _ member: String, _ arguments: [BusValue] = [],
                          on connection: DBusConnection? = nil) async throws -> DBusMessage {
        try await (connection ?? f.client).call(destination: f.hostName, path: path, interface: VigilAPI.clientLeaseInterface,
                                                member: member, arguments: arguments, timeout: .seconds(10))
    }

    static func dbusErrorName(_ body: () async throws -> Void) async -> String? {
        do { try await body(); return nil } catch let error as DBusError { return error.name } catch { return "\(error)" }
    }

    @Test func notRenewingGivesExpiringThenExpired() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            let lease = try await Self.begin(f, budget: 60)
            #expect(lease.path == "/org/vigil/Vigil1/Lease/1")
            #expect(lease.fd.rawValue >= 0)
            await signals.wait(for: 3)
            let owner = await f.client.uniqueName
            #expect(signals.descriptions() == [
                "InterfacesAdded \(lease.path)", "PropertiesChanged \(VigilAPI.rootPath) Leases",
                "LeaseAcquired \(lease.path) \"client\" \"background task \"backup\" of \(owner) (uid \(getuid()), pid \(getpid()))\"",
            ])
            let props = try await f.getAll(lease.path, VigilAPI.clientLeaseInterface)
            #expect(props["Owner"] == .string(owner))
            #expect(props["Uid"] == .uint32(getuid()))
            #expect(props["Pid"] == .uint32(UInt32(getpid())))
            #expect(props["Name"] == .string("backup"))
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Kind") == .string("client"))
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Reason") == .string("nightly backup"))

            await f.advance(59)
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "State") == .string("active"))
            await f.advance(1)
            await signals.wait(for: 6)
            #expect(signals.descriptions(from: 3) == [
                "PropertiesChanged \(lease.path) State", "LeaseExpiring \(lease.path) 3000000", "Expiring 3000000",
            ])
            #expect(signals.all.count > 5 && signals.all[5].interface == VigilAPI.clientLeaseInterface)
            // The client cannot renew once expiring; the lease still holds until the grace time ends.
            let renewError = await Self.dbusErrorName { _ = try await Self.leaseCall(f, lease.path, "Renew", [.uint64(60_000_000)]) }
            #expect(renewError == "org.vigil.Vigil1.Error.LeaseEnded")
            await f.advance(3)
            await signals.wait(for: 11)
            #expect(signals.descriptions(from: 6) == [
                "PropertiesChanged \(lease.path) State", "LeaseExpired \(lease.path) true", "Expired ",
                "InterfacesRemoved \(lease.path)", "PropertiesChanged \(VigilAPI.rootPath) Leases",
            ])
            #expect(await f.runtime.clientLeases.count == 0)
            // Renew on the ended lease: its object is gone.
            let gone = await Self.dbusErrorName { _ = try await Self.leaseCall(f, lease.path, "Renew", [.uint64(1_000_000)]) }
            #expect(gone == DBusError.Name.unknownObject || gone == DBusError.Name.unknownMethod)
        }
    }

    /// docs/dbus-api.md: End during the grace time is accepted and ends
    /// the expiring lease at once (Renew is refused then).
    @Test func endDuringTheGraceTimeEndsTheLease() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            let lease = try await Self.begin(f, budget: 60)
            await f.advance(60)
            await signals.wait { $0.contains { $0.member == "Expiring" } }
            #expect(await Self.dbusErrorName { _ = try await Self.leaseCall(f, lease.path, "End") } == nil)
            await signals.wait { $0.contains { $0.member == "LeaseReleased" } }
            #expect(signals.all.last { $0.member == "LeaseReleased" }?.body.last == .string("ended by the client"))
            #expect(!signals.all.contains { $0.member == "Expired" })
        }
    }

    @Test func renewingKeepsTheLeaseAndEndReleasesIt() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            let lease = try await Self.begin(f, budget: 60)
            for _ in 0..<5 {
                await f.advance(45)
                _ = try await Self.leaseCall(f, lease.path, "Renew", [.uint64(60_000_000)])
            }
            // 225 s in, far past the first budget: still active, renewed five times.
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "State") == .string("active"))
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Renewals") == .uint32(5))
            _ = try await Self.leaseCall(f, lease.path, "End")
            await signals.wait { $0.contains { $0.member == "LeaseReleased" } }
            #expect(signals.all.last { $0.member == "LeaseReleased" }?.body.last == .string("ended by the client"))
            #expect(!signals.all.contains { $0.member == "LeaseExpiring" || $0.member == "Expiring" })
            #expect(await f.runtime.registry.active.isEmpty)
            #expect(await f.runtime.clientLeases.count == 0)
        }
    }

    @Test func closingTheFdEndsTheLease() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            let lease = try await Self.begin(f, budget: 60)
            // A second copy keeps it alive; closing both ends it.
            let copy = try BusFileDescriptor(duplicating: lease.fd.rawValue)
            lease.fd.close()
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "State") == .string("active"))
            #expect(await f.runtime.registry.active.count == 1)
            copy.close()
            await signals.wait { $0.contains { $0.member == "LeaseReleased" } }
            #expect(signals.all.last { $0.member == "LeaseReleased" }?.body.last == .string("the client closed its lease fd"))
            #expect(await f.runtime.registry.active.isEmpty)
        }
    }

    @Test func anFdClosedAtOnceEndsTheLeaseAndTheHostGoesOn() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            for round in 1...3 {
                let lease = try await Self.begin(f, budget: 60)
                lease.fd.close()
                await signals.wait { $0.filter { $0.member == "LeaseReleased" }.count == round }
            }
            // The host still answers, and a new lease works.
            let lease = try await Self.begin(f, budget: 60)
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "State") == .string("active"))
        }
    }

    /// Every lease object shares one Lease and one ClientLease interface
    /// value: each object's properties and End still belong to its own
    /// lease, found by the object's path.
    @Test func eachLeaseObjectShowsAndEndsItsOwnLease() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let other = try await f.bus.connect()
            let a = try await Self.begin(f, name: "backup", reason: "nightly backup", budget: 60)
            let b = try await Self.begin(f, on: other, name: "sync", reason: "mail sync", budget: 120)
            #expect(a.path != b.path)
            for (lease, owner, name, reason) in [(a, await f.client.uniqueName, "backup", "nightly backup"),
                                                 (b, await other.uniqueName, "sync", "mail sync")] {
                let client = try await f.getAll(lease.path, VigilAPI.clientLeaseInterface)
                #expect(client["Owner"] == .string(owner))
                #expect(client["Name"] == .string(name))
                #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Reason") == .string(reason))
                #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Id")
                        == .uint64(UInt64(lease.path.split(separator: "/").last ?? "") ?? 0))
            }
            // End on b's object ends b, not a.
            _ = try await Self.leaseCall(f, b.path, "End", on: other)
            #expect(await f.runtime.registry.active.map(\.reason) == ["nightly backup"])
            #expect(try await f.get(a.path, VigilAPI.leaseInterface, "State") == .string("active"))
            let gone = await Self.dbusErrorName { _ = try await f.get(b.path, VigilAPI.leaseInterface, "State") }
            #expect(gone == "org.freedesktop.DBus.Error.UnknownObject")
            await other.close()
            withExtendedLifetime((a.fd, b.fd)) {}
        }
    }

    @Test func disconnectingEndsTheLease() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            let signals = try await f.record()
            let other = try await f.bus.connect()
            let lease = try await Self.begin(f, on: other, budget: 60)
            // The fd stays open here: only the disconnect can end the lease.
            await other.close()
            await signals.wait { $0.contains { $0.member == "LeaseReleased" } }
            #expect(signals.all.last { $0.member == "LeaseReleased" }?.body.last == .string("the client left the bus"))
            #expect(await f.runtime.registry.active.isEmpty)
            withExtendedLifetime(lease.fd) {}
        }
    }

    @Test func limitsAndBadArgumentsGetClearErrors() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: Self.limits) { f in
            func refusal(name: String = "x", _ budget: UInt64) async -> DBusError? {
                do {
                    _ = try await f.client.call(
                        destination: f.hostName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface,
                        member: "BeginBackgroundTask", arguments: [.string(name), .string(""), .uint64(budget)], timeout: .seconds(10))
                    return nil
                } catch let error as DBusError { return error } catch { return DBusError.failed("\(error)") }
            }
            let zero = await refusal(0)
            #expect(zero?.name == DBusError.Name.invalidArgs)
            #expect(zero?.message.contains("budget_usec must be greater than 0") == true)
            #expect(await refusal(name: " ", 1_000_000)?.name == DBusError.Name.invalidArgs)
            // Over the total budget at once (10 min).
            let tooLong = await refusal(11 * 60 * 1_000_000)
            #expect(tooLong?.name == "org.freedesktop.DBus.Error.LimitsExceeded")
            #expect(tooLong?.message.contains("client_max_budget_per_uid") == true)
            // Wrong argument types are refused by the declaration.
            do {
                _ = try await f.client.call(
                    destination: f.hostName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface,
                    member: "BeginBackgroundTask", arguments: [.string("x"), .string(""), .int32(-5)], timeout: .seconds(10))
                Issue.record("a negative int32 budget must be refused")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.invalidArgs)
            }

            let a = try await Self.begin(f, budget: 4 * 60)
            // Keep b's fd: dropping it would close it and end the lease.
            let b = try await Self.begin(f, budget: 4 * 60)
            let third = await refusal(60 * 1_000_000)
            #expect(third?.name == "org.freedesktop.DBus.Error.LimitsExceeded")
            #expect(third?.message.contains("already holds 2 client leases") == true)
            // Renewing past the total budget (4 + 7 > 10 min) is refused too, and the lease keeps its budget.
            let renew = await Self.dbusErrorName { _ = try await Self.leaseCall(f, a.path, "Renew", [.uint64(7 * 60 * 1_000_000)]) }
            #expect(renew == "org.freedesktop.DBus.Error.LimitsExceeded")
            let zeroRenew = await Self.dbusErrorName { _ = try await Self.leaseCall(f, a.path, "Renew", [.uint64(0)]) }
            #expect(zeroRenew == DBusError.Name.invalidArgs)
            #expect(try await f.get(a.path, VigilAPI.leaseInterface, "Renewals") == .uint32(0))
            // Ending one frees a slot.
            _ = try await Self.leaseCall(f, a.path, "End")
            let again = try await Self.begin(f, budget: 60)
            #expect(again.path == "/org/vigil/Vigil1/Lease/3")
            let endTwice = await Self.dbusErrorName { _ = try await Self.leaseCall(f, a.path, "End") }
            #expect(endTwice != nil)
            withExtendedLifetime(b.fd) {}
            withExtendedLifetime(again.fd) {}
        }
    }

    @Test func clientLeasesCanBeTurnedOff() async throws {
        try await HostBusFixture.with(strategies: Self.noStrategies, host: "client_leases = false") { f in
            do {
                _ = try await Self.begin(f, budget: 60)
                Issue.record("client leases are off")
            } catch let error as DBusError {
                #expect(error.name == "org.freedesktop.DBus.Error.LimitsExceeded")
                #expect(error.message.contains("client_leases = false"))
            }
        }
    }
}
