import Foundation
import VigilHost
import VigilKit

/// vigil-bench metrics [leases] [strategies] [idle-seconds]
///
/// 1. Scrape time and exposition size with `leases` (10,000) leases across
///    `strategies` (20), over HTTP from the real listener, next to
///    prometheus-node-exporter's own scrape time (default collectors) on the
///    same machine in the same run. Target: a scrape <= 20 ms.
/// 2. Idle cost with metrics enabled: voluntary context switches of four
///    vigild processes over the same window, each with five 10-minute
///    periodic-wakes and a 60 s heartbeat: without metrics, with `[metrics]`
///    listen only, with listen + textfile (nobody scraping), and the same
///    scraped every 30 s.
///    Target: no more than without metrics, plus the scrapes themselves.
func metricsBench(_ args: [String]) async throws {
    let leaseCount = args.first.flatMap(Int.init) ?? 10_000
    let strategyCount = args.dropFirst().first.flatMap(Int.init) ?? 20
    let idleSeconds = args.dropFirst(2).first.flatMap(Double.init) ?? 120
    try await scrapeFigures(leases: leaseCount, strategies: strategyCount)
    if idleSeconds > 0 { try await idleFigures(seconds: idleSeconds) }
}

/// The middle value (the upper middle of an even count); 0 for none.
func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
}

private func scrapeFigures(leases leaseCount: Int, strategies strategyCount: Int) async throws {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-metrics-bench-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }

    // The host's parts, for real: a registry with the leases, a survival
    // store with a run, and the listener on loopback.
    let registry = LeaseRegistry(clock: SystemClock())
    let metrics = HostMetrics()
    await registry.observe(metrics)
    let kinds = ["voip-socket", "download-session", "silent-audio", "periodic-wake", "background-task"]
    let strategies = (0..<strategyCount).map { i in (name: "strategy-\(i)", kind: kinds[i % kinds.count]) }
    for i in 0..<leaseCount {
        let s = strategies[i % strategies.count]
        let id = try await registry.acquire(strategy: s.name, LeaseRequest(holds: "bench lease \(i)", reason: "bench"))
        switch s.kind {
        case "voip-socket":
            await registry.setStatus(id, ["Pings": .uint(UInt64(i)), "LastRttUsec": .int(Int64(500 + i % 5_000)), "Reconnects": .uint(1), "Overruns": .uint(0), "LatePings": .uint(0)])
        case "download-session":
            await registry.setStatus(id, ["BytesDone": .uint(UInt64(i) * 1_000), "BytesTotal": .uint(1 << 30)])
        case "silent-audio":
            await registry.setStatus(id, ["Stream": .string("playing"), "Underruns": .uint(0)])
        default: break
        }
    }
    let store = try SurvivalStore(path: dir.appendingPathComponent("survival.sqlite").path)
    _ = try await store.beginRun(RunStart(runId: UUID().uuidString.lowercased(), pid: getpid(), bootID: "bench", version: VigilVersion.string,
                                          configPath: "bench", interval: .seconds(60), readings: ClockReadings.now()))
    try await store.heartbeat(ClockReadings.now(), leases: [])
    let statuses = strategies.map { StrategyStatus(name: $0.name, kind: $0.kind, state: .running, restarts: 0) }
    let snapshot: @Sendable () async -> HostMetrics.Snapshot = {
        HostMetrics.Snapshot(version: VigilVersion.string, upSeconds: 1, powerBackend: "none", wakeClock: "CLOCK_BOOTTIME",
                             canWakeSystem: false, strategies: statuses, leases: await registry.reduceActive(into: LeaseTotals()) { $0.add($1) },
                             survival: try? await store.metricTotals())
    }
    let listener = try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0))
    listener.start { metrics.exposition(await snapshot()) }
    defer { listener.stop() }
    let vigilAddress = MetricsListenAddress(host: "127.0.0.1", port: listener.port)

    func timeScrapes(_ address: MetricsListenAddress, count: Int) throws -> (median: Double, p90: Double, bytes: Int) {
        var times: [Double] = []
        var bytes = 0
        for _ in 0..<count {
            let start = ContinuousClock.now
            let (status, body) = try MetricsScrape.get(address)
            let elapsed = ContinuousClock.now - start
            guard status == 200 else { throw MetricsScrapeError("\(address): HTTP \(status)") }
            times.append(elapsed.seconds * 1_000)
            bytes = body.count
        }
        let sorted = times.sorted()
        return (median(times), sorted[min(sorted.count - 1, sorted.count * 9 / 10)], bytes)
    }

    // node_exporter with its default collectors, on a free loopback port.
    let exporterPort = try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0)).port
    let exporterPath = "/usr/bin/prometheus-node-exporter"
    let exporter = Process()
    exporter.executableURL = URL(fileURLWithPath: exporterPath)
    exporter.arguments = ["--web.listen-address=127.0.0.1:\(exporterPort)"]
    exporter.standardError = FileHandle.nullDevice
    exporter.standardOutput = FileHandle.nullDevice
    let haveExporter = FileManager.default.isExecutableFile(atPath: exporterPath)
    if haveExporter { try exporter.run() }
    defer { if haveExporter { exporter.terminate(); exporter.waitUntilExit() } }

    let rounds = 50
    _ = try timeScrapes(vigilAddress, count: 3)  // warm up
    let vigil = try timeScrapes(vigilAddress, count: rounds)
    print("scrape of vigild's /metrics with \(leaseCount) leases across \(strategyCount) strategies (\(rounds) scrapes over loopback HTTP):")
    print(String(format: "  vigild:        median %.2f ms, p90 %.2f ms, %d bytes   (target: <= 20 ms)", vigil.median, vigil.p90, vigil.bytes))
    if haveExporter {
        var ready = false
        for _ in 0..<100 where !ready {
            ready = (try? MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: exporterPort)).status) == 200
            if !ready { try await Task.sleep(for: .milliseconds(50)) }
        }
        _ = try timeScrapes(MetricsListenAddress(host: "127.0.0.1", port: exporterPort), count: 3)
        let node = try timeScrapes(MetricsListenAddress(host: "127.0.0.1", port: exporterPort), count: rounds)
        print(String(format: "  node_exporter: median %.2f ms, p90 %.2f ms, %d bytes   (reference: default collectors, same machine, same run)", node.median, node.p90, node.bytes))
    } else {
        print("  node_exporter: not installed (apt-get install prometheus-node-exporter) - no reference")
    }
    // The exposition alone, without HTTP: what a heartbeat's textfile costs.
    var inProcess: [Double] = []
    for _ in 0..<rounds {
        let start = ContinuousClock.now
        _ = metrics.exposition(await snapshot())
        inProcess.append((ContinuousClock.now - start).seconds * 1_000)
    }
    var reads: [Double] = []
    for _ in 0..<10 {
        let start = ContinuousClock.now
        _ = await registry.reduceActive(into: LeaseTotals()) { $0.add($1) }
        reads.append((ContinuousClock.now - start).seconds * 1_000)
    }
    print(String(format: "  in process (snapshot + exposition, as for the textfile): median %.2f ms, of which adding up the registry's leases %.2f ms", median(inProcess), median(reads)))
}

