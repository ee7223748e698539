import Foundation
import Testing
@testable import VigilHost
@testable import VigilSurvival
import VigilKit
import VigilKitTesting

/// The metrics component: bounded labels, counting, the `[metrics]` table,
/// and the exposition-only listener, against real sockets and `promtool`.
@Suite struct MetricsTests {
    /// 10 KiB with quotes, backslashes, newlines and a terminal escape.
    static let hostile = "evil\"} 1\nvigil_fake 1\n\\\u{1b}[2J" + String(repeating: "x\"\\\n", count: 2_560)

    static func snapshot(strategies: [StrategyStatus] = [], leases: LeaseTotals) -> HostMetrics.Snapshot {
        HostMetrics.Snapshot(
            version: "0.1.0", upSeconds: 12, powerBackend: "none", wakeClock: "CLOCK_BOOTTIME", canWakeSystem: false,
            strategies: strategies, leases: leases,
            survival: SurvivalTotals(runs: [.running: 1, .killed: 2], suspends: 1, suspendedMicros: 3_000_000, stalls: 1, stalledMicros: 5_000_000, lastHeartbeatWallMicros: 1_700_000_000_000_000))
    }

    @Test func aHostileClientLeaseNameNeverBecomesALabelAndPromtoolAcceptsTheExposition() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let metrics = HostMetrics()
        await registry.observe(metrics)
        for uid in 0..<3 as Range<UInt32> {
            try await registry.acquire(strategy: ClientLeases.strategyName, LeaseRequest(holds: Self.hostile, reason: Self.hostile),
                                       client: ClientIdentity(owner: ":1.\(uid)", uid: uid, pid: 1, name: Self.hostile))
        }
        // A strategy name from a config is a label: cut and escaped.
        let weird = StrategyStatus(name: Self.hostile, kind: "periodic-wake", state: .running, restarts: 2, lastError: nil, startedAt: nil)
        let text = String(decoding: metrics.exposition(Self.snapshot(strategies: [weird], leases: LeaseTotals(await registry.active))), as: UTF8.self)

        #expect(!text.contains("vigil_fake 1\n"))
        #expect(!text.contains("\u{1b}"))
        #expect(!text.contains(String(repeating: "x\"\\\n", count: 40)), "more than the label bound made it through")
        #expect(text.contains(#"vigil_leases{strategy="client",kind="client"} 3"#))
        #expect(text.contains(#"vigil_lease_events_total{strategy="client",event="acquired"} 3"#))
        #expect(text.contains(#"vigil_client_leases{uid="0"} 1"#))
        // The weird strategy is there once, its name cut to the bound and escaped.
        let line = try #require(text.split(separator: "\n").first { $0.hasPrefix("vigil_strategy_restarts_total{") })
        #expect(line.hasPrefix(#"vigil_strategy_restarts_total{strategy="evil\"} 1?vigil_fake 1?\\?[2Jx"#), "\(line)")
        #expect(line.utf8.count < 2 * HostMetrics.maxLabelBytes + 64)

