import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// The real periodic-wake plugin, loaded from the build directory like the
/// host loads it, driven by the test clock.
enum PeriodicWakePlugin {
    static let loader = PluginLoader(searchPath: [PluginLoader.executableDirectory() ?? "."])

    static func make(_ values: [String: ConfigValue], name: String = "pw") throws -> any KeepAliveStrategy {
        let kind = try loader.loadKind("periodic-wake").get()
        let reader = ConfigReader(strategyName: name, keyPath: "strategy[0]", values: values)
        let strategy = try kind.makeStrategy(reader)
        guard reader.problems.isEmpty else { throw DescribedError("config problems: \(reader.problems)") }
        return strategy
    }
}


/// A scheduler wrapper that checks every firing against its request's window.
final class WindowChecker: WakeScheduling, Sendable {
    private let checked = Lock((violations: [String](), fired: 0))
    var violations: [String] { checked.withLock { $0.violations } }
    var fired: Int { checked.withLock { $0.fired } }
    let inner: WakeScheduler
    let clock: any VigilClock

    init(_ inner: WakeScheduler, clock: any VigilClock) {
        self.inner = inner
        self.clock = clock
    }

    var clockInfo: WakeClockInfo { inner.clockInfo }

    func wake(_ request: WakeRequest) async throws -> WakeFiring {
        let firing = try await inner.wake(request)
        let now = clock.now
        checked.withLock {
            $0.fired += 1
            if now < request.earliest { $0.violations.append("\(request.label) fired \(request.earliest - now) early") }
            if now > request.latest { $0.violations.append("\(request.label) fired \(now - request.latest) late") }
        }
        return firing
    }
}

/// Records hook runs instead of starting processes (the hook runner has its
/// own tests), and what the lease registry held at that moment.
final class RecordingHooks: HookRunning {
    struct Run: Sendable {
        var event: String
        var variables: [String: String]
        var leases: Int
    }

    let log = WaitableLog<Run>()
    let registry: LeaseRegistry
    init(registry: LeaseRegistry) { self.registry = registry }

    func run(_ command: HookCommand, event: String, variables: [String: String]) async -> HookResult {
        let held = await registry.active.count
        log.append(Run(event: event, variables: variables, leases: held))
        return HookResult(exit: .exited(0), output: "", duration: .zero)
    }
    var runs: [Run] { log.all }
    var count: Int { log.count }

    /// Waits until at least `n` runs were recorded, or `timeout` of real time
    /// passed (a run the clock made due is started by the strategy's task,
    /// which a loaded machine may schedule late); returns the count then.
    func waitForCount(atLeast n: Int, timeout: Duration = .seconds(10)) async -> Int {
        await log.wait(forCount: n, timeout: timeout)
    }
}

/// A strategy's recorded events (VigilKitTesting's waitable log).
typealias RecordingEvents = WaitableLog<RecordedEvent>

extension WaitableLog where Item == RecordedEvent {
    /// Returns once an event named `name` was recorded; throws after `timeout`.
    func waitFor(_ name: String, timeout: Duration = .seconds(30)) async throws {
        guard await wait(for: name, timeout: timeout) else {
            throw DescribedError("no \(name) event after \(timeout); events: \(all.map(\.name))")
        }
    }

    /// Returns once at least one event was recorded (or after `timeout`).
    func waitForFirst(timeout: Duration = .seconds(30)) async {
        await wait(forCount: 1, timeout: timeout)
    }
}

struct Harness {
    let clock: ManualClock
    let timer: ClockDrivenWakeTimer
    let scheduler: WakeScheduler
    let checker: WindowChecker
    let registry: LeaseRegistry
    let hooks: RecordingHooks
    let events = RecordingEvents()
    let logs = WaitableLog<LogLine>()
    let supervisor: Supervisor

    /// `clock` and `store` may be shared with an earlier harness: a host
    /// that restarts on the same store, its clock having moved on.
    init(clock: ManualClock = ManualClock(), store: (any StrategyStore)? = nil) {
        self.clock = clock
        timer = ClockDrivenWakeTimer(clock: clock)
        scheduler = WakeScheduler(clock: clock, timer: timer)
        checker = WindowChecker(scheduler, clock: clock)
        registry = LeaseRegistry(clock: clock)
        hooks = RecordingHooks(registry: registry)
        let hooks = self.hooks, events = self.events
        var services = StrategyServices(
            registry: registry, scheduler: checker, clock: clock, logging: logs.logging,
            hooks: { _, _ in hooks }, events: { _ in events }
        )
        if let store { services.store = { _ in store } }
        supervisor = Supervisor(services: services)
    }

