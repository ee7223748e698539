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
    
        /// A suspend forced past a lease's block inhibitor (the stand-in
        /// emits PrepareForSleep(true) as logind does for root's
        /// `systemctl suspend -i` or the lid switch, then (false)): vigild
        /// says so on every channel: a warning line, the survival log, the
        /// metric, and the SleepBrokeLease signal a third-party subscriber
        /// (gdbus monitor) receives.
        @Test func sleepThatBreaksALeaseIsToldEverywhere() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let standIn = try LogindStandInProcess(busAddress: bus.address)
            defer { standIn.stop() }

            let dir = try TempDir()
            let state = dir.file("state")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: state, extra: """
                bus = "\(bus.address)"
                power = "logind"

                [[strategy]]
                name = "focus"
                kind = "background-task"
                what = ["sleep"]
                budget = "3m"
                reason = "focus session"

                [metrics]
                listen = "127.0.0.1:0"
                """))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["DBUS_SYSTEM_BUS_ADDRESS": bus.address])
            defer { daemon.signal(SIGKILL) }
            let metricsLine = try await daemon.waitForLine(containing: "metrics on http://")
            _ = try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            func ask(_ member: String, _ args: [String] = []) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.freedesktop.login1",
                                                          "/org/freedesktop/login1", "org.vigil.Test.LogindStandIn", member] + args)
            }
            // A client's lease too: `vigilctl hold` is told on its stderr.
            let hold = try Daemon(arguments: ["hold", "--bus", bus.address, "--name", "backup", "--", "sleep", "120"], executable: [Build.vigilctl])
            defer { hold.signal(SIGKILL) }
            let held = try ask("WaitForCount", ["ut", "2", "5000000"])
            #expect(held.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "b true", "\(held.stdout)\(held.stderr)")

            // A subscriber that is not vigilctl: gdbus, line-buffered.
            let monitor = try Daemon(arguments: [bus.address], executable: [
                "/bin/sh", "-c", "exec stdbuf -oL /usr/bin/gdbus monitor --address \"$0\" --dest org.vigil.Vigil1 1>&2"])
            defer { monitor.signal(SIGKILL) }
            _ = try await monitor.waitForLine(containing: "is owned by")

            _ = try ask("EmitPrepareForSleep", ["b", "true"])
            _ = try ask("EmitPrepareForSleep", ["b", "false"])

            let signal = try await monitor.waitForLine(containing: "'focus session'")
            #expect(signal.contains("SleepBrokeLease") && signal.contains("'/org/vigil/Vigil1/Lease/"), "\(signal)")
            #expect(signal.contains("'focus'"), "\(signal)")
            #expect(signal.contains("'unknown'"), "no resume was seen, so the cause is unknown: \(signal)")
            let client = try await monitor.waitForLine(containing: "'backup'")
            #expect(client.contains("SleepBrokeLease") && client.contains("'client'"), "\(client)")
            let told = try await hold.waitForLine(containing: "the system slept")
            #expect(told.contains("held sleep (woken by unknown); the lease goes on"), "\(told)")

            let warning = try await daemon.waitForLine(containing: "although 2 leases held sleep")
            #expect(warning.contains("focus session") && warning.contains("backup"), "\(warning)")

            let port = metricsLine.split(separator: ":").last.flatMap { $0.split(separator: "/").first }.map(String.init) ?? ""
            let scrape = try ProcessRunner.run("/usr/bin/curl", ["-sf", "http://127.0.0.1:\(port)/metrics"])
            #expect(scrape.stdout.contains("vigil_sleep_broke_leases_total 1"), "\(scrape.stdout.prefix(400))")
            #expect(scrape.stdout.contains("vigil_broken_leases_total 2"))

            // The event is written in the next batch of the store (within 50 ms of the warning).
            daemon.signal(SIGTERM)
            _ = await daemon.waitForExit()
            let report = try ProcessRunner.run(Build.vigilctl, ["survival", "--state-dir", state, "--json"])
            #expect(report.stdout.contains("\"brokenSleeps\""), "\(report.stdout.prefix(2_000))")
            #expect(report.stdout.contains("\"holder\" : \"focus\""), "\(report.stdout.prefix(2_000))")
            let text = try ProcessRunner.run(Build.vigilctl, ["survival", "--state-dir", state])
            #expect(text.stdout.contains("SLEEP BROKE LEASES"), "\(text.stdout)")
            // Both leases, in id order (which of the two began first may race).
            #expect(text.stdout.contains("focus (focus session)") && text.stdout.contains("client (backup)") && text.stdout.contains(") held sleep"), "\(text.stdout)")
        }
}
}
