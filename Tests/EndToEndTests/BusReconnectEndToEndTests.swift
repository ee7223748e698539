import Foundation
import Glibc
import Testing
import VigilHost
import VigilTestSupport

/// The bus comes back (issue 12): when the dbus-daemon under a running
/// vigild dies, vigild says so at error level, reconnects with backoff,
/// re-exports its objects and re-owns its name; client leases whose holders
/// were on the old bus end. Its own private bus it restarts by itself.
extension EndToEnd {
    @Suite struct BusReconnectEndToEndTests {
        /// A bus listening on `socket` (so a second one can take the same address).
        static func bus(at socket: String) throws -> BusTestDaemon {
            unlink(socket)
            return try BusTestDaemon(listen: "unix:path=\(socket)")
        }

        static func leases(_ address: String) throws -> [[String: Any]] {
            let listed = try ProcessRunner.run(Build.vigilctl, ["leases", "--bus", address, "--json"])
            try #require(listed.status == 0, "vigilctl leases: \(listed.stderr)")
            return try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
        }

        @Test func aBusRestartedAtTheSameAddressGetsTheHostBack() async throws {
            let dir = try TempDir("vigil-reconnect")
            let socket = dir.file("bus.sock")
            let address = "unix:path=\(socket)"
            var bus = try Self.bus(at: socket)
            defer { bus.stop() }
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(address)\"") + """

                [[strategy]]
                name = "focus"
                kind = "background-task"
                budget = "1h"
                reason = "focus session"
                """)
            let notify = try NotifySocket(path: dir.file("notify"))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["NOTIFY_SOCKET": dir.file("notify")])
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 as ")
            /// The next STATUS= for which `condition` holds (others are skipped).
            func status(where condition: (String) -> Bool) async -> String? {
                for _ in 0..<50 {
                    guard let message = await notify.receive() else { return nil }
                    if message.text.contains("STATUS="), condition(message.text) { return message.text }
                }
                return nil
            }
            // A client lease, held by a peer on this bus.
            // The command runs only once the lease is held, and says so.
            let hold = try Daemon(arguments: [], executable: [
                Build.vigilctl, "hold", "--bus", address, "--budget", "1h", "--", "/bin/sh", "-c", "echo lease-held >&2; exec sleep 600",
            ])
            defer { hold.signal(SIGKILL) }
            try await hold.waitForLine(containing: "lease-held")
            let clientLease = try Self.leases(address).first { $0["kind"] as? String == "client" }?["id"] as? UInt64
            let oldClientLease = try #require(clientLease, "vigilctl hold did not get a lease")

            // The bus dies under the host: said at error level, the host keeps running.
            bus.stop()
            let lost = try await daemon.waitForLine(containing: "lost the connection to")
            #expect(lost.contains("error"), "\(lost)")
            #expect(kill(daemon.pid, 0) == 0)
            // systemd hears of it too.
            #expect(await status { $0.contains("bus connection lost; reconnecting") } != nil)

            // A new bus at the same address: the host is back within the backoff.
            bus = try Self.bus(at: socket)
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 again as ")
            #expect(await status { !$0.contains("bus connection lost") } != nil)
            let tree = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(address)", "tree", "org.vigil.Vigil1"])
            #expect(tree.stdout.contains("/org/vigil/Vigil1/Strategy/focus"), "\(tree.stdout)")
            let status = try ProcessRunner.run(Build.vigilctl, ["status", "--bus", address])
            #expect(status.status == 0 && status.stdout.contains("1 (1 running)"), "\(status.stdout)\(status.stderr)")
            let leases = try Self.leases(address)
            #expect(leases.contains { $0["strategy"] as? String == "focus" }, "\(leases)")
            // The lease whose holder was on the old bus ended.
            #expect(!leases.contains { $0["id"] as? UInt64 == oldClientLease }, "\(leases)")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func itsOwnPrivateBusIsRestartedAtTheSameAddressFile() async throws {
            let dir = try TempDir("vigil-reconnect-private")
            let runtime = dir.file("runtime")
            try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true)
            chmod(runtime, 0o700)
            let state = dir.file("state")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: state, interval: "60s"))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["DBUS_SESSION_BUS_ADDRESS": "", "XDG_RUNTIME_DIR": runtime])
            defer { daemon.signal(SIGKILL) }
            let started = try await daemon.waitForLine(containing: "started a private dbus-daemon (pid ")
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 as ")
            let busPID = try #require(pidAfter("(pid ", in: started))
            let file = BusLocator.addressFile(stateDir: state, environment: ["XDG_RUNTIME_DIR": runtime])
            let before = try String(contentsOfFile: file, encoding: .utf8)

            #expect(kill(busPID, SIGKILL) == 0)
            try await daemon.waitForLine(containing: "lost the connection to")
            // What it says of the dead bus is what it then does.
            let died = try await daemon.waitForLine(containing: "the private dbus-daemon (pid \(busPID)) was killed by signal 9")
            // The bus service's lines carry the run, as the host's do.
            #expect(died.range(of: #"clients cannot reach this host until vigild has started a new one and reconnected run=[0-9a-f-]+$"#,
                               options: .regularExpression) != nil, "\(died)")
            let again = try await daemon.waitForLine(containing: "started a private dbus-daemon (pid ", after: 1)
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 again as ")
            #expect(pidAfter("(pid ", in: again) != busPID)
            let after = try String(contentsOfFile: file, encoding: .utf8)
            #expect(after != before, "the address file still names the dead bus")
            // vigilctl finds the host through the address file, as before.
            let status = try ProcessRunner.run(Build.vigilctl, ["status"], environment: ["DBUS_SESSION_BUS_ADDRESS": "", "XDG_RUNTIME_DIR": runtime, "PATH": "/usr/bin:/bin"])
            #expect(status.status == 0, "\(status.stdout)\(status.stderr)")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            #expect(!FileManager.default.fileExists(atPath: file))
        }
    }
}