    /// Waits until `requests` wake requests are pending and the scheduler's
    /// timer sleeps on the clock (``ManualClock/armed(_:timer:requests:)``).
    func armed(_ requests: Int) async throws {
        try await clock.armed(scheduler, timer: timer, requests: requests)
    }

    /// Moves the clock on by `duration` one deadline at a time, each step
    /// once `requests` wake requests are pending again (``armed(_:)``).
    func advance(by duration: Duration, requests: Int = 1) async throws {
        let target = clock.now + duration
        while true {
            try await armed(requests)
            guard let next = clock.nextDeadline, next <= target else { break }
            await clock.advance(to: next)
        }
        await clock.advance(to: target)
    }
}

@Suite struct PeriodicWakeTests {
    /// `run_at_start` runs at once: not on an `align` slot inside the
    /// tolerance, nor after a random delay (Configs/default.toml relies on
    /// it to show a run within seconds). The next run keeps the grid.
    @Test func runAtStartRunsAtOnceThenOnTheGrid() async throws {
        // 100 s past a 5-minute slot of the wall clock: the next slot is
        // 200 s away, beyond the 30 s tolerance.
        let h = Harness(clock: ManualClock(start: VigilInstant(nanoseconds: 1_100_000_000_000)))
        let started = h.clock.now
        let s = try PeriodicWakePlugin.make([
            "every": .string("5m"), "tolerance": .string("30s"), "align": .boolean(true), "randomized_delay": .string("1m"),
            "run_at_start": .boolean(true), "run": .array([.string("true")]),
        ])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        // The test clock does not move: the run cannot wait for any instant.
        #expect(await h.hooks.waitForCount(atLeast: 1) == 1)
        #expect(h.clock.now == started)
        #expect(h.hooks.runs.first?.variables["sequence"] == "1")
        // The second: 5 min on (+ at most the delay and the tolerance).
        try await h.advance(by: .seconds(300 - 1))
        #expect(h.hooks.count == 1)
        try await h.advance(by: .seconds(91))
        #expect(await h.hooks.waitForCount(atLeast: 2) == 2)
        #expect(h.checker.violations.isEmpty, "\(h.checker.violations)")
        await h.supervisor.stopAll()
    }

    @Test func overlappingInstancesCoalesceAndNeverFireOutsideTheirWindows() async throws {
        let h = Harness()
        // Five instances, every 10 minutes with a 3-minute window, started
        // 40 s apart so their windows overlap without being identical.
        for i in 0..<5 {
            let s = try PeriodicWakePlugin.make(["every": .string("10m"), "tolerance": .string("3m"), "run": .array([.string("true")])])
            await h.supervisor.start([SupervisedStrategy(name: "pw\(i)", kind: "periodic-wake", strategy: s)])
            try await h.advance(by: .seconds(40), requests: i + 1)
        }
        try await h.advance(by: .seconds(2 * 3600), requests: 5)
        let stats = await h.scheduler.statistics
        let runs = h.hooks.count
        // 5 instances x 12 periods (give or take the last partial period).
        #expect(runs >= 55 && runs <= 60, "runs: \(runs)")
        #expect(stats.timerExpirations < runs, "expirations \(stats.timerExpirations) must be fewer than \(runs) runs")
        #expect(stats.timerExpirations <= 15, "expirations: \(stats.timerExpirations)")
        #expect(h.checker.violations.isEmpty, "\(h.checker.violations)")
        // Each run held a lease while its command ran.
        #expect(h.hooks.runs.allSatisfy { $0.leases >= 1 })
        #expect(await h.registry.active.isEmpty)
        await h.supervisor.stopAll()
    }

