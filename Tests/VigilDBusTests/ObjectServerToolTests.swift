import Foundation
import Testing
@testable import VigilDBus
import VigilKitTesting

/// The test object seen from outside, through real tools.
@Suite("DBusObjectServer from busctl, gdbus, dbus-send")
struct ObjectServerToolTests {
    @Test func busctlIntrospectShowsEveryMember() async throws {
        try await TestService.with { service in
            let out = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(service.bus.address)", "introspect", TestService.name, TestService.path])
            #expect(out.status == 0, "\(out.stderr)")
            let interface = TestService.testInterface(state: service.state)
            for member in interface.methods.map(\.name) + interface.properties.map(\.name) + interface.signals.map(\.name) {
                #expect(out.stdout.contains(".\(member) "), "busctl introspect lacks \(member):\n\(out.stdout)")
            }
            for standard in ["org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Introspectable", "org.freedesktop.DBus.Peer"] {
                #expect(out.stdout.contains(standard))
            }
            let tree = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(service.bus.address)", "tree", TestService.name])
            #expect(tree.stdout.contains("/org/vigil/Test"), "\(tree.stdout)")
            // Peer is answered by libdbus itself.
            let ping = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(service.bus.address)", "call", TestService.name, TestService.path, "org.freedesktop.DBus.Peer", "Ping"])
            #expect(ping.status == 0, "\(ping.stderr)")
        }
    }

    @Test func introspectionXMLIsWellFormed() async throws {
        try await TestService.with { service in
            let script = """
            import sys, dbus, xml.etree.ElementTree as ET
            bus = dbus.bus.BusConnection(sys.argv[1])
            for path in ["/", "/org", "/org/vigil", "/org/vigil/Test"]:
                xml = bus.get_object("org.vigil.Test", path).Introspect(dbus_interface="org.freedesktop.DBus.Introspectable")
                root = ET.fromstring(str(xml))
                ifaces = [i.get("name") for i in root.findall("interface")]
                nodes = [n.get("name") for n in root.findall("node")]
                print(path, ",".join(ifaces), ",".join(nodes))
            """
            let out = try await runPython(script, [service.bus.address])
            #expect(out.status == 0, "\(out.stderr)")
            let lines = out.stdout.split(separator: "\n").map(String.init)
            #expect(lines.contains { $0.hasPrefix("/ ") && $0.hasSuffix(" org") }, "\(out.stdout)")
            #expect(lines.contains { $0.hasPrefix("/org/vigil ") && $0.contains("org.freedesktop.DBus.ObjectManager") && $0.hasSuffix(" Test") }, "\(out.stdout)")
            #expect(lines.contains { $0.hasPrefix("/org/vigil/Test ") && $0.contains("org.vigil.Test1") && $0.contains("org.freedesktop.DBus.Properties") }, "\(out.stdout)")
        }
    }

    @Test func callsAndPropertiesFromTools() async throws {
        try await TestService.with { service in
            let address = service.bus.address
            let echo = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(address)", "call", TestService.name, TestService.path, TestService.interfaceName, "Echo", "s", "hello"])
            #expect(echo.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "s \"hello\"", "\(echo.stdout)\(echo.stderr)")
            let version = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(address)", "get-property", TestService.name, TestService.path, TestService.interfaceName, "Version"])
            #expect(version.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "s \"1.2.3\"", "\(version.stdout)\(version.stderr)")
            let set = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(address)", "set-property", TestService.name, TestService.path, TestService.interfaceName, "Count", "u", "42"])
            #expect(set.status == 0, "\(set.stderr)")
            #expect(await service.state.count == 42)
            let add = try await ProcessRunner.runDetached("/usr/bin/gdbus", ["call", "--address", address, "--dest", TestService.name, "--object-path", TestService.path, "--method", "org.vigil.Test1.Add", "40", "2"])
            #expect(add.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "(42,)", "\(add.stdout)\(add.stderr)")
            let send = try await ProcessRunner.runDetached("/usr/bin/dbus-send", ["--bus=\(address)", "--print-reply", "--dest=\(TestService.name)", TestService.path, "org.vigil.Test1.Echo", "string:via dbus-send"])
            #expect(send.stdout.contains("string \"via dbus-send\""), "\(send.stdout)\(send.stderr)")
            let all = try await ProcessRunner.runDetached("/usr/bin/dbus-send", ["--bus=\(address)", "--print-reply", "--dest=\(TestService.name)", TestService.path, "org.freedesktop.DBus.Properties.GetAll", "string:org.vigil.Test1"])
            for name in ["Version", "Count", "Label", "Tags"] {
                #expect(all.stdout.contains("\"\(name)\""), "\(all.stdout)")
            }
        }
    }

