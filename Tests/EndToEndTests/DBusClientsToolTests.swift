import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// vigild's org.vigil.Vigil1 API through the standard command-line clients
/// (systemd's busctl, libdbus's dbus-send and dbus-monitor, GLib's gdbus),
/// on a private bus, with real periodic-wake strategies holding leases.
extension EndToEnd {
    @Suite(.serialized) struct DBusClientsToolTests {
        @Test func busctlTreeIntrospectGetPropertyAndCall() async throws {
            try await BusHost.with { host in
                let leasePath = try await host.leasePath(strategy: "mail-sync")

                let tree = try host.busctl(["tree", BusHost.name])
                #expect(tree.status == 0, "\(tree.stderr)")
                for path in [BusHost.root, "\(BusHost.root)/Strategy/mail_2dsync", "\(BusHost.root)/Strategy/tick", leasePath] {
                    #expect(tree.stdout.contains(path), "busctl tree lacks \(path):\n\(tree.stdout)")
                }

                let introspect = try host.busctl(["introspect", BusHost.name, BusHost.root])
                #expect(introspect.status == 0, "\(introspect.stderr)")
                let lines = introspect.stdout.split(separator: "\n").map(String.init)
                func member(_ name: String, _ kind: String) -> Bool {
                    lines.contains { $0.hasPrefix(".\(name) ") && $0.contains(kind) }
                }
                for name in APIContract.hostProperties { #expect(member(name, "property"), "introspect lacks property \(name)") }
                for name in APIContract.hostMethods { #expect(member(name, "method"), "introspect lacks method \(name)") }
                for name in APIContract.hostSignals { #expect(member(name, "signal"), "introspect lacks signal \(name)") }
                for iface in ["org.vigil.Vigil1.Host", "org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Introspectable",
                              "org.freedesktop.DBus.Peer", "org.freedesktop.DBus.ObjectManager"] {
                    #expect(lines.contains { $0.hasPrefix(iface + " ") && $0.contains("interface") }, "introspect lacks \(iface)")
                }
                // The exact signatures of the contract.
                for method in VigilAPI.host.methods {
                    #expect(lines.contains { $0.hasPrefix(".\(method.name) ") && $0.contains(method.inSignature.isEmpty ? "-" : method.inSignature)
                        && $0.contains(method.outSignature.isEmpty ? "-" : method.outSignature) }, "introspect shows \(method.name) with other signatures")
                }

                let strategyIntrospect = try host.busctl(["introspect", BusHost.name, "\(BusHost.root)/Strategy/mail_2dsync", VigilAPI.strategyInterface])
                for name in APIContract.strategyProperties {
                    #expect(strategyIntrospect.stdout.contains(".\(name) "), "strategy introspection lacks \(name):\n\(strategyIntrospect.stdout)")
                }
                let leaseIntrospect = try host.busctl(["introspect", BusHost.name, leasePath, VigilAPI.leaseInterface])
                for name in APIContract.leaseProperties {
                    #expect(leaseIntrospect.stdout.contains(".\(name) "), "lease introspection lacks \(name):\n\(leaseIntrospect.stdout)")
                }

                let config = try host.busctl(["get-property", BusHost.name, BusHost.root, BusHost.hostInterface, "ConfigPath"])
                #expect(config.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "s \"\(host.configPath)\"", "\(config.stdout)\(config.stderr)")
                let strategies = try host.busctl(["get-property", BusHost.name, BusHost.root, BusHost.hostInterface, "Strategies"])
                #expect(strategies.stdout.hasPrefix("ao 2 "), "\(strategies.stdout)")
                #expect(strategies.stdout.contains("\"\(BusHost.root)/Strategy/mail_2dsync\""))
                let leases = try host.busctl(["get-property", BusHost.name, BusHost.root, BusHost.hostInterface, "Leases"])
                #expect(leases.stdout.contains("\"\(leasePath)\""), "\(leases.stdout)")
                let holds = try host.busctl(["get-property", BusHost.name, leasePath, VigilAPI.leaseInterface, "Holds", "Strategy", "State"])
                #expect(holds.stdout == "s \"command /bin/sleep\"\ns \"mail-sync\"\ns \"active\"\n", "\(holds.stdout)\(holds.stderr)")

                let list = try host.busctl(["call", BusHost.name, BusHost.root, BusHost.hostInterface, "ListStrategies"])
                #expect(list.status == 0, "\(list.stderr)")
                #expect(list.stdout.hasPrefix(StrategyRow.arraySignature + " 2 "), "\(list.stdout)")
                #expect(list.stdout.contains("\"\(BusHost.root)/Strategy/mail_2dsync\" \"mail-sync\" \"periodic-wake\" \"running\" 0 \"\""), "\(list.stdout)")

                let leaseList = try host.busctl(["call", BusHost.name, BusHost.root, BusHost.hostInterface, "ListLeases"])
                #expect(leaseList.stdout.hasPrefix(LeaseRow.arraySignature + " "), "\(leaseList.stdout)")
                #expect(leaseList.stdout.contains("\"\(leasePath)\""))
                #expect(leaseList.stdout.contains("\"mail-sync\" \"periodic-wake\" \"command /bin/sleep\" \"periodic-wake run #1\""), "\(leaseList.stdout)")

                let runId = try host.busctl(["get-property", BusHost.name, BusHost.root, BusHost.hostInterface, "RunId"])
                let survival = try host.busctl(["call", BusHost.name, BusHost.root, BusHost.hostInterface, "Survival", "t", "0"])
                #expect(survival.stdout.hasPrefix(RunRow.arraySignature + " 1 "), "\(survival.stdout)\(survival.stderr)")
                #expect(survival.stdout.contains(String(runId.stdout.dropFirst(2)).trimmingCharacters(in: .whitespacesAndNewlines)))
                #expect(survival.stdout.contains("\"running\""), "\(survival.stdout)")

                // Bad calls get the standard errors and change nothing.
                let unknown = try host.busctl(["call", BusHost.name, BusHost.root, BusHost.hostInterface, "Frobnicate"])
                #expect(unknown.status != 0)
                let readOnly = try host.busctl(["set-property", BusHost.name, BusHost.root, BusHost.hostInterface, "Version", "s", "9"])
                #expect(readOnly.status != 0)
                #expect(readOnly.stderr.contains("read-only") || readOnly.stderr.contains("PropertyReadOnly") || readOnly.stderr.contains("read only"), "\(readOnly.stderr)")
            }
        }

        @Test func busctlMonitorSeesLeaseSignalsAsTheyHappen() async throws {
            try await BusHost.with { host in
                let monitor = try StreamingTool("/usr/bin/busctl", ["--address=\(host.address)", "monitor", BusHost.name])
                defer { monitor.stop() }
                // Each tick run takes and releases a lease: both signals appear live.
                try await monitor.waitForLine(containing: "Member=LeaseAcquired")
                try await monitor.waitForLine(containing: "Member=LeaseReleased")
                #expect(monitor.output.contains { $0.contains("Interface=org.vigil.Vigil1.Host") })
            }
        }

        @Test func dbusSendAndDbusMonitor() async throws {
            try await BusHost.with { host in
                func send(_ arguments: [String]) throws -> CommandResult {
                    try ProcessRunner.run("/usr/bin/dbus-send", ["--bus=\(host.address)", "--print-reply", "--dest=\(BusHost.name)"] + arguments)
                }
                let version = try send([BusHost.root, "org.freedesktop.DBus.Properties.Get", "string:\(BusHost.hostInterface)", "string:Version"])
                #expect(version.status == 0, "\(version.stderr)")
                #expect(version.stdout.contains("variant       string \"\(VigilVersion.string)\""), "\(version.stdout)")
                let all = try send([BusHost.root, "org.freedesktop.DBus.Properties.GetAll", "string:\(BusHost.hostInterface)"])
                for name in APIContract.hostProperties { #expect(all.stdout.contains("string \"\(name)\""), "GetAll lacks \(name)") }
                let leases = try send([BusHost.root, "\(BusHost.hostInterface).ListLeases"])
                #expect(leases.stdout.contains("string \"mail-sync\""), "\(leases.stdout)")
                #expect(leases.stdout.contains("object path \"\(BusHost.root)/Lease/"))
                let introspect = try send([BusHost.root, "org.freedesktop.DBus.Introspectable.Introspect"])
                #expect(introspect.stdout.contains("<interface name=\"org.vigil.Vigil1.Host\">"))
                #expect(introspect.stdout.contains("<node name=\"Strategy\""), "\(introspect.stdout)")
                let managed = try send([BusHost.root, "org.freedesktop.DBus.ObjectManager.GetManagedObjects"])
                #expect(managed.stdout.contains("object path \"\(BusHost.root)/Strategy/mail_2dsync\""), "\(managed.stdout)")
                #expect(managed.stdout.contains("string \"org.vigil.Vigil1.Lease\""))
                let ping = try send([BusHost.root, "org.freedesktop.DBus.Peer.Ping"])
                #expect(ping.status == 0, "\(ping.stderr)")
                let wrong = try send([BusHost.root, "\(BusHost.hostInterface).Survival", "string:yesterday"])
                #expect(wrong.status != 0)
                #expect(wrong.stderr.contains("org.freedesktop.DBus.Error.InvalidArgs"), "\(wrong.stderr)")

                let monitor = try StreamingTool("/usr/bin/dbus-monitor", ["--address", host.address, "type='signal',sender='\(BusHost.name)',interface='\(BusHost.hostInterface)'"])
                defer { monitor.stop() }
                try await monitor.waitForLine(containing: "member=LeaseAcquired")
                try await monitor.waitForLine(containing: "member=LeaseReleased")
            }
        }

        @Test func gdbusCallIntrospectAndMonitor() async throws {
            try await BusHost.with { host in
                func gdbus(_ command: String, _ arguments: [String]) throws -> CommandResult {
                    try ProcessRunner.run("/usr/bin/gdbus", [command, "--address", host.address, "-d", BusHost.name] + arguments)
                }
                let root = try gdbus("introspect", ["-o", BusHost.root])
                #expect(root.status == 0, "\(root.stderr)")
                for name in APIContract.hostProperties + APIContract.hostMethods + APIContract.hostSignals {
                    #expect(root.stdout.contains(" \(name)"), "gdbus introspect lacks \(name)")
                }
                #expect(root.stdout.contains("ListLeases(out \(LeaseRow.arraySignature) "), "\(root.stdout)")
                // -r recurses into the strategy and lease objects, -p shows their values.
                let introspect = try gdbus("introspect", ["-o", BusHost.root, "-r", "-p"])
                #expect(introspect.stdout.contains("node \(BusHost.root)/Strategy/mail_2dsync"), "\(introspect.stdout)")
                #expect(introspect.stdout.contains("readonly s Name = 'mail-sync';"), "\(introspect.stdout)")

                let strategies = try gdbus("call", ["-o", BusHost.root, "-m", "\(BusHost.hostInterface).ListStrategies"])
                #expect(strategies.status == 0, "\(strategies.stderr)")
                #expect(strategies.stdout.contains("(objectpath '\(BusHost.root)/Strategy/mail_2dsync', 'mail-sync', 'periodic-wake', 'running', uint32 0, '')"), "\(strategies.stdout)")
                let config = try gdbus("call", ["-o", "\(BusHost.root)/Strategy/tick", "-m", "org.freedesktop.DBus.Properties.Get", VigilAPI.strategyInterface, "Config"])
                #expect(config.stdout.contains("'every': <'250ms'>"), "\(config.stdout)\(config.stderr)")
                let reload = try gdbus("call", ["-o", BusHost.root, "-m", "\(BusHost.hostInterface).Reload"])
                #expect(reload.status == 0, "\(reload.stderr)")
                #expect(reload.stdout.hasPrefix("(true, "), "\(reload.stdout)")

                let monitor = try StreamingTool("/usr/bin/gdbus", ["monitor", "--address", host.address, "-d", BusHost.name])
                defer { monitor.stop() }
                try await monitor.waitForLine(containing: "org.vigil.Vigil1.Host.LeaseAcquired")
                try await monitor.waitForLine(containing: "org.vigil.Vigil1.Host.LeaseReleased")
            }
        }
    }
}