    @Test(arguments: [("skip", 0), ("once", 1), ("all", 3)])
    func catchUpAfterASuspend(_ mode: String, _ expectedRuns: Int) async throws {
        let h = Harness()
        let s = try PeriodicWakePlugin.make([
            "every": .string("10m"), "tolerance": .string("1m"), "catch_up": .string(mode), "run": .array([.string("true")]),
        ])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        // Once it waits for its first wake, the system sleeps through that
        // window and two more periods.
        try await h.armed(1)
        await h.clock.jump(by: .seconds(35 * 60))
        // It catches up, then asks for its next wake.
        try await h.armed(1)
        #expect(h.hooks.count == expectedRuns)
        let wake = h.events.all.last
        #expect(wake?.fields["missed"] == "2")
        #expect(wake?.name == (mode == "skip" ? "wake-skipped" : "wake"))
        // Back on the original 10-minute grid: the next run is at 40 min.
        try await h.advance(by: .seconds(4 * 60 + 59))
        #expect(h.hooks.count == expectedRuns)
        try await h.advance(by: .seconds(62))
        #expect(h.hooks.count == expectedRuns + 1)
        await h.supervisor.stopAll()
    }

    @Test func recordsLatenessAndExitStatusOfEachWake() async throws {
        let h = Harness()
        let s = try PeriodicWakePlugin.make(["every": .string("1m"), "tolerance": .string("0s"), "run": .array([.string("true")])])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        try await h.advance(by: .seconds(180))
        let wakes = h.events.all.filter { $0.name == "wake" }
        #expect(wakes.count == 3)
        #expect(wakes.allSatisfy { $0.fields["exit"] == "exited with status 0" && $0.fields["lateness_ms"] == "0.0" })
        #expect(h.hooks.runs.map { $0.variables["sequence"] } == ["1", "2", "3"])
        await h.supervisor.stopAll()
    }

    @Test func wakeSystemWithoutAnAlarmClockSaysWhy() async throws {
        let h = Harness()
        let s = try PeriodicWakePlugin.make(["every": .string("1m"), "wake_system": .boolean(true), "run": .array([.string("true")])])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        try await h.clock.settle(until: "the strategy says why it cannot wake the system") {
            h.logs.entries.contains { $0.contains("wake_system is set but this host cannot wake a suspended system") }
        }
        await h.supervisor.stopAll()
    }

    @Test func rejectsBadOptions() throws {
        let kind = try PeriodicWakePlugin.loader.loadKind("periodic-wake").get()
        let reader = ConfigReader(strategyName: "pw", keyPath: "strategy[0]", values: [
            "every": .string("0s"), "tolerance": .string("-1m"), "catch_up": .string("sometimes"),
            "run": .array([]), "run_timeout": .string("forever"), "align": .integer(3),
        ])
        _ = try kind.makeStrategy(reader)
        let messages = reader.problems.map(\.description).joined(separator: "\n")
        #expect(reader.problems.count == 6, "\(messages)")
        #expect(messages.contains("strategy[0].every: expected a duration greater than zero"))
        #expect(messages.contains("strategy[0].catch_up: expected one of \"skip\", \"once\", \"all\", found \"sometimes\""))
        #expect(messages.contains("strategy[0].run: expected a non-empty argv array"))
        #expect(messages.contains("strategy[0].align: expected true, false or a slot duration"))
    }

