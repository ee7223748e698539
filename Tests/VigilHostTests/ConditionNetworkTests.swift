import Foundation
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// A network namespace deleted when the value goes away.
final class NetworkNamespace: @unchecked Sendable {
    // Invariant: `name` never changes.
    let name = "vigil-cond-" + String(UUID().uuidString.prefix(8)).lowercased()
    var path: String { "/run/netns/" + name }

    init() throws {
        try ip(["netns", "add", name])
    }

    deinit { _ = try? Self.run(["netns", "del", name]) }

    func ip(_ arguments: [String]) throws {
        let out = try Self.run(arguments)
        guard out.status == 0 else { throw DescribedError("ip \(arguments.joined(separator: " ")): \(out.stderr)") }
    }

    /// The namespace's only link: a veth pair (this kernel has no dummy
    /// links), v0 with an address, v1 up; v0 stays down.
    func addLink() throws {
        try inside(["link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        try inside(["addr", "add", "10.99.0.1/24", "dev", "v0"])
        try inside(["link", "set", "v1", "up"])
    }

    /// `ip -n <this namespace> ...`
    func inside(_ arguments: [String]) throws { try ip(["-n", name] + arguments) }

    static func run(_ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/sbin/ip", arguments, environment: ["PATH": "/usr/sbin:/usr/bin:/bin"])
    }
}

/// `network = "online"` from rtnetlink, inside a network namespace the test
/// makes: its only link is a veth pair (this kernel has no dummy links),
/// with an address on one end.
@Suite struct ConditionNetworkTests {
    @Test func takingTheOnlyLinkDownStopsAnOnlineStrategyAndUpStartsIt() async throws {
        let ns = try NetworkNamespace()
        try ns.addLink()

        let host = try GatedSupervisor(settings: ConditionMonitor.Settings(networkNamespace: ns.path))
        let status = await host.start("sync", StrategyConditions(tables: [[.network(.online)]]))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "network = \"online\"")

        try ns.inside(["link", "set", "v0", "up"])
        try await status.next(.running)
        try ns.inside(["link", "set", "v0", "down"])
        try await status.next(.waiting)
        #expect(await host.activeLeases(of: "sync") == 0)
        try ns.inside(["link", "set", "v0", "up"])
        try await status.next(.running)
        await host.stop()
    }

    /// `network = "unmetered"`: a stand-in for NetworkManager (python3-dbus,
    /// on a private bus standing in for the system bus) flips its Metered
    /// property; the strategy stops while the link is metered.
    @Test func unmeteredFollowsNetworkManagersMeteredProperty() async throws {
        let ns = try NetworkNamespace()
        try ns.addLink()
        try ns.inside(["link", "set", "v0", "up"])
        let bus = try TestDBusDaemon()
        let dir = try ConditionTempDir()
        let script = dir.path + "/nm.py"
        try Self.networkManager.write(toFile: script, atomically: true, encoding: .utf8)
        let python = try spawnQuietly("/usr/bin/python3", [script, bus.address], environment: ["PATH": "/usr/bin:/bin"], stderr: dir.path + "/nm.err")
        func stopAll() {
            kill(python, SIGKILL)
            var exitStatus: Int32 = 0
            _ = waitpid(python, &exitStatus, 0)
            bus.stop()
        }
        func setMetered(_ value: UInt32) throws {
            let out = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.NetworkManager",
                "/org/freedesktop/NetworkManager", "org.vigil.Test", "SetMetered", "u", String(value)], environment: [:])
            guard out.status == 0 else { throw DescribedError("SetMetered: \(out.stderr)") }
        }
        do {
            // The stand-in announces nothing when it is ready: ask until it answers.
            try await eventually("the NetworkManager stand-in answers") { (try? setMetered(2)) != nil }
            let host = try GatedSupervisor(settings: ConditionMonitor.Settings(networkNamespace: ns.path, systemBus: .address(bus.address)))
            let status = await host.start("download", StrategyConditions(tables: [[.network(.unmetered)]]))
            try await status.next(.running)
            try setMetered(1)
            let waiting = try await status.next(.waiting)
            #expect(waiting.waitingFor == "network = \"unmetered\"")
            try setMetered(4)
            try await status.next(.running)
            await host.stop()
        } catch {
            stopAll()
            throw error
        }
        stopAll()
    }

    static let networkManager = """
        import sys, dbus, dbus.service
        from gi.repository import GLib
        from dbus.mainloop.glib import DBusGMainLoop
        DBusGMainLoop(set_as_default=True)
        bus = dbus.bus.BusConnection(sys.argv[1])
        name = dbus.service.BusName("org.freedesktop.NetworkManager", bus)
        class NM(dbus.service.Object):
            metered = 0
            @dbus.service.method("org.freedesktop.DBus.Properties", in_signature="ss", out_signature="v")
            def Get(self, interface, prop):
                return dbus.UInt32(self.metered, variant_level=1)
            @dbus.service.signal("org.freedesktop.DBus.Properties", signature="sa{sv}as")
            def PropertiesChanged(self, interface, changed, invalidated):
                pass
            @dbus.service.method("org.vigil.Test", in_signature="u")
            def SetMetered(self, value):
                self.metered = value
                self.PropertiesChanged("org.freedesktop.NetworkManager", {"Metered": dbus.UInt32(value)}, [])
        nm = NM(bus, "/org/freedesktop/NetworkManager")
        GLib.MainLoop().run()
        """
}
