import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// The metrics as a fleet sees them: vigild's `/metrics` scraped by a real
/// Prometheus server (Debian `prometheus`) and queried through its HTTP API;
/// the textfile read by a real `prometheus-node-exporter`; the exposition,
/// alert rules and rule tests checked by `promtool`.
extension EndToEnd {
    @Suite(.serialized) struct MetricsEndToEndTests {
        @Test func prometheusFollowsLeasesKilledRunsAndFrozenGaps() async throws {
            let dir = try TempDir("vigil-metrics")
            let vigilPort = try freeLoopbackPort()
            let stop = dir.file("stop-job")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                listen = "127.0.0.1:\(vigilPort)"

                [[strategy]]
                name = "job"
                kind = "periodic-wake"
                every = "1h"
                run_at_start = true
                run = ["/bin/sh", "-c", "while [ ! -e \(stop) ]; do sleep 0.05; done"]
                run_timeout = "10m"
                """))
            var daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "heartbeat 1 written")
            let prometheus = try await TestPrometheus.start(dir: dir, target: "127.0.0.1:\(vigilPort)")
            defer { prometheus.stop() }

            // The exposition itself passes promtool's linter.
            let (status, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: vigilPort))
            #expect(status == 200)
            let lint = try ProcessRunner.run("/bin/sh", ["-c", "promtool check metrics < \(try dir.write("scrape.prom", String(decoding: body, as: UTF8.self)))"])
            #expect(lint.status == 0, "promtool check metrics: \(lint.stdout)\(lint.stderr)")

            // 1. A lease acquired, then released, as Prometheus sees it.
            #expect(try await prometheus.waitFor(#"vigil_leases{strategy="job",kind="periodic-wake"}"#) { $0 == 1 })
            #expect(try await prometheus.waitFor(#"vigil_lease_events_total{strategy="job",event="acquired"}"#) { $0 >= 1 })
            FileManager.default.createFile(atPath: stop, contents: nil)
            #expect(try await prometheus.waitFor(#"vigil_leases{strategy="job",kind="periodic-wake"}"#) { $0 == 0 })
            #expect(try await prometheus.waitFor(#"vigil_lease_events_total{strategy="job",event="released"}"#) { $0 >= 1 })
            // What the job cost: its lease held sleep off while it ran, its
            // command burnt some CPU; the cost rules record the share of time.
            #expect(try await prometheus.waitFor(#"vigil_strategy_sleep_held_seconds_total{strategy="job"}"#) { $0 > 0 })
            #expect(try await prometheus.waitFor(#"vigil_strategy_child_cpu_seconds_total{strategy="job"}"#) { $0 > 0 })
            #expect(try await prometheus.waitFor(#"instance_strategy:vigil_strategy_sleep_held_seconds_total:rate5m{strategy="job"}"#) { $0 > 0 })

            // 2. kill -9 and a restart: one more killed run.
            #expect(try await prometheus.waitFor(#"vigil_runs_total{end="killed"}"#) { $0 == 0 })
            daemon.signal(SIGKILL)
            _ = await daemon.waitForExit()
            #expect(try await prometheus.waitFor(#"up{job="vigil"}"#) { $0 == 0 })
            daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "heartbeat 1 written")
            #expect(try await prometheus.waitFor(#"vigil_runs_total{end="killed"}"#) { $0 == 1 })
            #expect(try await prometheus.waitFor(#"vigil_runs_total{end="running"}"#) { $0 == 1 })

            // 3. Frozen for several heartbeat intervals: a frozen gap.
            #expect(try await prometheus.waitFor(#"vigil_gaps_total{class="frozen"}"#) { $0 == 0 })
            let written = daemon.output.filter { $0.contains("written") }.count
            daemon.signal(SIGSTOP)
            // The stimulus under test: the host frozen for five 1 s intervals.
            try await Task.sleep(for: .seconds(5))
            daemon.signal(SIGCONT)
            try await daemon.waitForLine(containing: "written", after: written)
            #expect(try await prometheus.waitFor(#"vigil_gaps_total{class="frozen"}"#) { $0 == 1 })
            #expect(try await prometheus.waitFor(#"vigil_gap_seconds_total{class="frozen"}"#) { $0 >= 4 })

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            await prometheus.stopAndWait()
        }

        @Test func nodeExporterReadsTheTextfile() async throws {
            let dir = try TempDir("vigil-textfile")
            let textDir = dir.file("textfile")
            try FileManager.default.createDirectory(atPath: textDir, withIntermediateDirectories: true)
            let vigilPort = try freeLoopbackPort()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                textfile = "\(textDir)/vigil.prom"
                listen = "127.0.0.1:\(vigilPort)"
                """))
            let daemon = try Daemon(arguments: ["--config", config])
            // The textfile is written right after each heartbeat, so it is
            // there once the second heartbeat is.
            try await daemon.waitForLine(containing: "heartbeat 2 written")

