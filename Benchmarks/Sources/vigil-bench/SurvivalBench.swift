// vigil-bench survival-report [--keep FILE] [--iterations N] [--heartbeats N] [--single N]
//
// Builds a store holding one year of minute heartbeats (525,600 rows, in 12
// runs with suspends, stalls, killed/rebooted ends and a lease; --heartbeats:
// another number of rows, at least 120), through the
// store's real write path, then times what `vigilctl survival` does
// (SurvivalReport.load + text formatting) against a reference measured in
// the same run: recounting the same figures with one full scan of the
// heartbeat table (window functions). Next to it, in the same run, what
// `vigilctl survival --runs 0 --html` does over the whole year
// (SurvivalPicture.load + the HTML page) and the page's size.
import Foundation
import VigilTestSupport
import VigilHost

func survivalReportBench(_ arguments: [String]) async throws {
    var keep: String?
    var iterations = 15
    var rows = 525_600  // a year of minute heartbeats
    var single = 200
    let usage = "usage: vigil-bench survival-report [--keep FILE] [--iterations N] [--heartbeats N (>= 120)] [--single N]"
    var rest = arguments[...]
    func count(_ flag: String, atLeast minimum: Int) throws -> Int {
        guard let value = rest.popFirst().flatMap(Int.init), value >= minimum else {
            throw BenchUsageError("\(flag) takes a number of at least \(minimum)\n\(usage)")
        }
        return value
    }
    while let argument = rest.popFirst() {
        switch argument {
        case "--keep": keep = rest.popFirst()
        case "--iterations": iterations = try count(argument, atLeast: 1)
        case "--heartbeats": rows = try count(argument, atLeast: 120)
        case "--single": single = try count(argument, atLeast: 1)
        default:
            print(usage)
            return
        }
    }
    let directory = NSTemporaryDirectory() + "vigil-survival-bench-" + UUID().uuidString
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = keep ?? directory + "/survival.sqlite"
    if keep != nil { try? FileManager.default.removeItem(atPath: path) }

    let writeStart = ContinuousClock.now
    let shape = try await writeYear(path: path, heartbeats: rows)
    let writeTime = ContinuousClock.now - writeStart
    let singleBeat = try await timeSingleHeartbeats(path: directory + "/single.sqlite", count: single)

    let attributes = try FileManager.default.attributesOfItem(atPath: path)
    let mainBytes = (attributes[.size] as? Int) ?? 0
    let walBytes = ((try? FileManager.default.attributesOfItem(atPath: path + "-wal"))?[.size] as? Int) ?? 0
    let megabytes = Double(mainBytes + walBytes) / 1_048_576

    var reportTimes: [Duration] = []
    var allRunsTimes: [Duration] = []
    var pictureTimes: [Duration] = []
    var page = ""
    let zone = DisplayTimeZone.resolve().zone
    var referenceTimes: [Duration] = []
    var text = ""
    var summaries: [RunSummary] = []
    var recount: [RunRecount] = []
    for _ in 0..<iterations {
        var t = ContinuousClock.now
        summaries = try SurvivalReport.load(path: path, runs: 10, sinceWallMicros: nil)
        text = SurvivalReportFormat.text(summaries, width: 100)
        reportTimes.append(ContinuousClock.now - t)

        t = ContinuousClock.now
        let all = try SurvivalReport.load(path: path, runs: nil, sinceWallMicros: nil)
        _ = SurvivalReportFormat.json(all)
        allRunsTimes.append(ContinuousClock.now - t)

        t = ContinuousClock.now
        let picture = try SurvivalPicture.load(path: path, runs: nil, sinceWallMicros: nil)
        page = SurvivalPictureFormat.html(picture, timeZone: zone, nowWall: Int64(Date().timeIntervalSince1970 * 1_000_000))
        pictureTimes.append(ContinuousClock.now - t)

        t = ContinuousClock.now
        recount = try SurvivalReport.recount(path: path)
        referenceTimes.append(ContinuousClock.now - t)
    }
    let all = try SurvivalReport.load(path: path, runs: nil, sinceWallMicros: nil)
    let agree = recount.count == all.count && zip(recount, all).allSatisfy { $0.matches($1) }

    func ms(_ d: Duration) -> String { String(format: "%.2f ms", Double(d.components.attoseconds) / 1e15 + Double(d.components.seconds) * 1e3) }
    func median(_ xs: [Duration]) -> Duration { xs.sorted()[xs.count / 2] }
    let heartbeats = all.map(\.heartbeats).reduce(0, +)
    print("survival-report: \(heartbeats) heartbeats in \(all.count) runs (\(shape.suspends) suspends, \(shape.stalls) stalls, \(shape.leaseSpans) lease changes)")
    print("  build (appendHeartbeats, 1 transaction per run): \(ms(writeTime)) = \(String(format: "%.1f", Double(heartbeats) / seconds(writeTime))) heartbeats/s")
    print("  one heartbeat() = one transaction, synchronous=FULL: median \(ms(median(singleBeat))), max \(ms(singleBeat.max() ?? .zero)) (\(singleBeat.count) beats)")
    print(String(format: "  store size: %.1f MB (main %.1f MB + wal %.1f MB); target < 40 MB: %@", megabytes,
                 Double(mainBytes) / 1_048_576, Double(walBytes) / 1_048_576, megabytes < 40 ? "yes" : "NO"))
    print("  report (load 10 runs + text), \(iterations) runs: median \(ms(median(reportTimes))), max \(ms(reportTimes.max() ?? .zero)); target < 200 ms: \(median(reportTimes) < .milliseconds(200) ? "yes" : "NO")")
    print("  report (load all runs + JSON): median \(ms(median(allRunsTimes))), max \(ms(allRunsTimes.max() ?? .zero))")
    let pageMB = Double(page.utf8.count) / 1_048_576
    print("  picture (--runs 0 --html: load all runs and lease spans + page), \(shape.wakes) wakes: median \(ms(median(pictureTimes))), max \(ms(pictureTimes.max() ?? .zero)); target < 1 s: \(median(pictureTimes) < .seconds(1) ? "yes" : "NO")")
    print(String(format: "  picture page size: %.3f MB (%d bytes); target < 2 MB: %@", pageMB, page.utf8.count, pageMB < 2 ? "yes" : "NO"))
    print("  ratio picture / text report: \(String(format: "%.1f", seconds(median(pictureTimes)) / seconds(median(reportTimes))))")
    print("  reference: full scan recount of all heartbeats (window functions): median \(ms(median(referenceTimes))), max \(ms(referenceTimes.max() ?? .zero))")
    print(String(format: "  ratio report / full scan: %.4f (the report is %.0fx faster)",
                 seconds(median(reportTimes)) / seconds(median(referenceTimes)),
                 seconds(median(referenceTimes)) / seconds(median(reportTimes))))
    print("  write-time aggregates agree with the recount: \(agree ? "yes" : "NO")")
    print("\n" + text.split(separator: "\n", omittingEmptySubsequences: false).prefix(12).joined(separator: "\n"))
    if let keep { print("store kept at \(keep)") }
}

