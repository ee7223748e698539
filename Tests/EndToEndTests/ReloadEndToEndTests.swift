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

        /// vigild on a private bus with one periodic-wake strategy,
        /// "hourly", and the config file's three versions: as started,
        /// with a typo (invalid), and with "mail-sync" added.
        final class Fixture {
            let bus: BusTestDaemon
            let dir: TempDir
            let config: String
            let daemon: Daemon
            private let base: String

            init(_ name: String) async throws {
                bus = try BusTestDaemon()
                dir = try TempDir(name)
                base = hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"") + """

                    [[strategy]]
                    name = "hourly"
                    kind = "periodic-wake"
                    every = "1h"
                    run = ["/bin/true"]
                    """
                config = try dir.write("vigil.toml", base)
                daemon = try Daemon(arguments: ["--config", config])
                try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            }

            /// An unknown key on line 11 (`evry`).
            func writeInvalid() throws { try dir.write("vigil.toml", base + "\nevry = \"2h\"\n") }

            func addMailSync() throws {
                try dir.write("vigil.toml", base + """

                    [[strategy]]
                    name = "mail-sync"
                    kind = "periodic-wake"
                    every = "15m"
                    run = ["/bin/true"]
                    """)
            }

            func busctl(_ arguments: [String]) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)"] + arguments)
            }

            func call(_ method: String) throws -> CommandResult {
                try busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", method])
            }

            /// Stops vigild, which must exit cleanly; the bus goes with the
            /// fixture (also when a test throws).
            func stop() async {
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0)
            }

            deinit { bus.stop() }
        }

        @Test func reloadOverTheBusAppliesAChangedConfig() async throws {
            let f = try await Fixture("vigil-reload")
            #expect(try f.call("ListStrategies").stdout == StrategyRow.arraySignature + " 1 \"/org/vigil/Vigil1/Strategy/hourly\" \"hourly\" \"periodic-wake\" \"running\" 0 \"\"\n")

            // Invalid: nothing changes, the problems name file, line and column.
            try f.writeInvalid()
            let invalid = try f.call("Reload")
            #expect(invalid.status == 0, "\(invalid.stderr)")
            #expect(invalid.stdout.hasPrefix("bas false 1 \"\(f.config):11:1: strategy[0].evry: unknown key \\\"evry\\\""), "\(invalid.stdout)")

            // Valid: the new strategy starts, the unchanged one keeps running.
            try f.addMailSync()
            let applied = try f.call("Reload")
            #expect(applied.stdout == "bas true 1 \"started strategy \\\"mail-sync\\\": added to the config\"\n", "\(applied.stdout) \(applied.stderr)")
            try await f.daemon.waitForLine(containing: "reload: started strategy \"mail-sync\"")
            let tree = try f.busctl(["tree", "org.vigil.Vigil1", "--list", "--no-pager"])
            #expect(tree.stdout.contains("/org/vigil/Vigil1/Strategy/mail_2dsync"), "\(tree.stdout)")
            let kind = try f.busctl(["get-property", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/mail_2dsync", "org.vigil.Vigil1.Strategy", "Kind"])
            #expect(kind.stdout == "s \"periodic-wake\"\n")
            await f.stop()
        }

        /// SIGHUP is the same reload: it no longer kills vigild. An invalid
        /// config changes nothing; a valid one starts the added strategy.
        @Test func sighupReloadsTheConfig() async throws {
            let f = try await Fixture("vigil-sighup")
            try f.writeInvalid()
            f.daemon.signal(SIGHUP)
            let invalid = try await f.daemon.waitForLine(containing: "reload: ")
            #expect(invalid.contains("reload: \(f.config) is invalid; nothing changed"), "\(invalid)")
            #expect(f.daemon.output.contains { $0.contains("received SIGHUP: reloading the config") })

            try f.addMailSync()
            f.daemon.signal(SIGHUP)
            try await f.daemon.waitForLine(containing: "reload: started strategy \"mail-sync\"")
            let list = try f.call("ListStrategies")
            #expect(list.stdout.contains("\"mail-sync\" \"periodic-wake\" \"running\""), "\(list.stdout)")
            await f.stop()
        }
    }
}
