// release-compare: this build's vigild against another build's (the
// previous release), in the same run: Properties.Get and
// BeginBackgroundTask, each vigild on its own private dbus-daemon, measured
// in alternating rounds so that a slow stretch of the machine falls on both.
// A change that adds work to every call (such as the atomic per-uid limits
// of issue 35, reserved before each Begin's first suspension point) shows
// as a ratio below 1 by more than the rounds' spread.
import Foundation
import Glibc
import VigilDBus
import VigilHost
import VigilKit

func releaseCompareBench(_ args: [String]) async throws {
    let usage = """
        usage: vigil-bench release-compare DIR [calls] [--rounds K]
          DIR: a directory holding the other build's vigild (for example
          .build-previous/release, or usr/bin of an extracted .deb)
        """
    var rest = args
    if rest.contains("--help") || rest.isEmpty {
        print(usage)
        if rest.isEmpty { throw BenchError("release-compare needs the directory of the other vigild") }
        return
    }
    let other = URL(fileURLWithPath: rest.removeFirst())
    guard FileManager.default.isExecutableFile(atPath: other.appendingPathComponent("vigild").path) else {
        throw BenchError("no vigild in \(other.path)\n\(usage)")
    }
    guard let (numbers, rounds) = try roundsArguments(rest, usage: usage, numbers: 1) else { return }
    let calls = numbers.first ?? 4000
    let leases = max(100, calls / 10)

    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-release-compare-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let limits = """
        client_max_leases_per_uid = 100000
        client_max_budget_per_uid = "100000h"
        """
    // One private bus each, so the two hosts never meet; both daemons alike.
    let busA = try startBenchBus(), busB = try startBenchBus()
    defer { busA.stop(); busB.stop() }
    let dirA = directory.appendingPathComponent("this"), dirB = directory.appendingPathComponent("other")
    for dir in [dirA, dirB] { try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true) }
    let this = try await startBenchVigild(busAddress: busA.address, dir: dirA, hostSettings: limits)
    defer { this.terminate(); this.waitUntilExit() }
    let that = try await startBenchVigild(busAddress: busB.address, dir: dirB, hostSettings: limits, bin: other)
    defer { that.terminate(); that.waitUntilExit() }
    let clientA = try await DBusConnection.connect(to: .address(busA.address))
    let clientB = try await DBusConnection.connect(to: .address(busB.address))
    let versionA = try await clientA.call(BenchAPI.hostProperty(VigilAPI.Host.version)).argument(0, as: DBusVariant.self)
    let versionB = try await clientB.call(BenchAPI.hostProperty(VigilAPI.Host.version)).argument(0, as: DBusVariant.self)
    let here = try hostBuildDirectory().path
    print("release-compare: this vigild (\(here), Version \(versionA.value)) against \(other.path)/vigild (Version \(versionB.value));")
    #if DEBUG
    let build = "a debug vigil-bench (its figures are not the release's)"
    #else
    let build = "a release vigil-bench"
    #endif
    print("each on its own private dbus-daemon, power none, no strategies; \(build); 2 cores shared by all.")
    print("(each figure: median of \(rounds) rounds, each this then other; spread: (max - min) / median of a side's rounds)")

    let get = BenchAPI.hostProperty(VigilAPI.Host.version)
    _ = try await measureCalls(clientA, get, calls: min(calls, 1000), inFlight: 1)  // warm-up
    _ = try await measureCalls(clientB, get, calls: min(calls, 1000), inFlight: 1)
    var verdicts: [String] = []
    for inFlight in [1, 8] {
        let (a, b) = try await pairedRounds(rounds,
            { try await measureCalls(clientA, get, calls: calls, inFlight: inFlight) },
            { try await measureCalls(clientB, get, calls: calls, inFlight: inFlight) })
        verdicts.append(compareLine("Properties.Get Host.Version, \(inFlight) in flight (\(calls) calls), calls/s",
                                    a.map(\.callsPerSecond), b.map(\.callsPerSecond), higherIsBetter: true))
    }
    let (a, b) = try await pairedRounds(rounds,
        { try await beginLatencies(clientA, count: leases) },
        { try await beginLatencies(clientB, count: leases) })
    verdicts.append(compareLine("BeginBackgroundTask, one at a time (\(leases) leases, each ended), p50 µs",
                                a.map(\.p50Micros), b.map(\.p50Micros), higherIsBetter: false))
    verdicts.append(compareLine("BeginBackgroundTask+End round trips/s", a.map(\.callsPerSecond), b.map(\.callsPerSecond), higherIsBetter: true))
    print("verdict: " + (verdicts.allSatisfy { $0 == "within" } ? "no figure worse than the other build by more than the rounds' spread"
                                                             : "a figure is worse than the other build by more than the rounds' spread"))
    await clientA.close()
    await clientB.close()
}

/// Sequential Begin then End, `count` times: Begin's latency and the round trips per second.
func beginLatencies(_ client: DBusConnection, count: Int, reason: String = "release-compare") async throws -> CallFigures {
    var latencies: [Double] = []
    latencies.reserveCapacity(count)
    let start = ContinuousClock.now
    for _ in 0..<count {
        let t0 = ContinuousClock.now
        let reply = try await client.call(BenchAPI.beginBackgroundTask(name: "bench", reason: reason, budgetMicros: 60_000_000))
        latencies.append(micros(ContinuousClock.now - t0))
        guard case .objectPath(let path) = reply.body.first else { throw DBusError.failed("BeginBackgroundTask replied without a lease path") }
        try await client.call(BenchAPI.endLease(at: path))
        if case .unixFD(let fd) = reply.body.last { fd.close() }
    }
    let elapsed = micros(ContinuousClock.now - start)
    let sorted = latencies.sorted()
    return CallFigures(callsPerSecond: Double(count) / elapsed * 1e6, p50Micros: sorted[sorted.count / 2],
                       p99Micros: sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))])
}

/// Prints one figure of both builds, their ratio (this / other, oriented
/// so that above 1 is better) and each side's spread; returns "within" when
/// the ratio is not below 1 by more than the larger spread, "worse" otherwise.
private func compareLine(_ title: String, _ this: [Double], _ other: [Double], higherIsBetter: Bool) -> String {
    func spread(_ xs: [Double]) -> Double {
        guard let lo = xs.min(), let hi = xs.max(), median(xs) > 0 else { return 0 }
        return (hi - lo) / median(xs)
    }
    let ratios = zip(this, other).map { higherIsBetter ? $0 / $1 : $1 / $0 }
    let ratio = median(ratios)
    let allowed = max(spread(this), spread(other))
    let verdict = ratio >= 1 - allowed ? "within" : "worse"
    print(title + ":")
    print(String(format: "  this:  %10.1f   spread %4.0f%%", median(this), spread(this) * 100))
    print(String(format: "  other: %10.1f   spread %4.0f%%", median(other), spread(other) * 100))
    print(String(format: "  ratio this/other (above 1: this is better): %.2f (rounds %@); %@ the spread",
                 ratio, ratios.map { String(format: "%.2f", $0) }.joined(separator: ", "), verdict == "within" ? "within" : "BELOW"))
    return verdict
}
