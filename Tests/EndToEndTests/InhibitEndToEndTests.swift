import Foundation
import Glibc
import Testing
import VigilTestSupport

/// Apps' keep-awake requests through the freedesktop inhibit APIs become
/// Vigil leases (issue 16), proven with clients Vigil did not write: wakepy
/// 1.0.0 from PyPI in the test's own venv, jeepney, and the logind stand-in.
extension EndToEnd {
    @Suite struct InhibitEndToEndTests {
        static let client = Build.packageRoot.appendingPathComponent("Tests/Fixtures/inhibit-client.py").path

        /// vigild on a private session bus, with the bridge on.
        final class Host: @unchecked Sendable {
            // Invariant: every stored property is set in init and never changes.
            let bus: BusTestDaemon
            let dir: TempDir
            let daemon: Daemon

            /// `busLimits`: extra `<limit>` elements for the bus.
            init(extra: String = "", environment: [String: String] = [:], busLimits: String = "") async throws {
                bus = try BusTestDaemon(limits: busLimits)
                dir = try TempDir("vigil-inhibit")
                let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"\n" + extra))
                daemon = try Daemon(arguments: ["--config", config], environment: environment)
                try await daemon.waitForLine(containing: "serving org.freedesktop.impl.portal.desktop.vigil")
                try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 as ")
            }

            func stop() async {
                daemon.signal(SIGTERM)
                _ = await daemon.waitForExit()
                bus.stop()
            }

