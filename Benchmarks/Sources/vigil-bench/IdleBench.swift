import Foundation
import VigilHost

/// Per-thread counters of a process, from /proc.
struct ThreadSample {
    var name: String
    var voluntary: Int
    var involuntary: Int
    /// utime + stime, clock ticks.
    var cpuTicks: Int
}

func sampleThreads(pid: Int32) -> [Int: ThreadSample] {
    var out: [Int: ThreadSample] = [:]
    let dir = "/proc/\(pid)/task"
    for tid in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] {
        guard let t = Int(tid),
              let status = try? String(contentsOfFile: "\(dir)/\(tid)/status", encoding: .utf8),
              let stat = try? String(contentsOfFile: "\(dir)/\(tid)/stat", encoding: .utf8)
        else { continue }
        func field(_ key: String) -> Int {
            status.split(separator: "\n").first { $0.hasPrefix(key) }
                .flatMap { Int($0.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") } ?? 0
        }
        // Fields after the ")" of comm: state is field 3; utime 14, stime 15.
        let rest = stat[stat.index(after: stat.lastIndex(of: ")") ?? stat.startIndex)...].split(separator: " ")
        let ticks = (Int(rest[11]) ?? 0) + (Int(rest[12]) ?? 0)
        let name = (try? String(contentsOfFile: "\(dir)/\(tid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
        out[t] = ThreadSample(name: name, voluntary: field("voluntary_ctxt_switches:"), involuntary: field("nonvoluntary_ctxt_switches:"), cpuTicks: ticks)
    }
    return out
}

/// vigil-bench idle-cost [seconds]: the host with five periodic-wake
/// instances at 10-minute intervals, measured while idle. Target: no wakeups
/// beyond scheduled ones and the heartbeat. Reference, same run: a shell loop
/// that wakes once per heartbeat interval and does nothing else. Beside it,
/// the same host with three of the five gated by `when` conditions that do
/// not change (ac_power on a power-supply tree, file_exists, network online
/// within an all-day time window): the conditions must cost no wakeups.
/// `--previous DIR`: also the same host run by the vigild (and plugins) in
/// DIR, a build from before a change, measured in the same window: the
/// cost counters (docs/metrics.md) were measured so against the commit
/// before them.
func idleCostBench(_ args: [String]) async throws {
    var rest = args
    var previousBin: URL?
    if let flag = rest.firstIndex(of: "--previous") {
        guard flag + 1 < rest.count else { throw BenchUsageError("--previous needs the directory of an earlier vigild build") }
        previousBin = URL(fileURLWithPath: rest[flag + 1])
        rest.removeSubrange(flag...(flag + 1))
    }
    let seconds = rest.first.flatMap(Double.init) ?? 120
    let interval = 60.0
    let bin = try hostBuildDirectory()
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-idle-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }
    var config = """
    [host]
    state_dir = "\(dir.path)/state"
    survival_interval = "\(Int(interval))s"

    """
    var gatedConfig = config.replacingOccurrences(of: "\(dir.path)/state", with: "\(dir.path)/state-gated")
    config += idleStrategies
    let host = try vigildProcess(bin, dir: dir, name: "vigil", config: config, logLevel: "warning")
    // The gated host: its power supplies are a tree that never changes, its
    // file exists, and it is online (loopback does not count: a real link).
    let power = dir.appendingPathComponent("power_supply/AC")
    try FileManager.default.createDirectory(at: power, withIntermediateDirectories: true)
    try "Mains\n".write(to: power.appendingPathComponent("type"), atomically: true, encoding: .utf8)
    try "1\n".write(to: power.appendingPathComponent("online"), atomically: true, encoding: .utf8)
    let flag = dir.appendingPathComponent("flag").path
    _ = FileManager.default.createFile(atPath: flag, contents: nil)
    gatedConfig += "power_supply_dir = \"\(dir.path)/power_supply\"\n"
    gatedConfig += idleStrategyTables(conditions: [
        "when = { ac_power = true }",
        "when = { file_exists = \"\(flag)\" }",
        "when = { network = \"online\", time = [\"00:00-24:00\"] }",
    ])
    let gated = try vigildProcess(bin, dir: dir, name: "vigil-gated", config: gatedConfig, logLevel: "warning")
    // Every idle kind the thread target names: periodic-wakes, a
    // background-task holding its lease for a long command (checked every
    // 10 minutes), and a download-session with nothing queued.
    let mixedConfig = config.components(separatedBy: "[[strategy]]")[0]
        .replacingOccurrences(of: "\(dir.path)/state", with: "\(dir.path)/state-mixed")
        + idleStrategyTables(conditions: []).components(separatedBy: "[[strategy]]").prefix(3).joined(separator: "[[strategy]]")
        + """

        [[strategy]]
        name = "task"
        kind = "background-task"
        command = ["sleep", "100000"]
        budget = "1h"
        check_every = "10m"

        [[strategy]]
        name = "fetch"
        kind = "download-session"
        dir = "\(dir.path)/downloads"

        """
    let mixed = try vigildProcess(bin, dir: dir, name: "vigil-mixed", config: mixedConfig, logLevel: "warning")
    // The same host, run by the earlier build.
    let previous = try previousBin.map { previousBin in
        try vigildProcess(previousBin, dir: dir, name: "vigil-previous",
                          config: config.replacingOccurrences(of: "\(dir.path)/state", with: "\(dir.path)/state-previous"), logLevel: "warning")
    }
    // Reference 1: the same Swift runtime doing nothing but sleeping one
    // heartbeat interval at a time (this binary in `idle-reference` mode).
    let swiftReference = Process()
    swiftReference.executableURL = URL(fileURLWithPath: try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
    swiftReference.arguments = ["idle-reference", String(Int(interval))]
    // Reference 2: the floor, a shell loop waking once per interval.
    let reference = Process()
    reference.executableURL = URL(fileURLWithPath: "/bin/sh")
    reference.arguments = ["-c", "while sleep \(Int(interval)); do :; done"]
    // Reference 3: the floor of the same work, the simplest program that
    // writes a heartbeat row once per interval into SQLite as the survival
    // store does (WAL, synchronous = FULL: an fsync per commit), one thread.
    let storeReference = Process()
    storeReference.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    storeReference.arguments = ["-c", """
        import sqlite3, sys, time
        db = sqlite3.connect(sys.argv[1], isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS beat (at REAL)")
        while True:
            time.sleep(\(Int(interval)))
            db.execute("INSERT INTO beat VALUES (?)", (time.time(),))
        """, dir.appendingPathComponent("reference-store.sqlite").path]
    try host.run()
    try gated.run()
    try mixed.run()
    try previous?.run()
    try swiftReference.run()
    try reference.run()
    try storeReference.run()
    defer {
        for p in [host, gated, mixed] + (previous.map { [$0] } ?? []) { p.terminate(); p.waitUntilExit() }
        // The references hold nothing worth a clean stop: SIGKILL, and the
        // sh loop's sleep too before waiting. Foundation's Process reported
        // sh's end only once that sleep had ended as well, whether sh got
        // SIGTERM or SIGKILL: up to a minute after the figures.
        let loopSleep = childProcesses(of: reference.processIdentifier)
        for p in [swiftReference, reference, storeReference] { kill(p.processIdentifier, SIGKILL) }
        for child in loopSleep { kill(child, SIGKILL) }
        for p in [swiftReference, reference, storeReference] { p.waitUntilExit() }
    }
    // Let start-up finish (plugin loading, store migration) before measuring.
    try await Task.sleep(for: .seconds(3))
    let hostBefore = sampleThreads(pid: host.processIdentifier)
    let mixedBefore = sampleThreads(pid: mixed.processIdentifier)
    let gatedBefore = sampleThreads(pid: gated.processIdentifier)
    let previousBefore = previous.map { sampleThreads(pid: $0.processIdentifier) }
    let swiftBefore = sampleThreads(pid: swiftReference.processIdentifier)
    let refBefore = sampleThreads(pid: reference.processIdentifier)
    let storeRefBefore = sampleThreads(pid: storeReference.processIdentifier)
    print("measuring idle host (5 x periodic-wake every 10m, heartbeat every \(Int(interval))s) for \(Int(seconds)) s ...")
    try await Task.sleep(for: .seconds(seconds))
    let hostAfter = sampleThreads(pid: host.processIdentifier)
    let mixedAfter = sampleThreads(pid: mixed.processIdentifier)
    let gatedAfter = sampleThreads(pid: gated.processIdentifier)
    let previousAfter = previous.map { sampleThreads(pid: $0.processIdentifier) }
    let swiftAfter = sampleThreads(pid: swiftReference.processIdentifier)
    let refAfter = sampleThreads(pid: reference.processIdentifier)
    let storeRefAfter = sampleThreads(pid: storeReference.processIdentifier)
    let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

    func report(_ label: String, _ before: [Int: ThreadSample], _ after: [Int: ThreadSample]) -> (Int, Double) {
        print("\n\(label)")
        print("  thread            tid   voluntary  involuntary   cpu s")
        var totalV = 0, totalTicks = 0
        for (tid, a) in after.sorted(by: { $0.key < $1.key }) {
            let b = before[tid] ?? ThreadSample(name: a.name, voluntary: 0, involuntary: 0, cpuTicks: 0)
            let v = a.voluntary - b.voluntary, inv = a.involuntary - b.involuntary, ticks = a.cpuTicks - b.cpuTicks
            totalV += v
            totalTicks += ticks
            print("  " + a.name.padding(toLength: 16, withPad: " ", startingAt: 0) + String(format: "%6d %10d %12d %8.2f", tid, v, inv, Double(ticks) / ticksPerSecond))
        }
        let cpu = Double(totalTicks) / ticksPerSecond
        print(String(format: "  total: %d voluntary switches, %.2f CPU s", totalV, cpu))
        return (totalV, cpu)
    }
    let (hv, hcpu) = report("vigild (pid \(host.processIdentifier))", hostBefore, hostAfter)
    let (mv, mcpu) = report("vigild with 3 periodic-wakes, a background-task holding its lease and an idle download-session (pid \(mixed.processIdentifier))", mixedBefore, mixedAfter)
    let (gv, gcpu) = report("vigild, 3 of the 5 strategies gated by unchanging when conditions (pid \(gated.processIdentifier))", gatedBefore, gatedAfter)
    let previousFigures = previous.flatMap { p in
        previousBefore.flatMap { before in previousAfter.map { report("vigild of the earlier build in \(previousBin?.path ?? "?") (pid \(p.processIdentifier))", before, $0) } }
    }
    let (sv, scpu) = report("reference 1: Swift process sleeping \(Int(interval)) s at a time (same runtime; pid \(swiftReference.processIdentifier))", swiftBefore, swiftAfter)
    let (tv, tcpu) = report("reference 3: a python3 loop writing one SQLite row (WAL, synchronous = FULL) every \(Int(interval)) s (pid \(storeReference.processIdentifier))", storeRefBefore, storeRefAfter)
    let (rv, rcpu) = report("reference 2: sh loop waking every \(Int(interval)) s (pid \(reference.processIdentifier))", refBefore, refAfter)
    let expectedWakes = Int((seconds / interval).rounded(.down))
    print("\nscheduled wakes in the window: \(expectedWakes) heartbeat(s), 0 strategy runs (10-minute periods)")
    print(String(format: "vigild:      %4d voluntary switches (%.1f per scheduled wake), %.2f CPU s", hv, Double(hv) / Double(max(expectedWakes, 1)), hcpu))
    print(String(format: "vigild gated: %3d voluntary switches (%.1f per scheduled wake), %.2f CPU s; the condition sources are watches on the event loop (no threads of their own)", gv, Double(gv) / Double(max(expectedWakes, 1)), gcpu))
    print(String(format: "vigild mixed: %3d voluntary switches, %.2f CPU s", mv, mcpu))
    // Threads at the end of the window (target: at most 3), each with its
    // name; the references have 1 (sh) and the Swift runtime's own.
    func threads(_ sample: [Int: ThreadSample]) -> String {
        let names = sample.values.map(\.name).sorted()
        return "\(names.count) (\(names.joined(separator: ", ")))"
    }
    print("threads: vigild \(threads(hostAfter)); vigild mixed \(threads(mixedAfter)); vigild gated \(threads(gatedAfter)); "
        + "reference 1 \(swiftAfter.count); reference 2 \(refAfter.count)")
    if let (pv, pcpu) = previousFigures {
        print(String(format: "vigild, earlier build: %d voluntary switches, %.2f CPU s (this build: %+d)", pv, pcpu, hv - pv))
    }
    print(String(format: "reference 1: %4d voluntary switches, %.2f CPU s", sv, scpu))
    print(String(format: "reference 2: %4d voluntary switches, %.2f CPU s", rv, rcpu))
    print(String(format: "reference 3: %4d voluntary switches (%.1f per scheduled wake), %.2f CPU s: the floor of the same work (a heartbeat row, fsynced)", tv, Double(tv) / Double(max(expectedWakes, 1)), tcpu))
    print("""
    note: on Linux, libdispatch arms a 1 Hz worker-pool monitor once a non-overcommit worker \
    has run (src/event/workqueue.c); reference 1 (Swift's default executor and Task.sleep) pays \
    it. vigild avoids it with its own executor and timerfd-based sleeps (Plugins/VigilKit/Sources/CVigilLoop), so \
    what remains is the scheduled wakes themselves.
    """)
    // Before the deferred stops: a child that is slow to be reaped must not
    // keep the figures in the buffer.
    fflush(nil)
}

/// The children of `pid` (its main thread's, as /proc lists them).
func childProcesses(of pid: Int32) -> [Int32] {
    let list = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
    return list.split(separator: " ").compactMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
}

/// Five periodic-wake instances at 10-minute intervals: the idle host's
/// `[[strategy]]` tables (idle-cost, metrics).
let idleStrategies = idleStrategyTables(conditions: [])

/// The five instances, the first ones with a `when` line each from `conditions`.
func idleStrategyTables(conditions: [String]) -> String {
    (0..<5).map { i in
        """

        [[strategy]]
        name = "sync\(i)"
        kind = "periodic-wake"
        every = "10m"
        tolerance = "1m"
        run = ["true"]
        \(i < conditions.count ? conditions[i] : "")

        """
    }.joined()
}

/// vigil-bench idle-reference SECONDS: sleeps SECONDS at a time, forever.
/// The Swift-runtime reference for idle-cost.
func idleReference(_ args: [String]) async throws {
    let seconds = args.first.flatMap(Int.init) ?? 60
    while true { try await Task.sleep(for: .seconds(seconds)) }
}