private func seconds(_ d: Duration) -> Double {
    Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

private struct YearShape {
    var suspends = 0
    var stalls = 0
    var leaseSpans = 0
    var wakes = 0
}

/// Writes `heartbeats` minute heartbeats as 12 runs of equal length through
/// `SurvivalStore`, one `appendHeartbeats` transaction per run.
private func writeYear(path: String, heartbeats: Int) async throws -> YearShape {
    var shape = YearShape()
    let runs = 12
    let perRun = heartbeats / runs // including each run's start (heartbeat 0)
    var wall: Int64 = 1_735_689_600_000_000 // 2025-01-01
    var mono: Int64 = 10_000_000
    var boot: Int64 = 10_000_000
    var bootID = UUID().uuidString
    let minute: Int64 = 60_000_000
    var generator = SplitMix(seed: 2025)
    for index in 0..<runs {
        let store = try SurvivalStore(path: path)
        let runID = UUID().uuidString
        _ = try await store.beginRun(RunStart(
            runId: runID, pid: Int32(1000 + index), bootID: bootID, version: "bench", configPath: "/etc/vigil/vigil.toml",
            interval: .seconds(60), readings: ClockReadings(wallMicros: wall, monotonicMicros: mono, boottimeMicros: boot)))
        var samples: [HeartbeatSample] = []
        var resumes: [SurvivalStore.Event] = []
        samples.reserveCapacity(perRun)
        var lease = HeartbeatLease(id: 1, strategy: "focus-timer", holds: "logind", state: "active")
        let last = index == runs - 1 ? perRun : perRun - 1 // the last run stops cleanly (final heartbeat)
        for i in 1..<last {
            var step = minute + Int64(generator.next() % 2_000_000) - 1_000_000 // ±1 s jitter
            var sleep: Int64 = 0
            if generator.next() % 12_000 == 0 { // a suspend about every 8 days
                sleep = Int64(1 + generator.next() % 8) * 3_600_000_000
                shape.suspends += 1
            } else if generator.next() % 25_000 == 0 { // a stall about every 17 days
                step = Int64(2 + generator.next() % 9) * minute
                shape.stalls += 1
            }
            wall += step + sleep
            mono += step
            boot += step + sleep
            if sleep > 0 {
                // What woke it, as the running host records it: a Vigil
                // alarm of the lease's strategy, or something else.
                let resumed = ClockReadings(wallMicros: wall - step / 2, monotonicMicros: mono - step / 2, boottimeMicros: boot - step / 2)
                let wake = shape.wakes % 3 == 2
                    ? SystemWake(wall: resumed.wallMicros, startOffsetMicros: 0, suspendedMicros: sleep, cause: .other, kernelSource: "LNXPWRBN:00")
                    : SystemWake(wall: resumed.wallMicros, startOffsetMicros: 0, suspendedMicros: sleep, cause: .vigilAlarm,
                                 alarm: "focus-timer background-task", alarmStrategy: "focus-timer", alarmKind: "background-task", latenessMicros: 300_000)
                resumes.append(SurvivalStore.Event(SystemWake.eventName, strategy: nil, fields: wake.fields, readings: resumed))
                shape.wakes += 1
            }
            // The lease is held 16 hours of every 24 and changes state every 4 hours.
            if i % 240 == 0 {
                lease.state = lease.state == "active" ? "expiring" : "active"
                shape.leaseSpans += 1
            }
            let held = (i / 480) % 3 != 2
            samples.append(HeartbeatSample(readings: ClockReadings(wallMicros: wall, monotonicMicros: mono, boottimeMicros: boot),
                                           leases: held ? [lease] : []))
        }
        try await store.appendHeartbeats(samples)
        try await store.recordEvents(resumes)
        switch index % 4 {
        case 3 where index != runs - 1:
            // Rebooted: the next run starts in a new boot with fresh clocks.
            bootID = UUID().uuidString
            mono = 10_000_000
            boot = 10_000_000
            wall += 120_000_000
        case 1:
            wall += 30_000_000; mono += 30_000_000; boot += 30_000_000 // killed: no end written
        default:
            wall += minute; mono += minute; boot += minute
            try await store.endRun(reason: .stopped, readings: ClockReadings(wallMicros: wall, monotonicMicros: mono, boottimeMicros: boot))
        }
    }
    return shape
}

/// Times `count` heartbeats written one transaction each, as the host does.
private func timeSingleHeartbeats(path: String, count: Int) async throws -> [Duration] {
    let store = try SurvivalStore(path: path)
    var readings = ClockReadings.now()
    _ = try await store.beginRun(RunStart(runId: UUID().uuidString, pid: getpid(), bootID: "bench", version: "bench",
                                          configPath: "-", interval: .seconds(60), readings: readings))
    let lease = HeartbeatLease(id: 1, strategy: "focus-timer", holds: "logind", state: "active")
    var times: [Duration] = []
    for _ in 0..<count {
        readings.wallMicros += 60_000_000
        readings.monotonicMicros += 60_000_000
        readings.boottimeMicros += 60_000_000
        let start = ContinuousClock.now
        try await store.heartbeat(readings, leases: [lease])
        times.append(ContinuousClock.now - start)
    }
    return times.sorted()
}