            let exporterPort = try freeLoopbackPort()
            let exporter = try Daemon(arguments: [
                "--collector.disable-defaults", "--collector.textfile",
                "--collector.textfile.directory=\(textDir)", "--web.listen-address=127.0.0.1:\(exporterPort)",
            ], executable: ["/usr/bin/prometheus-node-exporter"])
            defer { exporter.signal(SIGTERM) }
            try await exporter.waitForLine(containing: "Listening on")
            let (status, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: exporterPort))
            #expect(status == 200)
            let text = String(decoding: body, as: UTF8.self)
            #expect(text.contains("node_textfile_scrape_error 0"), "\(text.prefix(2_000))")
            #expect(text.contains(#"vigil_runs_total{end="running"} 1"#))
            #expect(text.contains(#"vigil_leases{kind="client",strategy="client"} 0"#))

            // The same series as vigild's own endpoint.
            let (_, own) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: vigilPort))
            let ownSeries = seriesNames(String(decoding: own, as: UTF8.self))
            let exported = seriesNames(text).filter { $0.hasPrefix("vigil_") }
            #expect(!ownSeries.isEmpty && ownSeries == exported, "vigild: \(ownSeries.sorted())\nnode_exporter: \(exported.sorted())")

            // vigilctl metrics: from the endpoint the config names, then,
            // once vigild is gone, from the textfile.
            let live = try ProcessRunner.run(Build.vigilctl, ["metrics", "--config", config])
            #expect(live.status == 0, "\(live.stderr)")
            #expect(live.stdout.contains(#"vigil_runs_total{end="running"} 1"#))

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let after = try ProcessRunner.run(Build.vigilctl, ["metrics", "--config", config])
            #expect(after.status == 0)
            #expect(after.stderr.contains("printing [metrics] textfile instead"), "\(after.stderr)")
            #expect(after.stdout.contains(#"vigil_runs_total{end="stopped"} 1"#))
            let entries = try FileManager.default.contentsOfDirectory(atPath: textDir)
            #expect(entries == ["vigil.prom"], "only the textfile, no temporary left: \(entries)")
            // The last textfile, written at shutdown, says the run stopped.
            let last = try String(contentsOfFile: "\(textDir)/vigil.prom", encoding: .utf8)
            #expect(last.contains(#"vigil_runs_total{end="stopped"} 1"#), "\(last)")
        }

        /// A `[metrics] listen` port that is taken fails the start before the
        /// run begins: the socket is bound before the survival store opens
        /// and before any service runs, so vigild says why and exits 1
        /// with no run recorded.
        @Test func aTakenPortFailsTheStartBeforeTheRun() async throws {
            let dir = try TempDir("vigil-metrics-taken")
            let taken = try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0))
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                listen = "127.0.0.1:\(taken.port)"
                """))
            let daemon = try Daemon(arguments: ["--config", config])
            #expect(await daemon.waitForExit() == 1)
            let said = "cannot start: [metrics] listen = \"127.0.0.1:\(taken.port)\": bind: Address already in use"
            #expect(daemon.output.contains { $0.contains(said) }, "\(daemon.output)")
            #expect(!FileManager.default.fileExists(atPath: dir.file("state") + "/survival.sqlite"))
            withExtendedLifetime(taken) {}
        }

        @Test func promtoolAcceptsTheRulesAndTheirTests() throws {
            let rules = Build.packageRoot.appendingPathComponent("Configs/prometheus/vigil-alerts.yml").path
            let tests = Build.packageRoot.appendingPathComponent("Configs/prometheus/vigil-alerts.test.yml").path
            let check = try ProcessRunner.run("/usr/bin/promtool", ["check", "rules", rules])
            #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
            let test = try ProcessRunner.run("/usr/bin/promtool", ["test", "rules", tests], cwd: (tests as NSString).deletingLastPathComponent)
            #expect(test.status == 0, "\(test.stdout)\(test.stderr)")
            #expect(test.stdout.contains("SUCCESS"))
        }

        /// A strategy's LastError is one truth: its lease's TLS error (the
        /// broker's certificate is from another CA) shows, with when it was
        /// set, in `vigilctl strategies`, on D-Bus and in the metrics; once
        /// the broker presents a certificate that verifies and the lease
        /// reconnects, all three clear.
        @Test func lastErrorAgreesOnTheBusInVigilctlAndInTheMetrics() async throws {
            let dir = try makeTemporaryDirectory("vigil-last-error")
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let trusted = try TestCertificates(), other = try TestCertificates()
            defer { trusted.remove(); other.remove() }
            let tlsPort = try TestNginx.freePort()
            var broker = try TestMosquitto.start(in: dir, certificates: other, tlsPort: tlsPort)
            defer { broker.server.stop() }
            let vigilPort = try freeLoopbackPort()
            try await BusHost.with(strategies: """
                [metrics]
                listen = "127.0.0.1:\(vigilPort)"

                [[strategy]]
                name = "mq"
                kind = "voip-socket"
                connect = "127.0.0.1:\(tlsPort)"
                protocol = "mqtt"
                keepalive_interval = "30s"
                tls = true
                ca_file = "\(trusted.caCertificate)"
                reconnect = { initial = "200ms", max = "500ms" }
                [strategy.mqtt]
                client_id = "vigil-last-error"
                """) { host in
                let path = VigilAPI.strategyPath("mq")
                func busLastError() throws -> (String, UInt64) {
                    let error = try host.busctl(["get-property", BusHost.name, path, VigilAPI.strategyInterface, "LastError"]).stdout
                    let at = try host.busctl(["get-property", BusHost.name, path, VigilAPI.strategyInterface, "LastErrorAt"]).stdout
                    let text = error.trimmingCharacters(in: .whitespacesAndNewlines)
                    // `s "..."`: busctl quotes the string.
                    return (String(text.dropFirst(3).dropLast()), UInt64(at.trimmingCharacters(in: .whitespacesAndNewlines).dropFirst(2)) ?? 0)
                }
                /// The first StrategyStateChanged of "mq" (past or future)
                /// after its first `skip` ones whose last_error satisfies
                /// `condition`, and after which the bus's LastError does
                /// too (a signal from before the change the test waits for
                /// can match: the property is the truth); its place among
                /// them, and the bus's LastError and LastErrorAt then.
                func waitForBus(after skip: Int = 0, _ condition: @escaping @Sendable (String) -> Bool) async throws -> (Int, String, UInt64) {
                    var skip = skip
                    while true {
                        let seen = Counter()
                        do {
                            _ = try await host.signals.first { [skip] m in
                                guard m.member == "StrategyStateChanged", m.body.first == .objectPath(path), m.body.count == 3 else { return false }
                                guard seen.next() > skip, case .string(let e) = m.body[2] else { return false }
                                return condition(e)
                            }
                        } catch {
                            throw DaemonError("\(error)\nvigild said:\n\(host.daemon.output.suffix(30).joined(separator: "\n"))")
                        }
                        let (error, at) = try busLastError()
                        // The counter stands at the matching signal's place.
                        let place = seen.next() - 1
                        if condition(error) { return (place, error, at) }
                        skip = place
                    }
                }
                func agree(error: String, at: UInt64) throws {
                    let json = try host.vigilctl("strategies", ["--json"]).stdout
                    let rows = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]])
                    let row = try #require(rows.first { $0["name"] as? String == "mq" }, "\(json)")
                    #expect(row["lastError"] as? String == error, "\(json)")
                    #expect((row["lastErrorAt"] as? NSNumber)?.uint64Value == (at == 0 ? nil : at), "\(json)")
                    let table = try host.vigilctl("strategies").stdout
                    let mq = table.split(separator: "\n").first { $0.hasPrefix("mq ") }.map(String.init) ?? ""
                    #expect(error.isEmpty ? mq.contains("running         0  ") && mq.hasSuffix("  -") : mq.contains("\(error) ("), "\(table)")
                    let (_, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: vigilPort))
                    let metrics = String(decoding: body, as: UTF8.self)
                    #expect(metrics.contains("vigil_strategy_error{strategy=\"mq\"} \(error.isEmpty ? 0 : 1)"), "\(metrics)")
                    let stamp = metrics.split(separator: "\n").first { $0.hasPrefix("vigil_strategy_last_error_timestamp_seconds{strategy=\"mq\"} ") }
                    if at == 0 {
                        #expect(stamp == nil, "\(metrics)")
                    } else {
                        let seconds = stamp.flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
                        #expect(abs(seconds - Double(at) / 1e6) < 0.001, "\(String(describing: stamp)) vs \(at)")
                    }
                }
                // Broken: the lease's TLS error is the strategy's. The first
                // TLS failure can come before vigild is on the bus, and the
                // same error again changes nothing: then no signal says it,
                // and the property does (CI met that).
                let (errorNow, errorNowAt) = try busLastError()
                let (brokenPlace, broken, brokenAt) = errorNow.isEmpty ? try await waitForBus { !$0.isEmpty } : (0, errorNow, errorNowAt)
                #expect(broken.hasPrefix("lease ") && broken.contains("certificate"), "\(broken)")
                #expect(brokenAt > 0)
                try agree(error: broken, at: brokenAt)
                // Repaired: a broker whose certificate verifies, on the same port.
                broker.server.stop()
                broker = try TestMosquitto.start(in: dir, certificates: trusted, tlsPort: tlsPort)
                #expect(await broker.server.waitForLog("Sending CONNACK to vigil-last-error"), "\(broker.server.log)")
                let (_, repaired, repairedAt) = try await waitForBus(after: brokenPlace) { $0.isEmpty }
                #expect(repaired.isEmpty && repairedAt == 0, "\(repaired) \(repairedAt)")
                try agree(error: "", at: 0)
            }
        }

        @Test func rulesAndDashboardUseOnlyMetricsVigildExports() async throws {
            let dir = try TempDir("vigil-metric-names")
            let vigilPort = try freeLoopbackPort()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                listen = "127.0.0.1:\(vigilPort)"
                """))
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "heartbeat 1 written")
            let (_, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: vigilPort))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            var known = Set(seriesNames(String(decoding: body, as: UTF8.self)).map(Self.family))
            // Families that appear only once a strategy of their kind has
            // leases or events (docs/metrics.md lists them all).
            known.formUnion(Self.strategyFamilies)

            let folder = Build.packageRoot.appendingPathComponent("Configs/prometheus")
            let dashboard = try Data(contentsOf: folder.appendingPathComponent("vigil-dashboard.json"))
            #expect((try JSONSerialization.jsonObject(with: dashboard)) is [String: Any])
            let docs = try String(contentsOf: Build.packageRoot.appendingPathComponent("docs/metrics.md"), encoding: .utf8)
            for file in ["vigil-alerts.yml", "vigil-dashboard.json"] {
                let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
                let used = Set(text.matches(of: /vigil_[a-z_]+/).map { Self.family(String($0.output)) })
                #expect(!used.isEmpty)
                #expect(used.subtracting(known).isEmpty, "\(file) uses unknown metrics: \(used.subtracting(known).sorted())")
                for name in used { #expect(docs.contains("`\(name)`"), "docs/metrics.md does not list \(name)") }
            }
        }

        static let strategyFamilies: Set<String> = [
            "vigil_strategy_up", "vigil_strategy_restarts_total", "vigil_voip_pings_total", "vigil_voip_late_pings_total",
            "vigil_voip_overruns_total", "vigil_voip_reconnects_total", "vigil_voip_rtt_seconds", "vigil_download_bytes",
            "vigil_download_retries_total", "vigil_download_completed_total", "vigil_download_hash_failures_total",
            "vigil_download_failures_total", "vigil_audio_underruns_total", "vigil_audio_streams_playing",
            "vigil_audio_lost_total", "vigil_strategy_failures_total", "vigil_client_leases",
            "vigil_strategy_error", "vigil_strategy_last_error_timestamp_seconds",
        ]

        /// A histogram's family name for its `_bucket`, `_sum` and `_count` series.
        static func family(_ name: String) -> String {
            ["vigil_wake_lateness_seconds", "vigil_voip_rtt_seconds"].first { name.hasPrefix($0 + "_") } ?? name
        }
    }
}

