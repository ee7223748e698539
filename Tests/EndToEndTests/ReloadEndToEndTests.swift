import Foundation
import Glibc
import Testing
import VigilKit
import VigilTestSupport

/// The org.vigil.Vigil1 API through the built vigild: the introspection
/// document in docs/ is what vigild prints, and Reload over the bus applies
/// a changed config with the real periodic-wake plugin.
extension EndToEnd {
    @Suite struct ReloadEndToEndTests {
        @Test func printIntrospectionIsTheDocumentInDocs() throws {
            let printed = try ProcessRunner.run(Build.vigild, ["--print-introspection"])
            #expect(printed.status == 0, "\(printed.stderr)")
            let docs = try String(contentsOfFile: Build.packageRoot.appendingPathComponent("docs/org.vigil.Vigil1.xml").path, encoding: .utf8)
            #expect(printed.stdout == docs, "docs/org.vigil.Vigil1.xml is stale: regenerate it with `vigild --print-introspection > docs/org.vigil.Vigil1.xml`")
            #expect(printed.stdout.hasPrefix("<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n"))
            let dir = try TempDir("vigil-introspection")
            let file = try dir.write("api.xml", printed.stdout)
            let parsed = try ProcessRunner.run("/usr/bin/python3", ["-c", """
                import sys, xml.etree.ElementTree as ET
                node = ET.parse(sys.argv[1]).getroot()
                assert node.tag == 'node', node.tag
                print(' '.join(i.get('name') for i in node.findall('interface')))
                """, file])
            #expect(parsed.status == 0, "\(parsed.stderr)")
            #expect(parsed.stdout.contains("org.vigil.Vigil1.Host org.vigil.Vigil1.Strategy org.vigil.Vigil1.Lease"))
        }

        @Test func reloadOverTheBusAppliesAChangedConfig() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-reload")
            let host = hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"")
            let first = """
                [[strategy]]
                name = "hourly"
                kind = "periodic-wake"
                every = "1h"
                run = ["/bin/true"]
                """
            let config = try dir.write("vigil.toml", host + "\n" + first)
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            func busctl(_ arguments: [String]) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)"] + arguments)
            }
            func call(_ method: String) throws -> CommandResult {
                try busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", method])
            }
            #expect(try call("ListStrategies").stdout == StrategyRow.arraySignature + " 1 \"/org/vigil/Vigil1/Strategy/hourly\" \"hourly\" \"periodic-wake\" \"running\" 0 \"\"\n")

            // Invalid: nothing changes, the problems name file, line and column.
            try dir.write("vigil.toml", host + "\n" + first + "\nevry = \"2h\"\n")
            let invalid = try call("Reload")
            #expect(invalid.status == 0, "\(invalid.stderr)")
            #expect(invalid.stdout.hasPrefix("bas false 1 \"\(config):11:1: strategy[0].evry: unknown key \\\"evry\\\""), "\(invalid.stdout)")

            // Valid: the new strategy starts, the unchanged one keeps running.
            try dir.write("vigil.toml", host + "\n" + first + """

                [[strategy]]
                name = "mail-sync"
                kind = "periodic-wake"
                every = "15m"
                run = ["/bin/true"]
                """)
            let applied = try call("Reload")
            #expect(applied.stdout == "bas true 1 \"started strategy \\\"mail-sync\\\": added to the config\"\n", "\(applied.stdout) \(applied.stderr)")
            try await daemon.waitForLine(containing: "reload: started strategy \"mail-sync\"")
            let tree = try busctl(["tree", "org.vigil.Vigil1", "--list", "--no-pager"])
            #expect(tree.stdout.contains("/org/vigil/Vigil1/Strategy/mail_2dsync"), "\(tree.stdout)")
            let kind = try busctl(["get-property", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/mail_2dsync", "org.vigil.Vigil1.Strategy", "Kind"])
            #expect(kind.stdout == "s \"periodic-wake\"\n")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// SIGHUP is the same reload: it no longer kills vigild. An invalid
        /// config changes nothing; a valid one starts the added strategy.
        @Test func sighupReloadsTheConfig() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-sighup")
            let host = hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"")
            let first = """
                [[strategy]]
                name = "hourly"
                kind = "periodic-wake"
                every = "1h"
                run = ["/bin/true"]
                """
            let config = try dir.write("vigil.toml", host + "\n" + first)
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")

            try dir.write("vigil.toml", host + "\n" + first + "\nevry = \"2h\"\n")
            daemon.signal(SIGHUP)
            let invalid = try await daemon.waitForLine(containing: "reload: ")
            #expect(invalid.contains("reload: \(config) is invalid; nothing changed"), "\(invalid)")
            #expect(daemon.output.contains { $0.contains("received SIGHUP: reloading the config") })

            try dir.write("vigil.toml", host + "\n" + first + """

                [[strategy]]
                name = "mail-sync"
                kind = "periodic-wake"
                every = "15m"
                run = ["/bin/true"]
                """)
            daemon.signal(SIGHUP)
            try await daemon.waitForLine(containing: "reload: started strategy \"mail-sync\"")
            let list = try ProcessRunner.run("/usr/bin/busctl", [
                "--address=\(bus.address)", "call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListStrategies"])
            #expect(list.stdout.contains("\"mail-sync\" \"periodic-wake\" \"running\""), "\(list.stdout)")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