        let dir = NSTemporaryDirectory() + "vigil-metrics-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try MetricsTextfile.write(Array(text.utf8), to: dir + "/vigil.prom")
        let check = try promtool(["check", "metrics"], stdin: dir + "/vigil.prom")
        #expect(check.status == 0, "\(check.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir) == ["vigil.prom"])
    }

    @Test func appsRefusedAndExpiredAreCountedWithBoundedEscapedLabels() async throws {
        var snapshot = Self.snapshot(leases: LeaseTotals([]))
        snapshot.apps = [AppPolicy.AppCount(app: "steam", refused: 3, expired: 0), AppPolicy.AppCount(app: Self.hostile, refused: 1, expired: 2)]
            + (0..<60).map { AppPolicy.AppCount(app: "app\($0)", refused: 0, expired: 1) }
        let text = String(decoding: HostMetrics().exposition(snapshot), as: UTF8.self)
        #expect(text.contains(#"vigil_app_requests_refused_total{app="steam"} 3"#), "\(text)")
        #expect(!text.contains("vigil_app_leases_expired_total{app=\"steam\"}"), "a zero count is left out")
        #expect(!text.contains("vigil_fake 1\n") && !text.contains("\u{1b}"))
        let hostile = try #require(text.split(separator: "\n").first { $0.hasPrefix("vigil_app_leases_expired_total{app=\"evil") })
        #expect(hostile.hasSuffix(" 2") && hostile.utf8.count < 2 * HostMetrics.maxLabelBytes + 64, "\(hostile)")
        // 62 apps: the 50 with most refusals and expiries by name, the rest as "other".
        let expiredLines = text.split(separator: "\n").filter { $0.hasPrefix("vigil_app_leases_expired_total{") }
        #expect(expiredLines.count == 50, "\(expiredLines.count)")
        #expect(expiredLines.contains(#"vigil_app_leases_expired_total{app="other"} 12"#), "\(expiredLines)")
    }

    @Test func clientUIDsAreBoundedAndEventsCounted() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let metrics = HostMetrics()
        await registry.observe(metrics)
        for uid in 0..<30 as Range<UInt32> {
            for _ in 0...(uid == 7 ? 3 : 0) {
                try await registry.acquire(strategy: "client", LeaseRequest(holds: "x", reason: "y"),
                                           client: ClientIdentity(owner: ":1.1", uid: 1_000 + uid, pid: 1, name: "n"))
            }
        }
        // A lease whose expiration handler overruns its grace: force-released.
        let stuck = try await registry.acquire(strategy: "sip", LeaseRequest(
            holds: "tcp", reason: "r", budget: .seconds(10), grace: .seconds(1),
            onExpire: { _ in try? await Task.sleep(for: .seconds(3600)) }))
        await registry.setStatus(stuck, ["Pings": .uint(1), "LastRttUsec": .int(2_000), "Reconnects": .uint(4)])
        await registry.setStatus(stuck, ["Pings": .uint(1), "LastRttUsec": .int(9_000), "Reconnects": .uint(4)])
        await registry.setStatus(stuck, ["Pings": .uint(2), "LastRttUsec": .int(30_000), "Reconnects": .uint(5)])
        let sip = StrategyStatus(name: "sip", kind: "voip-socket", state: .backoff, restarts: 1, lastError: "x", startedAt: nil)
        let during = String(decoding: metrics.exposition(Self.snapshot(strategies: [sip], leases: LeaseTotals(await registry.active))), as: UTF8.self)
        #expect(during.contains(#"vigil_voip_reconnects_total{strategy="sip"} 5"#))
        #expect(during.contains(#"vigil_voip_pings_total{strategy="sip"} 2"#))
        #expect(during.contains(#"vigil_strategy_up{strategy="sip",kind="voip-socket"} 0"#))
        // Two pings answered, the repeated status not counted again.
        #expect(during.contains(#"vigil_voip_rtt_seconds_count{strategy="sip"} 2"#))
        #expect(during.contains(#"vigil_voip_rtt_seconds_bucket{strategy="sip",le="0.005"} 1"#))

        // The budget runs out, then the grace time: each step once the
        // registry sleeps until it.
        let acquiredAt = clock.now
        try await clock.settle(until: "the registry waits for the budget's end") { clock.sleeperCount(dueBy: acquiredAt + .seconds(10)) > 0 }
        await clock.advance(by: .seconds(10))
        try await clock.settle(until: "the lease is expiring and its grace is on the clock") {
            let state = await registry.lease(stuck)?.state
            return state == .expiring && clock.sleeperCount(dueBy: acquiredAt + .seconds(11)) > 0
        }
        await clock.advance(by: .seconds(1))
        try await clock.settle(until: "the lease was force-released") { await registry.lease(stuck) == nil }

        let text = String(decoding: metrics.exposition(Self.snapshot(strategies: [sip], leases: LeaseTotals(await registry.active))), as: UTF8.self)
        let uids = text.split(separator: "\n").filter { $0.hasPrefix("vigil_client_leases{") }
        #expect(uids.count == HostMetrics.maxClientUIDs + 1)
        #expect(uids.contains(#"vigil_client_leases{uid="1007"} 4.0"#))
        #expect(uids.contains(#"vigil_client_leases{uid="other"} 10.0"#))
        #expect(text.contains(#"vigil_lease_events_total{strategy="sip",event="expiring"} 1"#))
        #expect(text.contains(#"vigil_lease_events_total{strategy="sip",event="force_released"} 1"#))
        #expect(text.contains(#"vigil_lease_events_total{strategy="sip",event="expired"} 0"#))
        #expect(text.contains(#"vigil_runs_total{end="killed"} 2"#))
        #expect(text.contains(#"vigil_gap_seconds_total{class="frozen"} 5.0"#))
    }

    /// Round trips get a histogram for each of the first strategies only;
    /// the pings of later ones are counted in `strategy="other"`, each
    /// lease's pings in the same histogram from its first to its last.
    @Test func roundTripHistogramsAreBoundedByStrategy() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let metrics = HostMetrics()
        await registry.observe(metrics)
        let count = HostMetrics.maxRTTStrategies + 5
        for i in 0..<count {
            let lease = try await registry.acquire(strategy: "sip\(i)", LeaseRequest(holds: "tcp", reason: "r"))
            await registry.setStatus(lease, ["Pings": .uint(1), "LastRttUsec": .int(3_000)])
            // The second ping goes into the histogram the first one found.
            await registry.setStatus(lease, ["Pings": .uint(2), "LastRttUsec": .int(20_000)])
        }
        let text = String(decoding: metrics.exposition(Self.snapshot(strategies: [], leases: LeaseTotals(await registry.active))), as: UTF8.self)
        let counts = text.split(separator: "\n").filter { $0.hasPrefix("vigil_voip_rtt_seconds_count{") }
        #expect(counts.count == HostMetrics.maxRTTStrategies + 1, "\(counts.count) histograms")
        #expect(counts.contains(#"vigil_voip_rtt_seconds_count{strategy="sip0"} 2"#))
        #expect(counts.contains(#"vigil_voip_rtt_seconds_count{strategy="other"} 10"#))
        #expect(text.contains(#"vigil_voip_rtt_seconds_bucket{strategy="other",le="0.005"} 5"#))
        #expect(!counts.contains { $0.contains(#"strategy="sip\#(count - 1)""#) })
    }

    @Test func metricsTableIsValidatedWithLocations() throws {
        let text = """
            [host]
            state_dir = "/tmp/x"

            [metrics]
            listen = "localhost:9469"
            textfile = "vigil.txt"
            listne = "x"
            """
        let document = try ConfigLoader.parseDocument(text: text, path: "/etc/vigil/vigil.toml")
        let lines = document.problems.map(\.description)
        #expect(lines.count == 3, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("/etc/vigil/vigil.toml:5:") && $0.contains("metrics.listen") && $0.contains("\"localhost\" is not a numeric IPv4 or IPv6 address") }, "\(lines)")
        #expect(lines.contains { $0.contains("metrics.textfile") && $0.contains("ending in \".prom\"") }, "\(lines)")
        #expect(lines.contains { $0.contains("metrics.listne") && $0.contains("did you mean \"listen\"") }, "\(lines)")

        let good = try ConfigLoader.parseDocument(text: """
            [metrics]
            listen = "[::1]:9469"
            textfile = "prom/vigil.prom"
            """, path: "/etc/vigil/vigil.toml")
        #expect(good.problems.isEmpty)
        #expect(good.host.metrics.listen == MetricsListenAddress(host: "::1", port: 9469))
        #expect(good.host.metrics.textfile == "/etc/vigil/prom/vigil.prom")
        #expect(try ConfigLoader.parseDocument(text: "", path: "/x.toml").host.metrics.isEnabled == false)
    }

    @Test func theListenerAnswersOnlyMetricsAndSurvivesBadRequests() async throws {
        let listener = try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0))
        let scrapes = ScrapeCount()
        listener.start {
            scrapes.increment()
            return Array("vigil_up_seconds 1\n".utf8)
        }
        defer { listener.stop() }
        let address = MetricsListenAddress(host: "127.0.0.1", port: listener.port)

        // Scrapes wait off the cooperative pool: the listener computes the
        // exposition on it, and a blocked test thread on each of the two
        // pool threads (the whole suite runs in parallel) would starve it.
        // The scrape's bound is not what is tested: the suite's start, every
        // test at once on a loaded machine, held this process's pool for
        // over 10 s once (a stress run beside release builds).
        let bound = Duration.seconds(60)
        let ok = try await offPool { try MetricsScrape.get(address, timeout: bound) }
        #expect(ok.status == 200)
        #expect(String(decoding: ok.body, as: UTF8.self) == "vigil_up_seconds 1\n")
        #expect(try await offPool { try MetricsScrape.get(address, path: "/", timeout: bound) }.status == 404)
        #expect(try await offPool { try MetricsScrape.get(address, path: "/metrics?x=1", timeout: bound) }.status == 200)
        // A head that does not end within the bound (exactly the bound, so
        // the listener has read all of it and closes cleanly), and garbage.
        #expect(try rawExchange(address, Array(repeating: UInt8(ascii: "A"), count: MetricsListener.maxRequestBytes)).hasPrefix("HTTP/1.1 431"))
        #expect(try rawExchange(address, Array("\u{1}\u{2}\r\n\r\n".utf8)).hasPrefix("HTTP/1.1 400"))
        #expect(try rawExchange(address, Array("DELETE /metrics HTTP/1.1\r\n\r\n".utf8)).hasPrefix("HTTP/1.1 405"))
        // curl, a third-party client.
        let curl = try await offPool { try run("/usr/bin/curl", ["-sS", "-D", "-", "http://\(address)/metrics"]) }
        #expect(curl.status == 0)
        #expect(curl.output.contains("Content-Type: text/plain; version=0.0.4"))
        #expect(curl.output.hasSuffix("vigil_up_seconds 1\n"))
        #expect(scrapes.value == 3)
    }

    @Test func routes() {
        #expect(MetricsListener.route(Array("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".utf8)) == .metrics(body: true))
        #expect(MetricsListener.route(Array("HEAD /metrics HTTP/1.0\r\n\r\n".utf8)) == .metrics(body: false))
        #expect(MetricsListener.route(Array("GET /metricsx HTTP/1.1\r\n\r\n".utf8)) == .error("404 Not Found", "vigild serves only /metrics here"))
        #expect(MetricsListener.route(Array("GET /metrics SPDY/3\r\n\r\n".utf8)).isError)
        #expect(MetricsListener.route(Array("GET  /metrics HTTP/1.1\r\n\r\n".utf8)).isError)
    }

    /// Sends `bytes` on a fresh connection (the peer may stop reading) and
    /// returns the whole answer.
    func rawExchange(_ address: MetricsListenAddress, _ bytes: [UInt8]) throws -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = address.port.bigEndian
        sa.sin_addr.s_addr = inet_addr(address.host)
        let connected = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        try #require(connected == 0)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            answer += chunk[..<n]
        }
        return String(decoding: answer, as: UTF8.self)
    }

    func promtool(_ arguments: [String], stdin path: String) throws -> (status: Int32, output: String) {
        try run("/bin/sh", ["-c", "/usr/bin/promtool " + arguments.joined(separator: " ") + " < '\(path)' 2>&1"])
    }

    func run(_ program: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let result = try ProcessRunner.run(program, arguments)
        return (result.status, result.stdout)
    }
}

extension MetricsListener.Route {
    var isError: Bool {
        if case .error = self { return true }
        return false
    }
}

/// A thread-safe count.
final class ScrapeCount: Sendable {
    private let count = Lock(0)
    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
