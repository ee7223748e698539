// vigil-bench NAME: runs one benchmark and prints its figures next to the
// reference it is compared with, measured in the same run.
// vigil-bench smoke: runs every benchmark in its brief form (Smoke.swift).
import CVigilLoop
import Foundation
import Glibc

/// A benchmark: what runs it, and its brief form for `vigil-bench smoke`
/// (every benchmark says how it runs in seconds, or why it is left out).
struct Benchmark: Sendable {
    enum Smoke: Sendable {
        /// The arguments of each brief form (most have one); given the host
        /// directory (`hostBuildDirectory()`) for benchmarks that take a
        /// second build.
        case runs(@Sendable (_ host: String) -> [[String]])
        /// Not run by `smoke`, for this reason.
        case skipped(String)
    }

    var run: @Sendable (_ arguments: [String]) async throws -> Void
    var smoke: Smoke
}

let benchmarks: [String: Benchmark] = [
    "wake-latency": Benchmark(run: wakeLatencyBench, smoke: .runs { _ in [["--requesters", "4", "--seconds", "1"]] }),
    "survival-report": Benchmark(run: survivalReportBench, smoke: .runs { _ in [["--heartbeats", "6000", "--iterations", "1", "--single", "20"]] }),
    "idle-cost": Benchmark(run: idleCostBench, smoke: .runs { host in [["2", "--previous", host]] }),
    "idle-reference": Benchmark(run: idleReference, smoke: .skipped("idle-cost's reference process: sleeps until it is killed")),
    "idle-memory": Benchmark(run: idleMemoryBench, smoke: .runs { _ in [["1"]] }),
    "dbus": Benchmark(run: dbusBench, smoke: .runs { _ in [["200", "1"]] }),
    "dbus-api": Benchmark(run: dbusAPIBench, smoke: .runs { _ in [["200", "50", "--rounds", "1"]] }),
    "dbus-huge-call": Benchmark(run: dbusHugeCallBench, smoke: .runs { _ in [["4"]] }),
    "background-task": Benchmark(run: backgroundTaskBench, smoke: .runs { _ in [["200", "--rounds", "1"]] }),
    "download": Benchmark(run: downloadBench, smoke: .runs { _ in [["8"]] }),
    "voip-socket": Benchmark(run: voipSocketBench, smoke: .runs { _ in [["50", "1", "--rounds", "1"], ["50", "1", "--rounds", "1", "--tls"]] }),
    "silent-audio": Benchmark(run: silentAudioBench, smoke: .runs { _ in [["1"]] }),
    "store-wal": Benchmark(run: storeWALBench, smoke: .runs { _ in [["20"]] }),
    "config-check": Benchmark(run: configCheckBench, smoke: .runs { _ in [["100", "800"]] }),
    "metrics": Benchmark(run: metricsBench, smoke: .runs { _ in [["200", "5", "4"]] }),
    // The host against itself: the second build is the same directory.
    "release-compare": Benchmark(run: releaseCompareBench, smoke: .runs { host in [[host, "200", "--rounds", "1"]] }),
]

// Every vigild a benchmark starts finds its plugins beside itself (the
// directory of hostBuildDirectory(), or the other build's for
// release-compare and idle-cost --previous), never in a VIGIL_PLUGIN_PATH
// left in the caller's environment: host and plugins come from one build.
unsetenv("VIGIL_PLUGIN_PATH")

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "smoke" {
    exit(await runSmoke(Array(arguments.dropFirst()), forms: benchmarks.mapValues(\.smoke)))
}
guard let name = arguments.first, let benchmark = benchmarks[name] else {
    print("""
        usage: vigil-bench NAME [ARGS...]
               vigil-bench smoke [NAME...] [--timeout SECONDS]   (every benchmark, briefly; Benchmarks/README.md)
        benchmarks: \(benchmarks.keys.sorted().joined(separator: ", "))
        """)
    exit(arguments.isEmpty || arguments.first == "--help" ? 0 : 2)
}
/// Runs the benchmark; a benchmark that cannot run says why, without a crash report.
@Sendable func run(_ benchmark: Benchmark, _ name: String, _ arguments: [String]) async {
    do {
        try await benchmark.run(arguments)
    } catch {
        FileHandle.standardError.write(Data("vigil-bench \(name): \(error)\n".utf8))
        exit(1)
    }
}
// wake-latency and voip-socket measure the host's parts as vigild runs
// them: on the host's event loop, which is then this process's only
// executor thread, as in vigild (VIGIL_BENCH_EXECUTOR=default measures them
// on Swift's default executor instead). The loop takes the main thread for
// good: the task runs there, and the process exits when it ends. Not
// voip-socket's pong server child, which runs no host parts.
let onTheLoop = (name == "wake-latency" || name == "voip-socket") && arguments.dropFirst().first != PongServerProcess.childFlag
if onTheLoop, ProcessInfo.processInfo.environment["VIGIL_BENCH_EXECUTOR"] != "default" {
    guard vigil_executor_install(0) == 0 else {
        FileHandle.standardError.write(Data("vigil-bench \(name): cannot install the event loop: \(String(cString: strerror(errno)))\n".utf8))
        exit(1)
    }
    let rest = Array(arguments.dropFirst())
    // Unstructured task: not cancelled: it is the whole benchmark; the process exits when it ends.
    Task.detached {
        await run(benchmark, name, rest)
        exit(0)
    }
    vigil_loop_run()
}
await run(benchmark, name, Array(arguments.dropFirst()))

/// Arguments a benchmark cannot use: said in one line, without a crash report.
struct BenchUsageError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
