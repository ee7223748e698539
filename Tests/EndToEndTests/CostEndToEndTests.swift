import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// What each strategy costs, end to end: a periodic-wake whose command
/// burns CPU and a background-task lease held for a known time, against a
/// real vigild on a private bus. The D-Bus properties, `vigilctl
/// strategies --json`, `vigilctl cost --json` and the metrics agree, and
/// each agrees with an independent measure: the child's own rusage as
/// `/usr/bin/time` reports it, the lease's acquired and released times in
/// the survival log, and the wake scheduler's own count of its timer
/// expirations.
extension EndToEnd {
    @Suite(.serialized) struct CostEndToEndTests {
        /// Burns at least 0.3 s of CPU in user space.
        static let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"

        @Test func costAgreesEverywhereAndWithIndependentMeasures() async throws {
            let dir = try TempDir("vigil-cost")
            let go = dir.file("go")
            let times = dir.file("time.out")
            FileManager.default.createFile(atPath: go, contents: Data())
            let port = try freeLoopbackPort()
            try await BusHost.with(strategies: """
                [metrics]
                listen = "127.0.0.1:\(port)"

                [[strategy]]
                name = "burn"
                kind = "periodic-wake"
                every = "2s"
                tolerance = "100ms"
                run = ["/usr/bin/time", "-a", "-o", "\(times)", "-f", "%U %S", "/usr/bin/python3", "-c", "\(Self.burn.replacingOccurrences(of: "\n", with: "\\n"))"]
                run_timeout = "30s"
                when = { file_exists = "\(go)" }

                [[strategy]]
                name = "task"
                kind = "background-task"
                command = ["/bin/sleep", "3"]
                """) { host in
                do {
                    // The burn runs twice; the task's lease comes and goes
                    // once (maybe before vigild is on the bus: then its
                    // strategy is finished already).
                    for run in 0..<2 {
                        let lease = try await host.leaseAcquired(strategy: "burn", after: run)
                        _ = try await host.signals.first(timeout: .seconds(30)) { $0.member == "LeaseReleased" && $0.body.first == .objectPath(lease) }
                    }
                    // A D-Bus client's lease (BeginBackgroundTask) around a second of sleep.
                    let hold = try host.vigilctl("hold", ["--why", "cost test", "--", "/bin/sleep", "1"])
                    #expect(hold.status == 0, "\(hold.stderr)")
                    // The burn stops (its condition no longer holds): nothing moves from here on.
                    try FileManager.default.removeItem(atPath: go)
                    let burnPath = VigilAPI.strategyPath("burn")
                    _ = try await host.signals.first { m in
                        m.member == "StrategyStateChanged" && m.body.first == .objectPath(burnPath) && m.body.count == 3 && m.body[1] == .string("waiting")
                    }
                    let taskPath = VigilAPI.strategyPath("task")
                    let states = try JSONSerialization.jsonObject(with: Data(try host.vigilctl("strategies", ["--json"]).stdout.utf8)) as? [[String: Any]]
                    if states?.first(where: { $0["name"] as? String == "task" })?["state"] as? String != "finished" {
                        _ = try await host.signals.first { m in
                            m.member == "StrategyStateChanged" && m.body.first == .objectPath(taskPath) && m.body.count == 3 && m.body[1] == .string("finished")
                        }
                    }
                } catch {
                    throw DaemonError("\(error)\nvigild said:\n\(host.daemon.output.suffix(40).joined(separator: "\n"))")
                }

                // D-Bus: the cost properties of each strategy object.
                func bus(_ name: String) async throws -> StrategyCostRow {
                    let reply = try await host.watcher.call(
                        destination: BusHost.name, path: VigilAPI.strategyPath(name), interface: "org.freedesktop.DBus.Properties",
                        member: "GetAll", arguments: [.string(VigilAPI.strategyInterface)])
                    let all = try reply.argument(0, as: [String: DBusVariant].self)
                    return try StrategyCostRow(properties: all.mapValues(\.value))
                }
                let burn = try await bus("burn"), task = try await bus("task")

                // vigilctl strategies --json.
                let listed = try host.vigilctl("strategies", ["--json"])
                #expect(listed.status == 0, "\(listed.stderr)")
                let rows = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
                func vigilctlCost(_ name: String) throws -> StrategyCostRow {
                    let row = try #require(rows.first { $0["name"] as? String == name }, "\(listed.stdout)")
                    let cost = try #require(row["cost"] as? [String: Any], "\(listed.stdout)")
                    return try JSONDecoder().decode(StrategyCostRow.self, from: JSONSerialization.data(withJSONObject: cost))
                }
                #expect(try vigilctlCost("burn") == burn)
                #expect(try vigilctlCost("task") == task)

                // The metrics.
                let (_, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: port))
                let metrics = String(decoding: body, as: UTF8.self)
                func metric(_ series: String) throws -> Double {
                    let line = try #require(metrics.split(separator: "\n").first { $0.hasPrefix(series + " ") }, "no \(series) in\n\(metrics)")
                    return try #require(Double(line.split(separator: " ").last ?? ""))
                }
                for (name, cost) in [("burn", burn), ("task", task)] {
                    let label = "{strategy=\"\(name)\"}"
                    #expect(try metric("vigil_strategy_wakeups_total" + label) == Double(cost.wakeups))
                    #expect(try metric("vigil_strategy_system_wakes_total" + label) == Double(cost.systemWakes))
                    #expect(abs(try metric("vigil_strategy_sleep_held_seconds_total" + label) - Double(cost.sleepHeldUsec) / 1e6) < 1e-6)
                    #expect(abs(try metric("vigil_strategy_idle_held_seconds_total" + label) - Double(cost.idleHeldUsec) / 1e6) < 1e-6)
                    #expect(abs(try metric("vigil_strategy_child_cpu_seconds_total" + label) - Double(cost.childCPUUsec) / 1e6) < 1e-6)
                    #expect(try metric("vigil_strategy_network_bytes_total{strategy=\"\(name)\",direction=\"sent\"}") == Double(cost.bytesSent))
                }

                // Against /usr/bin/time: the burn's two runs, as each child reported its own rusage.
                let reported = try String(contentsOfFile: times, encoding: .utf8).split(separator: "\n").map {
                    $0.split(separator: " ").compactMap { Double($0) }.reduce(0, +)
                }
                #expect(reported.count == 2, "\(reported)")
                let cpu = Double(burn.childCPUUsec) / 1e6
                // time prints 10 ms steps; its own few ms come on top.
                #expect(cpu >= 0.6 && abs(cpu - reported.reduce(0, +)) < 0.05, "ChildCPUUsec \(cpu) s, /usr/bin/time \(reported)")
                #expect(task.childCPUUsec < 50_000, "sleep burns next to nothing: \(task.childCPUUsec)")

                // Against the lease's acquired and released times (boottime, as the survival log records them).
                let events = try ProcessRunner.run("/usr/bin/sqlite3", [
                    "-readonly", host.stateDir + "/survival.sqlite",
                    "SELECT name, boot FROM event WHERE strategy = 'task' AND name IN ('lease-acquired', 'lease-released') ORDER BY id",
                ])
                let spans = events.stdout.split(separator: "\n").map { $0.split(separator: "|") }
                #expect(spans.map { String($0[0]) } == ["lease-acquired", "lease-released"], "\(events.stdout)\(events.stderr)")
                let held = (Int64(spans.last?[1] ?? "") ?? 0) - (Int64(spans.first?[1] ?? "") ?? 0)
                #expect(held >= 3_000_000 && abs(Int64(task.sleepHeldUsec) - held) < 5_000, "SleepHeldUsec \(task.sleepHeldUsec), log \(held)")
                #expect(task.idleHeldUsec == 0 && task.wakeups == 0)
                // The client's lease: no strategy object, the same figure in the metrics.
                let clientEvents = try ProcessRunner.run("/usr/bin/sqlite3", [
                    "-readonly", host.stateDir + "/survival.sqlite",
                    "SELECT boot FROM event WHERE strategy = 'client' AND name IN ('lease-acquired', 'lease-released') ORDER BY id",
                ]).stdout.split(separator: "\n").compactMap { Int64($0) }
                #expect(clientEvents.count == 2, "\(clientEvents)")
                let clientHeld = (clientEvents.last ?? 0) - (clientEvents.first ?? 0)
                let clientMetric = try metric("vigil_strategy_sleep_held_seconds_total{strategy=\"client\"}")
                #expect(clientHeld >= 1_000_000 && abs(clientMetric - Double(clientHeld) / 1e6) < 0.005, "metric \(clientMetric) s, log \(clientHeld) µs")

                // Against the scheduler's own statistics: only the burn
                // waits on timers here (the first heartbeat is a minute away).
                let expirations = try metric("vigil_wake_timer_expirations_total")
                #expect(burn.wakeups == 2 && Double(burn.wakeups) == expirations, "burn \(burn.wakeups), scheduler \(expirations)")
                #expect(try metric("vigil_wakeups_total") == expirations)

                // vigilctl cost --json: the survival log's per-run figures, written at the run's end.
                host.daemon.signal(SIGTERM)
                #expect(await host.daemon.waitForExit() == 0)
                let report = try ProcessRunner.run(Build.vigilctl, ["cost", "--json", "--state-dir", host.stateDir])
                #expect(report.status == 0, "\(report.stderr)")
                let stored = try JSONDecoder().decode(CostReport.self, from: Data(report.stdout.utf8))
                #expect(stored.runs == 1 && stored.runsWithoutCost == 0)
                // Sorted by time holding sleep off. Which comes first is not
                // fixed: the task holds 3 s, but the burn's two runs of 0.3 s
                // of CPU hold 1 to 5 s between them, by how busy the machine
                // is (a stress run saw 4.6 s).
                #expect(Set(stored.strategies.map(\.strategy)) == ["task", "burn", "client"], "\(report.stdout)")
                let storedHeld = stored.strategies.map(\.cost.sleepHeldUsec)
                #expect(storedHeld == storedHeld.sorted(by: >), "\(report.stdout)")
                let client = stored.strategies.first { $0.strategy == "client" }?.cost.sleepHeldUsec ?? 0
                #expect(abs(Double(client) / 1e6 - clientMetric) < 1e-6, "stored \(client), metric \(clientMetric)")
                #expect(stored.strategies.first { $0.strategy == "burn" }?.cost == burn)
                #expect(stored.strategies.first { $0.strategy == "task" }?.cost == task)
                let table = try ProcessRunner.run(Build.vigilctl, ["cost", "--state-dir", host.stateDir, "--since", "1h"])
                #expect(table.stdout.contains("STRATEGY") && table.stdout.contains("SLEEP HELD"), "\(table.stdout)")
            }
        }
    }
}