            /// `vigilctl leases --json`, only the apps' inhibits.
            func inhibitLeases() throws -> [[String: Any]] {
                let listed = try ProcessRunner.run(Build.vigilctl, ["leases", "--bus", bus.address, "--json"])
                try #require(listed.status == 0, "\(listed.stderr)")
                let all = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
                return all.filter { $0["kind"] as? String == "inhibit" }
            }
        }

        /// The value after `key ` in a line such as "pid 123 vigild :1.4".
        static func word(after key: String, in line: String) -> String? {
            let words = line.split(separator: " ").map(String.init)
            guard let i = words.firstIndex(of: key), i + 1 < words.count else { return nil }
            return words[i + 1]
        }

        @Test func wakepyKeepsTheMachineAwakeThroughVigil() async throws {
            let host = try await Host()
            let python = try installWakepy(in: host.dir.path)
            let script = """
                import os, signal, sys
                from wakepy import keep
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
                mode = keep.running if sys.argv[1] == "running" else keep.presenting
                with mode(on_fail="pass") as m:
                    sys.stderr.write("active %s method %s pid %d\\n" % (m.active, m.used_method, os.getpid()))
                    sys.stderr.flush()
                    signal.sigwait({signal.SIGUSR1})
                sys.stderr.write("left the with block\\n")
                sys.stderr.flush()
                """
            let environment = ["DBUS_SESSION_BUS_ADDRESS": host.bus.address, "XDG_SESSION_DESKTOP": ""]
            for (mode, holds, method) in [("running", "sleep", "org.freedesktop.PowerManagement"), ("presenting", "idle", "org.freedesktop.ScreenSaver")] {
                let app = try Daemon(arguments: [], environment: environment, executable: [python, "-c", script, mode])
                defer { app.signal(SIGKILL) }
                let active = try await app.waitForLine(containing: "active ")
                #expect(active.hasPrefix("active True method \(method) "), "\(active)")
                let pid = try #require(Self.word(after: "pid", in: active))
                let leases = try host.inhibitLeases()
                try #require(leases.count == 1, "\(leases)")
                #expect(leases[0]["holds"] as? String == holds)
                let status = leases[0]["status"] as? [String: String] ?? [:]
                #expect(status["Pid"] == pid && status["App"] == "wakepy", "\(status)")
                // Leaving the with block ends the lease.
                app.signal(SIGUSR1)
                try await app.waitForLine(containing: "left the with block")
                #expect(try host.inhibitLeases().isEmpty)
            }
            // kill -9 inside the with block: the lease ends when its connection goes.
            let killed = try Daemon(arguments: [], environment: environment, executable: [python, "-c", script, "running"])
            try await killed.waitForLine(containing: "active True")
            #expect(try host.inhibitLeases().count == 1)
            killed.signal(SIGKILL)
            _ = await killed.waitForExit()
            let released = try await host.daemon.waitForLine(containing: "the app left the bus")
            #expect(released.contains("inhibit"), "\(released)")
            #expect(try host.inhibitLeases().isEmpty)
            await host.stop()
        }

        @Test func jeepneyInhibitsOnBothScreenSaverPaths() async throws {
            let host = try await Host()
            let app = try Daemon(arguments: [], executable: ["/usr/bin/python3", Self.client, host.bus.address, "screensaver"])
            defer { app.signal(SIGKILL) }
            let pid = try #require(Self.word(after: "pid", in: try await app.waitForLine(containing: "pid ")))
            try await app.waitForLine(containing: "waiting")
            let lines = app.output
            #expect(lines.filter { $0.hasPrefix("inhibit ") && $0.contains(" ok ") }.count == 2, "\(lines)")
            #expect(lines.contains("has True") && lines.contains("changed True"), "\(lines)")
            var leases = try host.inhibitLeases()
            #expect(leases.count == 2 && leases.allSatisfy { $0["holds"] as? String == "idle" }, "\(leases)")
            #expect(leases.allSatisfy { ($0["status"] as? [String: String])?["Pid"] == pid }, "\(leases)")

            // Another connection's UnInhibit is refused; a desktop takes the name; the leases stay.
            app.signal(SIGUSR1)
            try await app.waitForLine(containing: "waiting", after: 1)
            let foreign = try #require(app.output.first { $0.hasPrefix("foreign ") })
            #expect(foreign == "foreign error org.freedesktop.DBus.Error.InvalidArgs", "\(foreign)")
            #expect(app.output.contains("replace 1 owner-is-b True"), "\(app.output)")
            leases = try host.inhibitLeases()
            #expect(leases.count == 2, "losing the name ended a lease: \(leases)")

            app.signal(SIGUSR1)
            #expect(await app.waitForExit() == 0, "\(app.output)")
            #expect(app.output.filter { $0.hasPrefix("uninhibit ") && $0.hasSuffix(" ok") }.count == 2, "\(app.output)")
            #expect(app.output.suffix(2) == ["has False", "changed False"], "\(app.output)")
            #expect(try host.inhibitLeases().isEmpty)
            await host.stop()
        }

        @Test func thePortalBackendServesXdgDesktopPortalsCalls() async throws {
            let host = try await Host()
            let app = try Daemon(arguments: [], executable: ["/usr/bin/python3", Self.client, host.bus.address, "portal"])
            defer { app.signal(SIGKILL) }
            try await app.waitForLine(containing: "waiting")
            #expect(app.output.contains("inhibit ok ()"), "\(app.output)")
            let leases = try host.inhibitLeases()
            try #require(leases.count == 1, "\(leases)")
            #expect(leases[0]["holds"] as? String == "sleep+idle" && leases[0]["reason"] as? String == "watching a film", "\(leases)")
            #expect((leases[0]["status"] as? [String: String])?["App"] == "org.example.Films", "\(leases)")
            app.signal(SIGUSR1)
            try await app.waitForLine(containing: "waiting", after: 1)
            #expect(app.output.contains("close ok"), "\(app.output)")
            #expect(try host.inhibitLeases().isEmpty)
            await host.stop()
        }

        @Test func eachInhibitHoldsALogindInhibitorAndInhibitorsListsEveryHolder() async throws {
            let system = try BusTestDaemon()
            defer { system.stop() }
            let standIn = try LogindStandInProcess(busAddress: system.address)
            defer { standIn.stop() }
            let host = try await Host(extra: "power = \"logind\"", environment: ["DBUS_SYSTEM_BUS_ADDRESS": system.address])
            let app = try Daemon(arguments: [], executable: ["/usr/bin/python3", Self.client, host.bus.address, "hold"])
            defer { app.signal(SIGKILL) }
            try await app.waitForLine(containing: "waiting")
            // Another program takes an inhibitor on logind directly and keeps it.
            let other = try Daemon(arguments: [], executable: ["/usr/bin/python3", "-c", """
                import dbus, signal, sys
                bus = dbus.bus.BusConnection(sys.argv[1])
                m = dbus.Interface(bus.get_object("org.freedesktop.login1", "/org/freedesktop/login1"), "org.freedesktop.login1.Manager")
                fd = m.Inhibit("handle-lid-switch", "lid-tool", "docked", "block")
                sys.stderr.write("inhibited\\n"); sys.stderr.flush()
                signal.pause()
                """, system.address])
            defer { other.signal(SIGKILL) }
            try await other.waitForLine(containing: "inhibited")

            let listed = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(system.address)", "call", "org.freedesktop.login1", "/org/freedesktop/login1",
                                                           "org.freedesktop.login1.Manager", "ListInhibitors", "--json=short"])
            #expect(listed.stdout.contains("\"sleep\"") && listed.stdout.contains("\"idle\"") && listed.stdout.contains("lid-tool"), "\(listed.stdout)")

            let inhibitors = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--logind-bus", system.address, "--json"])
            try #require(inhibitors.status == 0, "\(inhibitors.stderr)")
            let holders = try #require(try JSONSerialization.jsonObject(with: Data(inhibitors.stdout.utf8)) as? [[String: Any]])
            let vigil = holders.filter { $0["source"] as? String == "vigil" }
            let logind = holders.filter { $0["source"] as? String == "logind" }
            #expect(Set(vigil.compactMap { $0["who"] as? String }) == ["jeepney-player", "jeepney-slides"], "\(holders)")
            #expect(Set(vigil.compactMap { $0["what"] as? String }) == ["sleep", "idle"], "\(holders)")
            // vigild's own logind inhibitors are its leases, listed once.
            #expect(logind.count == 1 && logind.first?["who"] as? String == "lid-tool" && logind.first?["what"] as? String == "handle-lid-switch", "\(holders)")
            let text = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--logind-bus", system.address])
            #expect(text.stdout.contains("lid-tool") && text.stdout.contains("jeepney-slides") && text.stdout.hasPrefix("SOURCE"), "\(text.stdout)")
            await host.stop()
        }
    }
}
