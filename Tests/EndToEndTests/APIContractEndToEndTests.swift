import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit

/// What a running vigild exports is what the contract (VigilKit's
/// ``VigilAPI``) declares, for every interface it can export: gdbus
/// introspects the root, a download-session strategy, a client lease and a
/// download, and each interface's XML equals the one generated from the
/// contract (docs/org.vigil.Vigil1.xml).
extension EndToEnd {
    @Suite(.serialized) struct APIContractIntrospectionTests {
        /// Begins a client lease and enqueues a download (to a closed port:
        /// it retries, its object stays), then introspects each object with
        /// gdbus while the lease's fd is held.
        static let script = """
            import sys, json, subprocess, dbus
            cfg = json.loads(sys.argv[1])
            bus = dbus.bus.BusConnection(cfg["address"])
            def iface(path, name):
                return dbus.Interface(bus.get_object(cfg["name"], path, introspect=False), name)
            lease, fd = iface(cfg["root"], cfg["host"]).BeginBackgroundTask("contract", "introspection", dbus.UInt64(600000000))
            download = iface(cfg["strategy"], cfg["session"]).Enqueue("http://127.0.0.1:9/contract.bin", "", dbus.Dictionary({}, signature="sv"))
            xml = {}
            for path in [cfg["root"], cfg["strategy"], str(lease), str(download)] + cfg["inhibitPaths"]:
                xml[path] = subprocess.run(["gdbus", "introspect", "--address", cfg["address"], "--dest", cfg["name"],
                                            "--object-path", path, "--xml"], capture_output=True, text=True, check=True).stdout
            print(json.dumps(xml))
            """

        struct Config: Encodable {
            var address: String
            var name = VigilAPI.busName
            var root = VigilAPI.rootPath
            var host = VigilAPI.hostInterface
            var strategy = VigilAPI.strategyPath("dl")
            var session = VigilAPI.downloadSessionInterface
            /// The freedesktop objects vigild serves on a session bus
            /// (docs/freedesktop-inhibit.xml), under its own name too.
            var inhibitPaths = InhibitBusNames.powerManagementPaths + InhibitBusNames.screenSaverPaths + [InhibitBusNames.portalPath]
        }

        @Test func everyExportedInterfaceIsTheDeclaredOne() async throws {
            let downloads = try TempDir("vigil-e2e-contract")
            try await BusHost.with(strategies: BusHost.withDownloads(in: downloads.path)) { host in
                // The strategy adds its interface when its run starts: before
                // vigild took its name (then GetManagedObjects lists it) or
                // after (then the watcher, subscribed from the start, saw
                // InterfacesAdded).
                let strategy = VigilAPI.strategyPath("dl")
                let managed = try await host.watcher.call(destination: VigilAPI.busName, path: VigilAPI.rootPath,
                                                          interface: VigilAPI.objectManagerInterface, member: "GetManagedObjects")
                if !Self.carries(managed.body.first, strategy, VigilAPI.downloadSessionInterface) {
                    _ = try await host.signals.first { message in
                        message.member == "InterfacesAdded" && message.body.count == 2 && message.body[0] == .objectPath(strategy)
                            && Self.carries(message.body[1], nil, VigilAPI.downloadSessionInterface)
                    }
                }
                let config = String(decoding: try JSONEncoder().encode(Config(address: host.address)), as: UTF8.self)
                let result = try runPythonScript(Self.script, [config])
                try #require(result.status == 0, "\(result.stderr)")
                let objects = try JSONDecoder().decode([String: String].self, from: Data(result.stdout.utf8))
                let declared = HostBusAPI.introspectionXML()
                for interface in VigilAPI.interfaces {
                    let expected = try #require(Self.block(interface.name, in: declared), "the generated XML lacks \(interface.name)")
                    let exported = objects.compactMap { path, xml in Self.block(interface.name, in: xml).map { (path, $0) } }
                    #expect(!exported.isEmpty, "no introspected object carries \(interface.name): \(objects.keys.sorted())")
                    for (path, block) in exported {
                        #expect(block == expected, "\(path) exports \(interface.name) as\n\(block)\nbut the contract declares\n\(expected)")
                    }
                }
                // The freedesktop interfaces apps call: as their generated XML says.
                let inhibitXML = HostBusAPI.inhibitIntrospectionXML()
                for name in [InhibitBusNames.powerManagementInterface, InhibitBusNames.screenSaverInterface, InhibitBusNames.portalInterface] {
                    let expected = try #require(Self.block(name, in: inhibitXML), "the generated inhibit XML lacks \(name)")
                    let exported = objects.compactMap { path, xml in Self.block(name, in: xml).map { (path, $0) } }
                    #expect(!exported.isEmpty, "no introspected object carries \(name): \(objects.keys.sorted())")
                    for (path, block) in exported {
                        #expect(block == expected, "\(path) exports \(name) as\n\(block)\nbut docs/freedesktop-inhibit.xml declares\n\(expected)")
                    }
                }
            }
        }

        /// Whether `value` (GetManagedObjects' `a{oa{sa{sv}}}` with `path`,
        /// or InterfacesAdded's `a{sa{sv}}` with nil) names `interface`.
        static func carries(_ value: BusValue?, _ path: String?, _ interface: String) -> Bool {
            var interfaces = value
            if let path {
                guard case .dict(_, _, let objects)? = value else { return false }
                interfaces = objects.first { $0.key == .objectPath(path) }?.value
            }
            guard case .dict(_, _, let entries)? = interfaces else { return false }
            return entries.contains { $0.key == .string(interface) }
        }

        /// The `<interface name="...">...</interface>` element of `name` in `xml`.
        static func block(_ name: String, in xml: String) -> String? {
            guard let start = xml.range(of: "<interface name=\"\(name)\">") else { return nil }
            guard let end = xml.range(of: "</interface>", range: start.upperBound..<xml.endIndex) else { return nil }
            return String(xml[start.lowerBound..<end.upperBound])
        }
    }
}
