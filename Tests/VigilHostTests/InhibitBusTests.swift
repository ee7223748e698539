import Foundation
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost
import VigilKit

/// The freedesktop inhibit bridge in process, on a private bus and the
/// manual clock (issue 16): each inhibit is a lease, ends on UnInhibit or
/// when its connection leaves, is capped by inhibit_max, and obeys the
/// allow/deny rules. Third-party clients (wakepy, gdbus) are in
/// Tests/EndToEndTests/InhibitEndToEndTests.swift.
@Suite struct InhibitBusTests {
    static let pm = InhibitBusNames.powerManagementInterface
    static let ss = InhibitBusNames.screenSaverInterface

    static func inhibitLeases(_ f: HostBusFixture) async -> [LeaseSnapshot] {
        await f.runtime.registry.active.filter { $0.strategy == ForeignInhibits.strategyName }
    }

    /// The first event for which `condition` holds, or nil after `timeout`.
    static func first(_ events: AsyncStream<LeaseEvent>, within timeout: Duration,
                      where condition: @escaping @Sendable (LeaseEvent) -> Bool) async -> LeaseEvent? {
        await VigilTestSupport.first(within: timeout) {
            for await event in events where condition(event) { return event }
            return nil
        }
    }

    static func dbusErrorName(_ body: () async throws -> Void) async -> String? {
        do { try await body() } catch let error as DBusError { return error.name } catch { return "\(error)" }
        return nil
    }

