import Foundation
import Testing
import VigilTestSupport

extension EndToEnd {
    /// vigild with `power = "logind"` against the logind stand-in on a
    /// private bus used as the system bus (logind needs systemd as PID 1).
    @Suite(.serialized) struct PowerEndToEndTests {
        @Test func inhibitorEndsWhenTheHostIsKilled() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let standIn = try LogindStandInProcess(busAddress: bus.address)
            defer { standIn.stop() }

            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """
                bus = "\(bus.address)"
                power = "logind"

                [[strategy]]
                name = "focus"
                kind = "background-task"
                what = ["sleep", "idle"]
                budget = "3m"
                reason = "focus session"
                """))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            // The reason is on the debug line (the start-up notice names the backend only).
            let started = try await daemon.waitForLine(containing: "power backend logind (")
            #expect(started.contains("power = \"logind\" in [host]"))

            func standInCall(_ interface: String, _ member: String, _ args: [String] = []) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.login1",
                                                   "/org/freedesktop/login1", interface, member] + args)
            }
            let test = "org.vigil.Test.LogindStandIn", manager = "org.freedesktop.login1.Manager"
            let waitOne = try standInCall(test, "WaitForCount", ["ut", "1", "5000000"])
            #expect(waitOne.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "b true", "\(waitOne.stdout)\(waitOne.stderr)")
            let list = try standInCall(manager, "ListInhibitors")
            #expect(list.stdout.contains("\"sleep:idle\" \"vigil: focus\" \"focus session\" \"block\""), "\(list.stdout)")

            // kill -9: the kernel closes the host's fd, and logind drops the inhibitor.
            daemon.signal(SIGKILL)
            _ = await daemon.waitForExit()
            let waitZero = try standInCall(test, "WaitForCount", ["ut", "0", "5000000"])
            #expect(waitZero.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "b true", "\(waitZero.stdout)\(waitZero.stderr)")
        }

        /// `[host] on_sleep` runs under a delay lock: the stand-in's sleep
        /// waits until the hook finished, and the hook's output exists by then.
        @Test func onSleepRunsBeforeTheSystemSleeps() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let standIn = try LogindStandInProcess(busAddress: bus.address)
            defer { standIn.stop() }

            let dir = try TempDir()
            let marker = dir.file("slept")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """
                bus = "\(bus.address)"
                power = "logind"
                on_sleep = ["sh", "-c", "sleep 0.3; echo $VIGIL_EVENT > \(marker)"]
                on_sleep_timeout = "4s"
                """))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            defer { daemon.signal(SIGKILL) }
            _ = try await daemon.waitForLine(containing: "on_sleep runs before each sleep")
            let sleep = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.login1",
                                                          "/org/freedesktop/login1", "org.vigil.Test.LogindStandIn", "SimulateSleep", "t", "5000000"])
            let fields = sleep.stdout.split(separator: " ").map(String.init)
            #expect(fields.count == 3 && fields[0] == "tb", "\(sleep.stdout)\(sleep.stderr)")
            let waited = fields.count == 3 ? UInt64(fields[1]) ?? 0 : 0
            #expect(waited >= 300_000, "the sleep waited for on_sleep: \(sleep.stdout)")
            #expect(fields.last?.trimmingCharacters(in: .whitespacesAndNewlines) == "false", "not timed out: \(sleep.stdout)")
            #expect((try? String(contentsOfFile: marker, encoding: .utf8)) == "sleep\n", "on_sleep finished before the system slept")
            // After resume the delay lock is taken again (the only inhibitor
            // here), so the next sleep waits too.
            let relocked = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.login1",
                                                             "/org/freedesktop/login1", "org.vigil.Test.LogindStandIn", "WaitForCount", "ut", "1", "5000000"])
            #expect(relocked.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "b true", "\(relocked.stdout)")
            let again = try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.login1",
                                                          "/org/freedesktop/login1", "org.vigil.Test.LogindStandIn", "SimulateSleep", "t", "5000000"])
            let waitedAgain = UInt64(again.stdout.split(separator: " ").dropFirst().first ?? "") ?? 0
            #expect(waitedAgain >= 300_000, "\(again.stdout)\(again.stderr)")
        }
    }
}