    @Test func malformedCallsGetTheRightErrors() async throws {
        try await TestService.with { service in
            let address = service.bus.address
            func errorOf(_ arguments: [String]) async throws -> String {
                let out = try await ProcessRunner.runDetached("/usr/bin/dbus-send", ["--bus=\(address)", "--print-reply", "--dest=\(TestService.name)"] + arguments)
                #expect(out.status != 0)
                return out.stderr
            }
            let props = "org.freedesktop.DBus.Properties"
            #expect(try await errorOf([TestService.path, "org.vigil.Test1.Echo", "int32:1"]).contains("org.freedesktop.DBus.Error.InvalidArgs"))
            #expect(try await errorOf([TestService.path, "org.vigil.Test1.Nope"]).contains("org.freedesktop.DBus.Error.UnknownMethod"))
            #expect(try await errorOf([TestService.path, "org.vigil.Nope.Echo", "string:x"]).contains("org.freedesktop.DBus.Error.UnknownInterface"))
            #expect(try await errorOf(["/org/vigil/Nothing", "org.vigil.Test1.Echo", "string:x"]).contains("org.freedesktop.DBus.Error.UnknownObject"))
            #expect(try await errorOf([TestService.path, "\(props).Get", "string:org.vigil.Test1", "string:Nope"]).contains("org.freedesktop.DBus.Error.UnknownProperty"))
            #expect(try await errorOf([TestService.path, "\(props).Get", "string:org.vigil.Nope", "string:Count"]).contains("org.freedesktop.DBus.Error.UnknownInterface"))
            #expect(try await errorOf([TestService.path, "\(props).Set", "string:org.vigil.Test1", "string:Version", "variant:string:x"]).contains("org.freedesktop.DBus.Error.PropertyReadOnly"))
            #expect(try await errorOf([TestService.path, "\(props).Set", "string:org.vigil.Test1", "string:Count", "variant:string:x"]).contains("org.freedesktop.DBus.Error.InvalidArgs"))
            #expect(try await errorOf([TestService.path, "\(props).Set", "string:org.vigil.Test1", "string:Count", "variant:uint32:5000"]).contains("org.freedesktop.DBus.Error.InvalidArgs"))
            #expect(try await errorOf([TestService.path, "\(props).Get", "string:org.vigil.Test1"]).contains("org.freedesktop.DBus.Error.InvalidArgs"))
            #expect(try await errorOf([TestService.path, "org.vigil.Test1.Deny"]).contains("org.freedesktop.DBus.Error.AccessDenied"))
            #expect(try await errorOf([TestService.path, "org.vigil.Test1.Broken"]).contains("org.freedesktop.DBus.Error.Failed"))
            // The service still answers.
            let echo = try await service.connection.call(destination: TestService.name, path: TestService.path, interface: TestService.interfaceName,
                                                         member: "Echo", arguments: ["still here"], returning: String.self)
            #expect(echo == "still here")
        }
    }

    /// The server receives calls through one connection filter: a second
    /// server on the same connection is refused, and the first one still
    /// answers, a call to a path it does not export included.
    @Test func aSecondObjectServerOnOneConnectionIsRefused() async throws {
        try await TestService.with { service in
            await #expect(throws: DBusError.self) { _ = try await DBusObjectServer(connection: service.connection) }
            let address = service.bus.address
            let echo = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(address)", "call", TestService.name, TestService.path, TestService.interfaceName, "Echo", "s", "still one"])
            #expect(echo.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "s \"still one\"", "\(echo.stdout)\(echo.stderr)")
            let missing = try await ProcessRunner.runDetached("/usr/bin/busctl", ["--address=\(address)", "call", TestService.name, "/org/vigil/Nowhere", TestService.interfaceName, "Echo", "s", "x"])
            #expect(missing.status != 0)
            // The server's own answer, not libdbus's default one.
            #expect(missing.stderr.contains("no object at /org/vigil/Nowhere"), "\(missing.stderr)")
        }
    }
}
