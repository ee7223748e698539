// vigil-bench wake-latency [--requesters N] [--period-ms P] [--window-ms W] [--seconds S]
//
// N periodic requesters (period P, window W, phases spread over the period)
// run for S seconds on the real wake scheduler (timerfd watched on the event loop).
// Reference, same run: a bare CLOCK_MONOTONIC periodic timerfd read in a
// loop on its own thread, i.e. the latency of the kernel timer itself.
import CTimer
import Foundation
import VigilHost
import VigilKit

func wakeLatencyBench(_ args: [String]) async throws {
    let options = try WakeBenchOptions(args)
    let period = Duration.milliseconds(options.periodMs)
    let window = Duration.milliseconds(options.windowMs)
    let runTime = Duration.seconds(options.seconds)
    print("wake-latency: \(options.requesters) requesters, period \(options.periodMs) ms, window \(options.windowMs) ms, \(options.seconds) s each run")

    // Reference first, alone, so the two runs do not compete for the 2 cores.
    let reference = try await bareTimerFDLateness(period: period, runTime: runTime)

    let scheduler = try WakeScheduler.system()
    let clock = SystemClock()
    let start = clock.now + .milliseconds(50)
    let end = start + runTime
    let samples = try await withThrowingTaskGroup(of: [WakeSample].self) { group in
        for index in 0..<options.requesters {
            let phase = period * index / options.requesters
            group.addTask {
                var samples: [WakeSample] = []
                var next = start + phase
                while next < end {
                    let request = WakeRequest(earliest: next, latest: next + window, label: "bench \(index)")
                    let firing = try await scheduler.wake(request)
                    samples.append(WakeSample(firing: firing, resumedAt: clock.now))
                    next = next + period
                }
                return samples
            }
        }
        var all: [WakeSample] = []
        for try await samples in group { all += samples }
        return all
    }
    let stats = await scheduler.statistics

    // One lateness per batch (every request of a batch shares its firing), and
    // one per request for when its task actually resumed.
    let batches = Set(samples.map(\.firing))
    let batchLateness = batches.map(\.lateness)
    let resumeLateness = samples.map { $0.resumedAt - $0.firing.target }
    let laterThan1ms = samples.filter { $0.firing.lateness > .milliseconds(1) }.count

    func row(_ name: String, _ values: [Duration]) -> String {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return name + "  (no samples)" }
        func pick(_ q: Double) -> Duration { sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))] }
        return name.padding(toLength: 34, withPad: " ", startingAt: 0)
            + [pick(0.5), pick(0.99), sorted[sorted.count - 1]].map { ms($0).leftPadded(10) }.joined()
            + String(sorted.count).leftPadded(10)
    }
    print("")
    print("lateness".padding(toLength: 34, withPad: " ", startingAt: 0) + ["median", "p99", "max", "samples"].map { $0.leftPadded(10) }.joined())
    print(row("reference: bare MONOTONIC timerfd", reference))
    print(row("scheduler: batch fired (actor)", batchLateness))
    print(row("scheduler: requester resumed", resumeLateness))
    let medianRatio = median(batchLateness).seconds / max(median(reference).seconds, 1e-9)
    print("")
    print("median batch lateness / median bare timerfd lateness: \(String(format: "%.1f", medianRatio))x")
    print("timer expirations: \(stats.timerExpirations) for \(stats.requestsFired) requests "
        + "(coalescing: \(String(format: "%.2f", Double(stats.requestsFired) / Double(max(stats.timerExpirations, 1)))) requests per expiration; "
        + "without coalescing: \(stats.requestsFired) expirations)")
    print("scheduler statistics: batches \(stats.batchesFired), mean lateness \(ms(stats.meanLateness)), max \(ms(stats.maxLateness)); "
        + "requests fired more than 1 ms late: \(laterThan1ms) of \(samples.count)")
    // Idle check: one request 1 s ahead; count the process's context switches
    // (all threads) while it waits. A polling loop would show up here.
    let idleBefore = processContextSwitches()
    let idleFiring = try await scheduler.wake(WakeRequest(earliest: clock.now + .seconds(1), latest: clock.now + .seconds(1), label: "idle"))
    let idleAfter = processContextSwitches()
    print("idle 1 s with one pending request: \(idleAfter - idleBefore) context switches in the whole process "
        + "(the firing itself included; lateness \(ms(idleFiring.lateness)))")
    print("clock: \(scheduler.clockInfo.clock) (canWakeSystem \(scheduler.clockInfo.canWakeSystem)): \(scheduler.clockInfo.reason)")
}