private func idleFigures(seconds: Double) async throws {
    let bin = try hostBuildDirectory()
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-metrics-idle-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }
    func start(_ name: String, metrics: String) throws -> Process {
        let config = """
            [host]
            state_dir = "\(dir.path)/\(name)"
            survival_interval = "60s"
            \(metrics)
            \(idleStrategies)
            """
        let p = try vigildProcess(bin, dir: dir, name: name, config: config, logLevel: "warning")
        var env = ProcessInfo.processInfo.environment
        env["DBUS_SESSION_BUS_ADDRESS"] = nil
        p.environment = env
        try p.run()
        return p
    }
    func port() throws -> UInt16 { try MetricsListener(address: MetricsListenAddress(host: "127.0.0.1", port: 0)).port }
    let listenPort = try port(), quietPort = try port(), scrapedPort = try port()
    let plain = try start("plain", metrics: "")
    let listening = try start("listen", metrics: "[metrics]\nlisten = \"127.0.0.1:\(listenPort)\"\n")
    let quiet = try start("quiet", metrics: "[metrics]\nlisten = \"127.0.0.1:\(quietPort)\"\ntextfile = \"\(dir.path)/quiet.prom\"\n")
    let scraped = try start("scraped", metrics: "[metrics]\nlisten = \"127.0.0.1:\(scrapedPort)\"\ntextfile = \"\(dir.path)/scraped.prom\"\n")
    defer { for p in [plain, listening, quiet, scraped] { p.terminate(); p.waitUntilExit() } }
    // Let start-up finish (plugin loading, store migration) before measuring.
    try await Task.sleep(for: .seconds(3))
    let pids = [plain, listening, quiet, scraped].map(\.processIdentifier)
    let before = pids.map { sampleThreads(pid: $0) }
    print("\nidle cost: four vigild (5 x periodic-wake every 10m, heartbeat every 60 s) for \(Int(seconds)) s ...")
    var scrapes = 0
    let clock = ContinuousClock()
    let end = clock.now + .seconds(seconds)
    while clock.now + .seconds(30) <= end {
        try await Task.sleep(for: .seconds(30))
        _ = try MetricsScrape.get(MetricsListenAddress(host: "127.0.0.1", port: scrapedPort))
        scrapes += 1
    }
    try await Task.sleep(until: end)
    let after = pids.map { sampleThreads(pid: $0) }
    func switches(_ i: Int) -> Int {
        after[i].reduce(0) { sum, entry in sum + entry.value.voluntary - (before[i][entry.key]?.voluntary ?? 0) }
    }
    let wakes = max(1, Int((seconds / 60).rounded(.down)))
    print(String(format: "  without metrics (reference):        %4d voluntary switches, %.1f per scheduled wake (%d heartbeats)", switches(0), Double(switches(0)) / Double(wakes), wakes))
    print(String(format: "  [metrics] listen, nobody scraping:  %4d voluntary switches, %.1f per scheduled wake", switches(1), Double(switches(1)) / Double(wakes)))
    print(String(format: "  [metrics] listen+textfile:          %4d voluntary switches, %.1f per scheduled wake (the textfile is written at each heartbeat)", switches(2), Double(switches(2)) / Double(wakes)))
    print(String(format: "  same, scraped every 30 s (%d scrapes): %4d voluntary switches, %.1f per scrape above the unscraped one", scrapes, switches(3), Double(switches(3) - switches(2)) / Double(max(scrapes, 1))))
}
