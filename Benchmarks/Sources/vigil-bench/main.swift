// vigil-bench NAME: runs one benchmark and prints its figures next to the
// reference it is compared with, measured in the same run.
import Foundation

let benchmarks: [String: (_ arguments: [String]) async throws -> Void] = [
    "wake-latency": wakeLatencyBench,
    "survival-report": survivalReportBench,
    "idle-cost": idleCostBench,
    "idle-reference": idleReference,
    "idle-memory": idleMemoryBench,
    "dbus": dbusBench,
    "dbus-api": dbusAPIBench,
    "dbus-huge-call": dbusHugeCallBench,
    "background-task": backgroundTaskBench,
    "download": downloadBench,
    "voip-socket": voipSocketBench,
    "silent-audio": silentAudioBench,
    "store-wal": storeWALBench,
    "config-check": configCheckBench,
    "metrics": metricsBench,
    "release-compare": releaseCompareBench,
]

// Every vigild a benchmark starts finds its plugins beside itself (the
// directory of hostBuildDirectory(), or the other build's for
// release-compare and idle-cost --previous), never in a VIGIL_PLUGIN_PATH
// left in the caller's environment: host and plugins come from one build.
unsetenv("VIGIL_PLUGIN_PATH")

let arguments = Array(CommandLine.arguments.dropFirst())
guard let name = arguments.first, let run = benchmarks[name] else {
    print("usage: vigil-bench NAME [ARGS...]\nbenchmarks: \(benchmarks.keys.sorted().joined(separator: ", "))")
    exit(arguments.isEmpty ? 0 : 2)
}
do {
    try await run(Array(arguments.dropFirst()))
} catch {
    // A benchmark that cannot run says why, without a crash report.
    FileHandle.standardError.write(Data("vigil-bench \(name): \(error)\n".utf8))
    exit(1)
}

/// Arguments a benchmark cannot use: said in one line, without a crash report.
struct BenchUsageError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