private struct WakeSample: Sendable {
    var firing: WakeFiring
    var resumedAt: VigilInstant
}

private struct WakeBenchOptions {
    var requesters = 10
    var periodMs = 100
    var windowMs = 20
    var seconds = 5

    init(_ args: [String]) throws {
        var rest = args[...]
        while let flag = rest.popFirst() {
            guard let text = rest.popFirst(), let value = Int(text), value > 0 else {
                throw WakeBenchError(message: "\(flag) needs a positive integer")
            }
            switch flag {
            case "--requesters": requesters = value
            case "--period-ms": periodMs = value
            case "--window-ms": windowMs = value
            case "--seconds": seconds = value
            default: throw WakeBenchError(message: "unknown option \(flag) (expected --requesters, --period-ms, --window-ms, --seconds)")
            }
        }
    }
}

private struct WakeBenchError: Error, CustomStringConvertible {
    var message: String
    var description: String { "wake-latency: \(message)" }
}

/// Lateness of every expiration of a bare periodic CLOCK_MONOTONIC timerfd,
/// read with blocking reads on a dedicated thread.
private func bareTimerFDLateness(period: Duration, runTime: Duration) async throws -> [Duration] {
    let fd = vigil_timerfd_create(vigil_CLOCK_MONOTONIC, vigil_TFD_CLOEXEC)
    guard fd >= 0 else { throw WakeTimerError(operation: "timerfd_create(CLOCK_MONOTONIC)", code: errno) }
    let periodNs = period.nanoseconds
    let first = vigil_clock_ns(vigil_CLOCK_MONOTONIC) + 50_000_000
    let expirations = Int(runTime.nanoseconds / periodNs)
    guard vigil_timerfd_arm_periodic(fd, first, periodNs) == 0 else {
        let code = errno
        close(fd)
        throw WakeTimerError(operation: "timerfd_settime(CLOCK_MONOTONIC)", code: code)
    }
    return await withCheckedContinuation { (continuation: CheckedContinuation<[Duration], Never>) in
        let thread = Thread {
            var lateness: [Duration] = []
            var expired: Int64 = 0
            while expired < expirations {
                let count = vigil_timerfd_read(fd)
                let now = vigil_clock_ns(vigil_CLOCK_MONOTONIC)
                guard count > 0 else { break }
                expired += count
                // The latest expiration this read reports was due at first + (expired-1) * period.
                lateness.append(.nanoseconds(now - (first + (expired - 1) * periodNs)))
            }
            close(fd)
            continuation.resume(returning: lateness)
        }
        thread.start()
    }
}

/// Voluntary plus involuntary context switches of all threads of this
/// process so far (getrusage sums live and exited threads).
private func processContextSwitches() -> Int {
    var usage = rusage()
    guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return 0 }
    return usage.ru_nvcsw + usage.ru_nivcsw
}

private func median(_ values: [Duration]) -> Duration {
    let sorted = values.sorted()
    return sorted.isEmpty ? .zero : sorted[sorted.count / 2]
}

private func ms(_ d: Duration) -> String { String(format: "%.3f ms", d.seconds * 1_000) }

extension String {
    fileprivate func leftPadded(_ width: Int) -> String {
        count >= width ? " " + self : String(repeating: " ", count: width - count) + self
    }
}