/// The series names (metric name and labels, no value) in an exposition.
func seriesNames(_ exposition: String) -> Set<String> {
    Set(exposition.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { line in
        line.split(separator: " ").first.map { String($0.prefix { $0 != "{" }) }
    })
}

/// A loopback TCP port nobody listens on now (the kernel's choice, bound
/// and released again).
func freeLoopbackPort() throws -> UInt16 {
    try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0)).port
}

/// A Prometheus server on loopback with its data in a temporary directory,
/// scraping one target every second.
final class TestPrometheus: Sendable {
    let process: Daemon
    let port: UInt16

    private init(process: Daemon, port: UInt16) {
        self.process = process
        self.port = port
    }

    static func start(dir: TempDir, target: String) async throws -> TestPrometheus {
        // The project's rules, evaluated every second: the recording rules
        // the dashboard's cost panels read must work on what vigild exports.
        let rules = Build.packageRoot.appendingPathComponent("Configs/prometheus/vigil-alerts.yml").path
        let config = try dir.write("prometheus.yml", """
            global:
              scrape_interval: 1s
              scrape_timeout: 900ms
              evaluation_interval: 1s
            rule_files:
              - "\(rules)"
            scrape_configs:
              - job_name: vigil
                static_configs:
                  - targets: ["\(target)"]
            """)
        let port = try freeLoopbackPort()
        let process = try Daemon(arguments: [
            "--config.file=\(config)", "--storage.tsdb.path=\(dir.file("prometheus-data"))",
            "--web.listen-address=127.0.0.1:\(port)", "--query.lookback-delta=3s",
        ], executable: ["/usr/bin/prometheus"])
        let prometheus = TestPrometheus(process: process, port: port)
        do {
            try await process.waitForLine(containing: "Server is ready to receive web requests", timeout: .seconds(60))
        } catch {
            prometheus.stop()
            throw DaemonError("prometheus did not start: \(error)\n\(process.output.suffix(20).joined(separator: "\n"))")
        }
        return prometheus
    }

