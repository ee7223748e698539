import Foundation
import VigilTestSupport
import Glibc
import Testing
import VigilHost

/// Configs/dbus/org.vigil.Vigil1.conf on a bus with the system bus's
/// default policy (deny own, deny method calls): root's vigild may own the
/// name, others may read but not own it, and vigild itself refuses their
/// Reload.
extension EndToEnd {
    @Suite struct BusPolicyTests {
        @Test func systemPolicyLetsRootOwnAndEveryoneRead() async throws {
            try await withPolicyHost { bus, _ in
                let read = try asNobody("/usr/bin/busctl", ["--address=\(bus.address)", "get-property", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "Version"])
                #expect(read.status == 0, "\(read.stderr)")
                #expect(read.stdout.hasPrefix("s \""))
                let list = try asNobody("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListStrategies"])
                #expect(list.status == 0, "\(list.stderr)")
                let tree = try asNobody("/usr/bin/busctl", ["--address=\(bus.address)", "tree", "org.vigil.Vigil1", "--no-pager"])
                #expect(tree.stdout.contains("/org/vigil/Vigil1"), "\(tree.stdout)\(tree.stderr)")
                // The bus lets the call through; vigild refuses it by uid.
                let reload = try asNobody("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "Reload"])
                #expect(reload.status != 0)
                #expect(reload.stderr.lowercased().contains("access denied") || reload.stderr.contains("AccessDenied"), "\(reload.stderr)")
                // Nobody else may own the name (the bus says so, not vigild).
                let own = try asNobody("/usr/bin/python3", ["-c", """
                    import dbus, sys
                    bus = dbus.bus.BusConnection(sys.argv[1])
                    try:
                        bus.request_name("org.vigil.Vigil1", dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
                        print("owned")
                    except dbus.exceptions.DBusException as e:
                        print(e.get_dbus_name())
                    """, bus.address])
                #expect(own.stdout.contains("org.freedesktop.DBus.Error.AccessDenied"), "\(own.stdout)\(own.stderr)")
            }
        }

        @Test func withoutThePolicyTheNameIsRefused() async throws {
            let bus = try SystemLikeBus(includingPolicy: false)
            defer { bus.stop() }
            let dir = try TempDir("vigil-policy")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
            let daemon = try Daemon(arguments: ["--config", config])
            #expect(await daemon.waitForExit() == 1)
            let text = daemon.output.joined(separator: "\n")
            #expect(text.contains("cannot own org.vigil.Vigil1 on the bus at \(bus.address)"), "\(text)")
        }
    }
}

/// vigild on a bus with the shipped system policy (`limits`: extra
/// `<limit>` elements); stopped with SIGTERM after `body`, which must exit 0.
func withPolicyHost(limits: String = "", _ body: (SystemLikeBus, Daemon) async throws -> Void) async throws {
    let bus = try SystemLikeBus(includingPolicy: true, limits: limits)
    defer { bus.stop() }
    let dir = try TempDir("vigil-policy")
    let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
    let daemon = try Daemon(arguments: ["--config", config])
    try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
    try await body(bus, daemon)
    daemon.signal(SIGTERM)
    #expect(await daemon.waitForExit() == 0)
}

/// Runs a command as uid/gid 65534 (nobody).
func asNobody(_ program: String, _ arguments: [String]) throws -> CommandResult {
    try ProcessRunner.run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "--", program] + arguments)
}

/// A dbus-daemon with the system bus's default policy, optionally with
/// Configs/dbus/org.vigil.Vigil1.conf included; its socket is reachable by
/// every user.
final class SystemLikeBus: Sendable {
    let daemon: TestDBusDaemon
    var address: String { daemon.address }

    /// `limits`: extra `<limit>` elements, e.g. a larger max_message_size
    /// than the system bus's 32 MiB.
    init(includingPolicy: Bool, limits: String = "") throws {
        let policy = Build.packageRoot.appendingPathComponent("Configs/dbus/org.vigil.Vigil1.conf").path
        daemon = try TestDBusDaemon(prefix: "vigil-sysbus") { directory in
            """
            <type>system</type>
            <listen>unix:path=\(directory)/system_bus_socket</listen>
            <auth>EXTERNAL</auth>
            <policy context="default">
              <allow user="*"/>
              <deny own="*"/>
              <deny send_type="method_call"/>
              <allow send_type="signal"/>
              <allow send_requested_reply="true" send_type="method_return"/>
              <allow send_requested_reply="true" send_type="error"/>
              <allow receive_type="method_call"/>
              <allow receive_type="method_return"/>
              <allow receive_type="error"/>
              <allow receive_type="signal"/>
              <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
              <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
              <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
            </policy>
            \(includingPolicy ? "<include>\(policy)</include>" : "")
            \(limits)
            """
        }
    }

    func stop() { daemon.stop() }
}
