import Foundation
import Testing
import VigilHost
import VigilTestSupport

/// vigilctl status / leases / strategies / reload against a real vigild on
/// a private bus, and the message when no vigild answers.
extension EndToEnd {
    @Suite(.serialized) struct VigilctlBusTests {
        static func json(_ text: String) throws -> Any {
            try JSONSerialization.jsonObject(with: Data(text.utf8))
        }

        @Test func statusLeasesAndStrategies() async throws {
            try await BusHost.with { host in
                let leasePath = try await host.leasePath(strategy: "mail-sync")

                let status = try host.vigilctl("status", ["--json"])
                #expect(status.status == 0, "\(status.stderr)")
                let s = try #require(try Self.json(status.stdout) as? [String: Any], "\(status.stdout)")
                #expect(s["version"] as? String == VigilVersion.string)
                #expect(s["configPath"] as? String == host.configPath)
                #expect(s["strategies"] as? Int == 2)
                #expect((s["leases"] as? Int ?? 0) >= 1)
                #expect(s["powerBackend"] as? String == "none")
                #expect((s["wakeClock"] as? String ?? "").hasPrefix("CLOCK_BOOTTIME"))
                #expect((s["runId"] as? String ?? "").count == 36)
                let started = try #require(s["startedAt"] as? UInt64)
                let now = UInt64(Date().timeIntervalSince1970 * 1_000_000)
                #expect(started <= now && now - started < 120_000_000, "StartedAt \(started) is not this run's start (now \(now))")
                // The run id is the one in the survival log.
                let survival = try ProcessRunner.run(Build.vigilctl, ["survival", "--json", "--state-dir", host.stateDir])
                #expect(survival.stdout.contains(s["runId"] as? String ?? "?"))

                let text = try host.vigilctl("status")
                #expect(text.status == 0, "\(text.stderr)")
                for label in ["run id:", "started:", "alive:", "power backend:", "wake clock:", "config:", "strategies:", "leases:"] {
                    #expect(text.stdout.contains(label), "status lacks \(label):\n\(text.stdout)")
                }
                #expect(text.stdout.hasPrefix("vigild \(VigilVersion.string) on the bus at \(host.address)\n"), "\(text.stdout)")
                #expect(text.stdout.contains(host.configPath))

                let leases = try host.vigilctl("leases", ["--json"])
                #expect(leases.status == 0, "\(leases.stderr)")
                let list = try #require(try Self.json(leases.stdout) as? [[String: Any]], "\(leases.stdout)")
                let hold = try #require(list.first { $0["path"] as? String == leasePath }, "\(leases.stdout)")
                #expect(hold["strategy"] as? String == "mail-sync")
                #expect(hold["kind"] as? String == "periodic-wake")
                #expect(hold["holds"] as? String == "command /bin/sleep")
                #expect(hold["reason"] as? String == "periodic-wake run #1")
                #expect(hold["state"] as? String == "active")
                #expect(hold["renewals"] as? Int == 0)
                #expect("\(BusHost.root)/Lease/\(hold["id"] as? UInt64 ?? 0)" == leasePath)
                // Budget: run_timeout 300 s + 5 s, so the deadline is about 305 s after acquisition.
                let acquired = try #require(hold["acquiredAt"] as? UInt64)
                let deadline = try #require(hold["deadline"] as? UInt64)
                #expect(deadline - acquired == 305_000_000, "deadline \(deadline) acquired \(acquired)")
                #expect((hold["remainingUsec"] as? Int ?? 0) > 200_000_000)

                let table = try host.vigilctl("leases")
                let header = try #require(table.stdout.split(separator: "\n").first.map(String.init))
                #expect(header.split(separator: " ") == ["ID", "STRATEGY", "HOLDS", "REASON", "AGE", "DEADLINE", "RENEWALS", "STATE"], "\(table.stdout)")
                let row = try #require(table.stdout.split(separator: "\n").first { $0.contains("mail-sync") }.map(String.init), "\(table.stdout)")
                // The deadline is ~305 s after acquisition: "in 5m", or "in 4m5xs" when the machine is slow.
                #expect(row.contains("command /bin/sleep") && row.contains("periodic-wake run #1")
                        && (row.contains("in 5m") || row.contains("in 4m5")) && row.hasSuffix("active"), "\(row)")

                let strategies = try host.vigilctl("strategies", ["--json"])
                #expect(strategies.status == 0, "\(strategies.stderr)")
                let rows = try #require(try Self.json(strategies.stdout) as? [[String: Any]], "\(strategies.stdout)")
                #expect(rows.compactMap { $0["name"] as? String }.sorted() == ["mail-sync", "tick"])
                for r in rows {
                    #expect(r["kind"] as? String == "periodic-wake")
                    #expect(r["state"] as? String == "running")
                    #expect(r["restarts"] as? Int == 0)
                    #expect(r["lastError"] as? String == "")
                }
                for r in rows {
                    // The cost properties; what the numbers are is CostEndToEndTests'.
                    let cost = try #require(r["cost"] as? [String: Any], "\(strategies.stdout)")
                    #expect(Set(cost.keys) == ["wakeups", "systemWakes", "sleepHeldUsec", "idleHeldUsec", "childCPUUsec", "bytesSent", "bytesReceived"])
                }
                let strategyTable = try host.vigilctl("strategies")
                let heading = strategyTable.stdout.split(separator: "\n").first.map(String.init) ?? ""
                #expect(heading.components(separatedBy: "  ").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                        == ["NAME", "KIND", "STATE", "RESTARTS", "SLEEP HELD", "IDLE HELD", "WAKEUPS", "SYS WAKES", "CPU", "SENT", "RECEIVED", "LAST ERROR"],
                        "\(strategyTable.stdout)")
                let mail = strategyTable.stdout.split(separator: "\n").first { $0.hasPrefix("mail-sync ") }.map(String.init) ?? ""
                #expect(mail.hasPrefix("mail-sync  periodic-wake  running         0  ") && mail.hasSuffix("0B  -"), "\(strategyTable.stdout)")
            }
        }

        @Test func reloadAppliesAValidConfigAndRefusesAnInvalidOne() async throws {
            try await BusHost.with { host in
                let same = try host.vigilctl("reload", ["--json"])
                #expect(same.status == 0, "\(same.stdout)\(same.stderr)")
                let outcome = try #require(try Self.json(same.stdout) as? [String: Any])
                #expect(outcome["applied"] as? Bool == true)

                // An invalid config: nothing changes, the problems name the file.
                let original = try String(contentsOfFile: host.configPath, encoding: .utf8)
                try (original + "\n[[strategy]]\nname = \"broken\"\nkind = \"periodic-wake\"\nevery = \"soon\"\n")
                    .write(toFile: host.configPath, atomically: true, encoding: .utf8)
                let bad = try host.vigilctl("reload")
                #expect(bad.status == 1)
                #expect(bad.stderr.contains("not applied"), "\(bad.stderr)")
                #expect(bad.stderr.contains("\(host.configPath):"), "\(bad.stderr)")
                #expect(bad.stderr.contains("every"), "\(bad.stderr)")
                let badJSON = try host.vigilctl("reload", ["--json"])
                #expect(badJSON.status == 1)
                let refused = try #require(try Self.json(badJSON.stdout) as? [String: Any], "\(badJSON.stdout)")
                #expect(refused["applied"] as? Bool == false)
                #expect(!(refused["messages"] as? [String] ?? []).isEmpty)
                let unchanged = try host.vigilctl("strategies", ["--json"])
                #expect((try Self.json(unchanged.stdout) as? [[String: Any]])?.count == 2)

                // A valid config with one more strategy: it starts.
                try (original + """

                    [[strategy]]
                    name = "added later"
                    kind = "periodic-wake"
                    every = "1h"
                    run = ["/bin/true"]
                    """).write(toFile: host.configPath, atomically: true, encoding: .utf8)
                let good = try host.vigilctl("reload")
                #expect(good.status == 0, "\(good.stdout)\(good.stderr)")
                #expect(good.stdout.hasPrefix("Config reloaded"), "\(good.stdout)")
                #expect(good.stdout.contains("added later"), "\(good.stdout)")
                let after = try host.vigilctl("strategies", ["--json"])
                let names = (try Self.json(after.stdout) as? [[String: Any]])?.compactMap { $0["name"] as? String }.sorted()
                #expect(names == ["added later", "mail-sync", "tick"], "\(after.stdout)")
                // Its object path escapes the blank.
                let tree = try host.busctl(["tree", BusHost.name])
                #expect(tree.stdout.contains("\(BusHost.root)/Strategy/added_20later"), "\(tree.stdout)")
            }
        }

        @Test func leasesWatchPrintsSignalsAsTheyHappen() async throws {
            try await BusHost.with { host in
                let watchJSON = try StreamingTool(Build.vigilctl, ["leases", "--watch", "--json", "--bus", host.address])
                defer { watchJSON.stop() }
                let first = try await watchJSON.waitForLine(containing: "\"strategy\":\"mail-sync\"")
                #expect(first.contains("\"state\":\"active\"") && first.contains("\"event\":\"listed\""), "\(first)")
                let acquired = try await watchJSON.waitForLine(containing: "\"event\":\"acquired\"")
                let event = try #require(try Self.json(acquired) as? [String: Any], "\(acquired)")
                #expect(event["strategy"] as? String == "tick")
                #expect(event["holds"] as? String == "command /bin/true")
                let id = try #require(event["id"] as? UInt64)
                #expect(event["lease"] as? String == "\(BusHost.root)/Lease/\(id)")
                let released = try await watchJSON.waitForLine(containing: "\"event\":\"released\"")
                #expect(released.contains("\"lease\":\"\(BusHost.root)/Lease/"), "\(released)")

                let watchText = try StreamingTool(Build.vigilctl, ["leases", "--watch", "--bus", host.address])
                defer { watchText.stop() }
                try await watchText.waitForLine(containing: "Watching lease signals")
                let line = try await watchText.waitForLine(containing: "acquired")
                #expect(line.contains("strategy tick") && line.contains("holds \"command /bin/true\""), "\(line)")
                try await watchText.waitForLine(containing: "released")

                // When vigild leaves the bus, --watch says so and exits 1.
                host.daemon.signal(SIGTERM)
                #expect(await host.daemon.waitForExit() == 0)
                watchText.process.waitUntilExit()
                #expect(watchText.process.terminationStatus == 1)
                #expect(watchText.stop().contains("vigild left"))
            }
        }

        @Test func noHostGivesOneClearMessage() async throws {
            // A bus with no vigild on it.
            let bus = try PrivateBusDaemon()
            defer { bus.stop() }
            for command in ["status", "leases", "strategies", "reload"] {
                let result = try ProcessRunner.run(Build.vigilctl, [command, "--bus", bus.address])
                #expect(result.status == 1, "\(command)")
                #expect(result.stderr == "vigilctl \(command): no vigild is running on the bus at \(bus.address) (org.vigil.Vigil1 has no owner); start it with Scripts/run or vigild --config FILE\n", "\(result.stderr)")
                #expect(result.stdout.isEmpty)
            }
            // No session bus at all, and no address file from a vigild.
            let dir = try TempDir()
            var environment = ProcessInfo.processInfo.environment
            environment["DBUS_SESSION_BUS_ADDRESS"] = nil
            environment["XDG_RUNTIME_DIR"] = nil
            let none = try ProcessRunner.run(Build.vigilctl, ["status", "--state-dir", dir.path], environment: environment)
            #expect(none.status == 1)
            #expect(none.stderr.hasPrefix("vigilctl status: no vigild is running on the session bus"), "\(none.stderr)")
            #expect(none.stderr.contains("\(dir.path)/bus"), "\(none.stderr)")
            #expect(none.stderr.split(separator: "\n").count == 1)
            // A socket nobody listens on.
            let gone = try ProcessRunner.run(Build.vigilctl, ["leases", "--bus", "unix:path=\(dir.path)/nothing"])
            #expect(gone.status == 1)
            #expect(gone.stderr.hasPrefix("vigilctl leases: no vigild is running on the bus at unix:path=\(dir.path)/nothing: cannot connect"), "\(gone.stderr)")
        }
    }
}