    /// The value of an instant query with one result, or nil when it has none.
    func query(_ expression: String) throws -> Double? {
        var components = URLComponents()
        components.path = "/api/v1/query"
        components.queryItems = [URLQueryItem(name: "query", value: expression)]
        let pathAndQuery = components.percentEncodedPath + "?" + (components.percentEncodedQuery ?? "")
            .replacingOccurrences(of: "+", with: "%2B")
        let (status, body) = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: port), path: pathAndQuery)
        guard status == 200,
              let json = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
              let data = json["data"] as? [String: Any], let result = data["result"] as? [[String: Any]] else {
            throw DaemonError("query \(expression): HTTP \(status): \(String(decoding: body.prefix(500), as: UTF8.self))")
        }
        guard result.count == 1, let value = result[0]["value"] as? [Any], let text = value.last as? String else { return nil }
        return Double(text)
    }

    /// Re-runs the query (Prometheus scrapes every second) until `condition`
    /// holds for its value; false after `timeout`.
    func waitFor(_ expression: String, timeout: Duration = .seconds(30), _ condition: (Double) -> Bool) async throws -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        var last: Double?
        while clock.now < deadline {
            last = try query(expression)
            if let last, condition(last) { return true }
            try await Task.sleep(for: .milliseconds(250))
        }
        Issue.record("\(expression) is still \(last.map { String($0) } ?? "absent") after \(timeout)")
        return false
    }

    func stop() {
        process.signal(SIGTERM)
    }

    /// Stops the server and waits for it, before its data directory goes.
    func stopAndWait() async {
        stop()
        _ = await process.waitForExit()
    }
}