    @Test func inhibitsAreLeasesThatEndOnUnInhibitAndWhenTheAppLeaves() async throws {
        try await HostBusFixture.with(strategies: "") { f in
            let signals = try await f.record()
            // PowerManagement at the standard path: a lease holding sleep.
            let reply = try await f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "Inhibit", ["player", "playing music"])
            let cookie = try reply.argument(0, as: UInt32.self)
            var leases = await Self.inhibitLeases(f)
            try #require(leases.count == 1)
            #expect(leases[0].holds == "sleep" && leases[0].reason == "playing music")
            #expect(leases[0].client?.name == "player" && leases[0].client?.pid == UInt32(getpid()) && leases[0].client?.uid == getuid())
            #expect(leases[0].status["Interface"] == .string(Self.pm))
            #expect(leases[0].status["Executable"] == .string(try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")))
            #expect(try await f.call("/org/freedesktop/PowerManagement", Self.pm, "HasInhibit").argument(0, as: Bool.self))
            await signals.wait { $0.contains { $0.member == "HasInhibitChanged" && $0.body == [.bool(true)] } }
            // ScreenSaver at KDE's path: a lease holding idle. The lease
            // object says what it is.
            let idleCookie = try await f.call("/ScreenSaver", Self.ss, "Inhibit", ["slides", "presenting"]).argument(0, as: UInt32.self)
            leases = await Self.inhibitLeases(f)
            #expect(leases.map(\.holds).sorted() == ["idle", "sleep"])
            let idle = try #require(leases.first { $0.holds == "idle" })
            #expect(try await f.get(VigilAPI.leasePath(idle.id), VigilAPI.leaseInterface, "Kind") == .string("inhibit"))
            #expect(cookie != idleCookie)

            // Another connection cannot end them, with the same answer as for no such cookie.
            let other = try await f.bus.connect()
            let foreign = await Self.dbusErrorName {
                _ = try await other.call(destination: f.hostName, path: "/org/freedesktop/ScreenSaver", interface: Self.ss, member: "UnInhibit",
                                         arguments: [.uint32(idleCookie)])
            }
            let unknown = await Self.dbusErrorName {
                _ = try await other.call(destination: f.hostName, path: "/org/freedesktop/ScreenSaver", interface: Self.ss, member: "UnInhibit",
                                         arguments: [.uint32(idleCookie &+ 1)])
            }
            #expect(foreign == DBusError.Name.invalidArgs && unknown == DBusError.Name.invalidArgs)
            #expect(await Self.inhibitLeases(f).count == 2)

            // UnInhibit by its owner ends it.
            try await f.call("/org/freedesktop/ScreenSaver", Self.ss, "UnInhibit", [idleCookie])
            #expect(await Self.inhibitLeases(f).map(\.holds) == ["sleep"])

            // An app that leaves the bus: its inhibit ends (the driver's NameOwnerChanged).
            _ = try await other.call(destination: f.hostName, path: "/org/freedesktop/PowerManagement/Inhibit", interface: Self.pm,
                                     member: "Inhibit", arguments: [.string("leaver"), .string("")])
            #expect(await Self.inhibitLeases(f).count == 2)
            let events = await f.runtime.registry.events()
            await other.close()
            let ended = await Self.first(events, within: .seconds(10)) { $0.kind == .released && $0.lease.client?.name == "leaver" }
            #expect(ended?.detail == "the app left the bus")
            #expect(await Self.inhibitLeases(f).count == 1)

            try await f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "UnInhibit", [cookie])
            #expect(await Self.inhibitLeases(f).isEmpty)
            #expect(try await !f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "HasInhibit").argument(0, as: Bool.self))
            await signals.wait { $0.contains { $0.member == "HasInhibitChanged" && $0.body == [.bool(false)] } }
            // What vigild does not implement says so.
            let lock = await Self.dbusErrorName { try await f.call("/ScreenSaver", Self.ss, "Lock") }
            #expect(lock == DBusError.Name.notSupported)
        }
    }

    @Test func inhibitMaxExpiresAForgottenInhibitOnTheTestClock() async throws {
        try await HostBusFixture.with(strategies: "", host: "inhibit_max = \"10s\"\nclient_grace = \"2s\"") { f in
            let (log, task) = await observe(f.runtime.registry)
            defer { task.cancel() }
            try await f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "Inhibit", ["stuck-app", "forgot to uninhibit"])
            let lease = try #require(await Self.inhibitLeases(f).first)
            #expect(lease.budget == .seconds(10))
            // Each step once the registry sleeps until it: the budget's
            // end, then the grace's.
            try await f.waitForSleeper(within: 10)
            await f.advance(10)
            try await f.clock.settle(until: "the inhibit's lease is expiring, its grace on the clock or over") {
                let kinds = await log.kinds
                return kinds.contains(.expiring)
                    && (kinds.contains(.expired) || f.clock.sleeperCount(dueBy: f.clock.now + .seconds(2)) > 0)
            }
            await f.advance(2)
            try await f.clock.settle(until: "the inhibit's lease expired and the inhibit ended") {
                let (leases, kinds, held) = (await Self.inhibitLeases(f), await log.kinds, await f.runtime.inhibits.hasInhibit)
                return leases.isEmpty && kinds.contains(.expired) && !held
            }
            try await f.clock.settle(until: "the release is logged") {
                f.logs.entries.contains { $0.contains("inhibit by \"stuck-app\" reached inhibit_max (10s); releasing lease") }
            }
        }
    }

    @Test func deniedAppsGetAccessDeniedNamingTheRule() async throws {
        try await HostBusFixture.with(strategies: "", host: "inhibit_deny = [\"crypto*\"]") { f in
            do {
                try await f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "Inhibit", ["cryptominer", "mining"])
                Issue.record("the denied app got an inhibit")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.accessDenied)
                #expect(error.message.contains("denied by inhibit_deny pattern \"crypto*\""), "\(error.message)")
            }
            #expect(await Self.inhibitLeases(f).isEmpty)
            // Oversized arguments are refused naming the limit.
            let long = String(repeating: "a", count: 300)
            do {
                try await f.call("/org/freedesktop/PowerManagement/Inhibit", Self.pm, "Inhibit", [long, ""])
                Issue.record("a 300-byte app name was accepted")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.invalidArgs && error.message == "the application name has 300 bytes, over the limit of 256 bytes", "\(error.message)")
            }
        }
        try await HostBusFixture.with(strategies: "", host: "inhibit_allow = [\"mpv\"]") { f in
            try await f.call("/org/freedesktop/ScreenSaver", Self.ss, "Inhibit", ["mpv", "video"])
            let refused = await Self.dbusErrorName { try await f.call("/org/freedesktop/ScreenSaver", Self.ss, "Inhibit", ["vlc", "video"]) }
            #expect(refused == DBusError.Name.accessDenied)
            #expect(await Self.inhibitLeases(f).count == 1)
        }
    }

    @Test func thePortalBackendHoldsWhatTheFlagsSayUntilTheRequestIsClosed() async throws {
        try await HostBusFixture.with(strategies: "") { f in
            let signals = try await f.record()
            let handle = "/org/freedesktop/portal/desktop/request/1_42/t1"
            try await f.call(InhibitBusNames.portalPath, InhibitBusNames.portalInterface, "Inhibit", [
                try DBusObjectPath(handle), "org.example.Player", "", UInt32(4 | 8), ["reason": DBusVariant(.string("watching a film"))] as [String: DBusVariant],
            ])
            let lease = try #require(await Self.inhibitLeases(f).first)
            #expect(lease.holds == "sleep+idle" && lease.reason == "watching a film" && lease.client?.name == "org.example.Player")
            #expect(lease.status["Interface"] == .string(InhibitBusNames.portalInterface))
            // A monitor session reports a running session once.
            let session = "/org/freedesktop/portal/desktop/session/1_42/s1"
            let response = try await f.call(InhibitBusNames.portalPath, InhibitBusNames.portalInterface, "CreateMonitor", [
                try DBusObjectPath("/org/freedesktop/portal/desktop/request/1_42/t2"), try DBusObjectPath(session), "org.example.Player", "",
            ])
            #expect(try response.argument(0, as: UInt32.self) == 0)
            await signals.wait { $0.contains { $0.member == "StateChanged" } }
            try await f.call(InhibitBusNames.portalPath, InhibitBusNames.portalInterface, "QueryEndResponse", [try DBusObjectPath(session)])
            try await f.call(session, InhibitBusNames.sessionInterface, "Close")
            // Closing the request ends the inhibit and removes the object.
            try await f.call(handle, InhibitBusNames.requestInterface, "Close")
            #expect(await Self.inhibitLeases(f).isEmpty)
            let again = await Self.dbusErrorName { try await f.call(handle, InhibitBusNames.requestInterface, "Close") }
            #expect(again == DBusError.Name.unknownObject || again == DBusError.Name.unknownMethod, "\(again ?? "no error")")
            // Unknown flag bits are refused.
            let bad = await Self.dbusErrorName {
                try await f.call(InhibitBusNames.portalPath, InhibitBusNames.portalInterface, "Inhibit", [
                    try DBusObjectPath(handle + "x"), "app", "", UInt32(16), [:] as [String: DBusVariant],
                ])
            }
            #expect(bad == DBusError.Name.invalidArgs)
        }
    }

    @Test func aDesktopMayTakeTheNamesOverAndWhatWasGrantedStays() async throws {
        try await HostBusFixture.with(strategies: "") { f in
            try await f.call("/org/freedesktop/ScreenSaver", Self.ss, "Inhibit", ["mpv", "video"])
            let owner = try await f.client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                                member: "GetNameOwner", arguments: [InhibitBusNames.screenSaver], returning: String.self)
            #expect(owner == f.hostName)
            // A desktop's screensaver replaces vigild.
            let desktop = try await f.bus.connect()
            defer { Task { await desktop.close() } }
            try await desktop.requestName(InhibitBusNames.screenSaver, flags: [.replaceExisting, .doNotQueue])
            let now = try await f.client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                                              member: "GetNameOwner", arguments: [InhibitBusNames.screenSaver], returning: String.self)
            #expect(now == (await desktop.uniqueName))
            #expect(await Self.inhibitLeases(f).count == 1, "losing the name ended a granted inhibit")
        }
    }
}
