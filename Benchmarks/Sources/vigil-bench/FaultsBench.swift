import Foundation
import VigilHost
import VigilKit

/// `vigil-bench store-wal [SECONDS]`: the survival store under ten 1 s
/// strategies (a heartbeat a second with ten leases, and twenty lease
/// events a second), written as fast as the disk allows for SECONDS
/// simulated seconds (default 600, the issue's 10 minutes). Prints the WAL's
/// largest and final size and the heartbeat write time, with the host's
/// checkpoints and, as the reference, with SQLite's defaults only.
func storeWALBench(_ arguments: [String]) async throws {
    let seconds = arguments.first.flatMap(Int.init) ?? 600
    print("store-wal: \(seconds) simulated seconds of 10 × 1 s strategies (1 heartbeat + 20 events a second), real time not waited")
    print("setting".padding(toLength: 34, withPad: " ", startingAt: 0) + "max WAL    final WAL  median hb   p99 hb     total")
    for (label, limit) in [("checkpoints (256 KiB, TRUNCATE)", SurvivalStore.defaultWALCheckpointBytes), ("reference: SQLite defaults", nil) as (String, Int64?)] {
        let dir = NSTemporaryDirectory() + "vigil-bench-wal-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try SurvivalStore(path: dir + "/survival.sqlite", walCheckpointBytes: limit)
        var readings = ClockReadings.now()
        _ = try await store.beginRun(RunStart(runId: UUID().uuidString, pid: getpid(), bootID: "bench", version: "bench",
                                              configPath: "-", interval: .seconds(1), readings: readings))
        let leases = (0..<10).map { HeartbeatLease(id: UInt64($0), strategy: "tick\($0)", holds: "none", state: "active") }
        var times: [Duration] = []
        var largest: Int64 = 0
        let begin = ContinuousClock.now
        for _ in 0..<seconds {
            readings.wallMicros += 1_000_000
            readings.monotonicMicros += 1_000_000
            readings.boottimeMicros += 1_000_000
            for i in 0..<20 {
                try await store.recordEvent(i % 2 == 0 ? "lease-acquired" : "lease-released", strategy: "tick\(i / 2)",
                                            fields: ["lease": String(i), "holds": "none"], readings: readings)
            }
            let start = ContinuousClock.now
            try await store.heartbeat(readings, leases: leases)
            times.append(ContinuousClock.now - start)
            largest = max(largest, store.walSize())
        }
        let total = ContinuousClock.now - begin
        times.sort()
        func ms(_ d: Duration) -> String { String(format: "%.2f ms", Double(d.components.attoseconds) / 1e15 + Double(d.components.seconds) * 1000) }
        func kib(_ b: Int64) -> String { "\(b / 1024) KiB" }
        print(label.padding(toLength: 34, withPad: " ", startingAt: 0)
              + [kib(largest), kib(store.walSize()), ms(times[times.count / 2]), ms(times[times.count * 99 / 100]),
                 String(format: "%.1f s", Double(total.components.seconds) + Double(total.components.attoseconds) / 1e18)]
                .map { $0.padding(toLength: 11, withPad: " ", startingAt: 0) }.joined())
    }
}

/// `vigil-bench config-check [strategies] [unknown-keys]`: time to parse
/// and validate a config of 10,000 strategies and one of 80,000 unknown
/// keys (the issue measured 16.7 s for the latter before the limits), with
/// kinds resolved by a stand-in so only the config layer is timed. The
/// reference is a config of one strategy, timed in the same run.
func configCheckBench(_ arguments: [String]) async throws {
    let strategyCount = arguments.first.flatMap(Int.init) ?? 10_000
    let keyCount = arguments.dropFirst().first.flatMap(Int.init) ?? 80_000
    struct Kind: StrategyKind {
        var name: String { "bench" }
        var summary: String { "bench" }
        func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
            _ = config.string("message", default: "")
            return Idle()
        }
    }
    struct Idle: KeepAliveStrategy { func run(in context: StrategyContext) async throws {} }
    struct Resolver: KindResolver {
        func availableKinds() -> [String] { ["bench"] }
        func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError> { .success(Kind()) }
    }
    let cases: [(String, String)] = [
        ("reference: 1 strategy", "[[strategy]]\nname = \"s\"\nkind = \"bench\"\n"),
        ("\(strategyCount) strategies", (0..<strategyCount).map { "[[strategy]]\nname = \"s\($0)\"\nkind = \"bench\"\nmessage = \"m\"\n" }.joined()),
        ("\(keyCount) unknown keys", "[host]\n" + (0..<keyCount).map { "unknown\($0) = 1\n" }.joined()),
    ]
    for (label, text) in cases {
        let path = NSTemporaryDirectory() + "vigil-bench-config-" + UUID().uuidString + ".toml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        defer { unlink(path) }
        let start = ContinuousClock.now
        var outcome: String
        do {
            let config = try ConfigLoader.load(path: path, resolver: Resolver())
            outcome = "valid, \(config.strategies.count) strategies"
        } catch {
            outcome = "\(error.problems.count) problems, \(error.description.split(separator: "\n").count) lines printed"
        }
        let elapsed = ContinuousClock.now - start
        print(label.padding(toLength: 24, withPad: " ", startingAt: 0)
              + String(format: "%8.3f s  ", Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18) + outcome)
    }
}