    /// `persistent = true`, `every = "1h"`: the host stops 3 h after the
    /// last run and starts again. Per `catch_up` it runs once at start
    /// (not three times, not zero), or once per missed period, or not at
    /// all; then it carries on on the last run's hourly grid. A last run
    /// 30 min before the start is not overdue: the next run comes 30 min
    /// later. Without `persistent` nothing runs at start.
    @Test(arguments: [
        ("once", true, 3, 1), ("all", true, 3, 3), ("skip", true, 3, 0), ("once", false, 3, 0), ("once", true, 0, 0),
    ])
    func persistentCatchesUpAfterTheHostWasStopped(_ mode: String, _ persistent: Bool, _ hoursStopped: Int, _ runsAtStart: Int) async throws {
        let clock = ManualClock()
        // The host's own SQLite store, opened anew for the second start.
        var template = Array("/tmp/vigil-pw-XXXXXX".utf8CString)
        let directory = try #require(mkdtemp(&template).map { String(cString: $0) })
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/survival.sqlite"
        let values: [String: ConfigValue] = [
            "every": .string("1h"), "tolerance": .string("1m"), "persistent": .boolean(persistent),
            "catch_up": .string(mode), "run": .array([.string("true")]),
        ]
        do {
            let before = Harness(clock: clock, store: HostStrategyStore(store: try SurvivalStore(path: path), strategy: "pw"))
            await before.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: try PeriodicWakePlugin.make(values))])
            try await before.advance(by: .seconds(3600 + 60))
            #expect(await before.hooks.waitForCount(atLeast: 1) == 1)
            await before.supervisor.stopAll()
        }
        // Stopped: 3 h after the last run (plus a minute), or 30 min.
        await clock.jump(by: hoursStopped > 0 ? .seconds(hoursStopped * 3600 + 60) : .seconds(30 * 60))

        let after = Harness(clock: clock, store: HostStrategyStore(store: try SurvivalStore(path: path), strategy: "pw"))
        await after.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: try PeriodicWakePlugin.make(values))])
        // It catches up (or not), then asks for its next wake.
        try await after.armed(1)
        #expect(await after.hooks.waitForCount(atLeast: runsAtStart) == runsAtStart, "\(after.logs.entries)")
        if persistent, hoursStopped > 0 {
            try await after.events.waitFor(mode == "skip" ? "wake-skipped" : "wake")
            let first = try #require(after.events.all.first)
            #expect(first.name == (mode == "skip" ? "wake-skipped" : "wake"))
            #expect(first.fields["missed"] == "2")
            #expect(after.logs.entries.contains { $0.contains("persistent: 3 run(s) fell due while the host was stopped") })
        }
        // The next run: on the last run's grid when persistent (59 min after
        // the start, or 30 min after it when not overdue); a full period
        // after the start otherwise.
        let next: Int = persistent ? (hoursStopped > 0 ? 59 * 60 : 30 * 60) : 3600
        try await after.advance(by: .seconds(next - 5))
        #expect(after.hooks.count == runsAtStart)
        try await after.advance(by: .seconds(70))
        #expect(await after.hooks.waitForCount(atLeast: runsAtStart + 1) == runsAtStart + 1)
        #expect(after.checker.violations.isEmpty, "\(after.checker.violations)")
        await after.supervisor.stopAll()
    }

    /// A malformed last-run record is reported and ignored: a new schedule starts.
    @Test func persistentIgnoresAMalformedRecord() async throws {
        let store = MemoryStrategyStore()
        await store.put("last-run", Array("yesterday".utf8))
        let h = Harness(store: store)
        let s = try PeriodicWakePlugin.make(["every": .string("1h"), "persistent": .boolean(true), "run": .array([.string("true")])])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        // The record is read and reported, then the first wake is asked for:
        // the scheduler's timer sleeps on the clock.
        try await h.clock.settle(until: "the bad record reported and the first wake scheduled") {
            h.logs.entries.contains { $0.contains("ignoring a malformed last-run record in the store") } && h.clock.sleeperCount >= 1
        }
        #expect(h.hooks.count == 0)
        try await h.advance(by: .seconds(3600 + 360))
        #expect(await h.hooks.waitForCount(atLeast: 1) == 1)
        // The run replaced the record with its wall-clock time.
        func lastRun() async -> Int64? { await store.get("last-run").flatMap { Int64(String(decoding: $0, as: UTF8.self)) } }
        try await h.clock.settle(until: "the run's record written") { await lastRun() != nil }
        let record = try #require(await lastRun())
        // Within the run's window: 1 h after the start, plus up to the 6 min tolerance.
        #expect(record <= h.clock.wallMicroseconds && record >= h.clock.wallMicroseconds - 360 * 1_000_000, "\(record)")
        await h.supervisor.stopAll()
    }

    /// The random delay of each run, as its wake event reports it, in seconds.
    private func delays(_ h: Harness) -> [Double] {
        h.events.all.compactMap { $0.fields["random_delay_ms"].flatMap(Double.init).map { $0 / 1000 } }
    }

    /// `randomized_delay`: each run comes a random time up to the delay
    /// after its nominal time, drawn anew each period, and the grid does not drift.
    @Test func randomizedDelayDelaysEachRunOnTheTestClock() async throws {
        let h = Harness()
        let s = try PeriodicWakePlugin.make([
            "every": .string("10m"), "tolerance": .string("0s"), "randomized_delay": .string("5m"), "run": .array([.string("true")]),
        ])
        await h.supervisor.start([SupervisedStrategy(name: "pw", kind: "periodic-wake", strategy: s)])
        // The first run: after 10 min, within the next 5 min.
        try await h.advance(by: .seconds(600 - 1))
        #expect(h.hooks.count == 0)
        var waited = 0
        while h.hooks.count == 0 && waited <= 310 {
            try await h.advance(by: .seconds(5))
            waited += 5
        }
        let first = try #require(delays(h).first)
        #expect(first >= 0 && first <= 300)
        #expect(abs(Double(waited) - 1 - first) <= 5, "ran \(waited - 1) s after the nominal time, delay \(first) s")
        try await h.advance(by: .seconds(2 * 3600))
        let all = delays(h)
        // 13 periods in 2 h 10 min; every run within [nominal, nominal + 5 min].
        #expect(all.count >= 12 && all.count <= 13, "\(all)")
        #expect(all.allSatisfy { $0 >= 0 && $0 <= 300 }, "\(all)")
        #expect(Set(all).count > all.count / 2, "delays are not drawn anew: \(all)")
        #expect(h.checker.violations.isEmpty, "\(h.checker.violations)")
        await h.supervisor.stopAll()
    }

    /// `fixed_random_delay = true`: the same delay every period and after a
    /// restart (it depends only on the machine id and the strategy's name);
    /// another name gets another delay.
    @Test func fixedRandomDelayIsStablePerHostAndName() async throws {
        func firstDelays(_ name: String) async throws -> [Double] {
            let h = Harness()
            let s = try PeriodicWakePlugin.make([
                "every": .string("10m"), "tolerance": .string("0s"), "randomized_delay": .string("5m"),
                "fixed_random_delay": .boolean(true), "run": .array([.string("true")]),
            ], name: name)
            await h.supervisor.start([SupervisedStrategy(name: name, kind: "periodic-wake", strategy: s)])
            try await h.advance(by: .seconds(3 * 600 + 300))
            await h.supervisor.stopAll()
            #expect(h.checker.violations.isEmpty, "\(h.checker.violations)")
            return delays(h)
        }
        let a = try await firstDelays("backup")
        #expect(a.count == 3 && Set(a).count == 1, "\(a)")
        #expect(try await firstDelays("backup") == a)
        let b = try await firstDelays("sync")
        #expect(b.count == 3 && Set(b).count == 1 && b != a, "\(a) \(b)")
    }

    @Test func rejectsBadDelayOptions() throws {
        let kind = try PeriodicWakePlugin.loader.loadKind("periodic-wake").get()
        let reader = ConfigReader(strategyName: "pw", keyPath: "strategy[0]", values: [
            "every": .string("10m"), "randomized_delay": .string("1h"), "run": .array([.string("true")]),
        ])
        _ = try kind.makeStrategy(reader)
        #expect(reader.problems.map(\.description) == ["strategy[0].randomized_delay: must not exceed `every` (10m), found 1h"])
        let fixed = ConfigReader(strategyName: "pw", keyPath: "strategy[0]", values: [
            "every": .string("10m"), "fixed_random_delay": .boolean(true), "run": .array([.string("true")]),
        ])
        _ = try kind.makeStrategy(fixed)
        #expect(fixed.problems.map(\.description) == ["strategy[0].fixed_random_delay: only applies with a randomized_delay above zero"])
    }

    @Test func runTimeoutKillsTheCommandWithRealProcesses() async throws {
        let clock = SystemClock()
        let scheduler = try WakeScheduler.system(clock: clock)
        let registry = LeaseRegistry(clock: clock)
        let events = RecordingEvents()
        let logs = WaitableLog<LogLine>()
        let supervisor = Supervisor(services: StrategyServices(
            registry: registry, scheduler: scheduler, clock: clock, logging: logs.logging,
            hooks: { name, log in HookRunner(strategy: name, log: log, killGrace: .milliseconds(200)) },
            events: { _ in events }
        ))
        let s = try PeriodicWakePlugin.make([
            "every": .string("100ms"), "tolerance": .string("0s"), "run_at_start": .boolean(true),
            "run": .array(["sleep", "30"].map(ConfigValue.string)), "run_timeout": .string("300ms"),
        ])
        await supervisor.start([SupervisedStrategy(name: "slow", kind: "periodic-wake", strategy: s)])
        await events.waitForFirst()
        await supervisor.stopAll()
        let first = try #require(events.all.first)
        #expect(first.fields["exit"] == "timed out")
        #expect(Double(first.fields["duration_ms"] ?? "") ?? 0 < 2_000)
        #expect(await registry.active.isEmpty)
    }
}
