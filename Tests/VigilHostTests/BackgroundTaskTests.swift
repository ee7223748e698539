import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

enum BackgroundTaskPlugin {
    static func kind() throws -> any StrategyKind {
        try PeriodicWakePlugin.loader.loadKind("background-task").get()
    }

    static func problems(_ values: [String: ConfigValue]) throws -> [String] {
        let reader = ConfigReader(strategyName: "bt", keyPath: "strategy[0]", values: values)
        _ = try kind().makeStrategy(reader)
        return reader.problems.map(\.description)
    }

    static func make(_ values: [String: ConfigValue]) throws -> any KeepAliveStrategy {
        let reader = ConfigReader(strategyName: "bt", keyPath: "strategy[0]", values: values)
        let s = try kind().makeStrategy(reader)
        guard reader.problems.isEmpty else { throw DescribedError("\(reader.problems)") }
        return s
    }
}

@Suite struct BackgroundTaskTests {
    /// The classic recipe: a 25-minute focus session, check every 25 s, renew
    /// when less than 60 s remain. The hold must never lapse, and the
    /// completion hook runs at the end.
    @Test func focusTimerHoldsWithoutAGapAndCompletes() async throws {
        let h = Harness()
        let strategy = try BackgroundTaskPlugin.make([
            "budget": .string("3m"), "check_every": .string("25s"), "renew_when": .string("60s"),
            "max_duration": .string("25m"), "reason": .string("focus"),
            "on_complete": .array([.string("notify-send"), .string("focus session over")]),
        ])
        let events = await h.registry.events()
        let log = EventLog()
        let collector = Task { for await e in events { await log.append(e) } }
        defer { collector.cancel() }
        let start = h.clock.now
        await h.supervisor.start([SupervisedStrategy(name: "focus", kind: "background-task", strategy: strategy)])
        // One check at a time: each renews (or not) and asks for the next
        // check before time moves on, as on a real clock.
        try await h.advance(by: .seconds(25 * 60 - 1))
        try await h.armed(1)
        await h.clock.advance(by: .seconds(1))  // the last check, at the session's end
        try await h.clock.settle(until: "the session completed and its lease was released") {
            let last = await log.events.last?.kind
            return last == .released && h.events.all.contains { $0.name == "on_complete" }
        }

        let all = await log.events
        #expect(all.first?.kind == .acquired)
        #expect(all.last?.kind == .released)
        #expect(!all.contains { $0.kind == .expiring || $0.kind == .expired }, "the hold lapsed: \(all.map(\.kind))")
        #expect(Set(all.map(\.lease.id)).count == 1, "one lease for the whole session")
        // Released at the end of the session (within the clock's 1 s step).
        let end = try #require(all.last.map { $0.at - start })
        #expect(end >= .seconds(25 * 60) && end <= .seconds(25 * 60 + 1), "released after \(end)")
        // Every renewal came when less than 60 s were left, and the deadline
        // always stayed ahead of the clock.
        var deadline = try #require(all.first?.lease.deadline)
        for e in all.dropFirst() where e.kind == .renewed {
            #expect(deadline - e.at < .seconds(60) && deadline > e.at)
            deadline = try #require(e.lease.deadline)
        }
        #expect(all.filter { $0.kind == .renewed }.count >= 10)
        #expect(h.hooks.runs.map(\.event) == ["complete"])
        #expect(h.events.all.contains { $0.name == "task-completed" })
        #expect(await h.registry.active.isEmpty)
        await h.supervisor.stopAll()
    }

    @Test func commandIsHeldUntilItExitsAndItsStatusRecorded() async throws {
        let clock = SystemClock()
        let registry = LeaseRegistry(clock: clock)
        let events = RecordingEvents()
        let supervisor = Supervisor(services: StrategyServices(
            registry: registry, scheduler: try WakeScheduler.system(clock: clock), clock: clock, logging: WaitableLog<LogLine>().logging,
            hooks: { name, log in HookRunner(strategy: name, log: log) }, events: { _ in events }))
        let strategy = try BackgroundTaskPlugin.make([
            "budget": .string("10s"), "command": .array(["sh", "-c", "sleep 0.3; exit 3"].map(ConfigValue.string)),
        ])
        let stream = await registry.events()
        await supervisor.start([SupervisedStrategy(name: "build", kind: "background-task", strategy: strategy)])
        var kinds: [LeaseEvent.Kind] = []
        for await e in stream {
            kinds.append(e.kind)
            if e.kind == .released { break }
        }
        #expect(kinds == [.acquired, .released])
        await supervisor.stopAll()
        #expect(events.all.contains { $0.name == "task-finished" && $0.fields["exit"] == "exited with status 3" })
    }

    /// A command that runs longer than the checks: its lease is renewed
    /// while it runs, and stopping the strategy ends the wait at once (the
    /// check once awaited the command's task, which ignores cancellation: no
    /// renewal until the command exited, and vigild hung at SIGTERM).
    @Test func aLongCommandIsRenewedWhileItRunsAndStopEndsIt() async throws {
        let clock = SystemClock()
        let registry = LeaseRegistry(clock: clock)
        let log = WaitableLog<LogLine>()
        let supervisor = Supervisor(services: StrategyServices(
            registry: registry, scheduler: try WakeScheduler.system(clock: clock), clock: clock, logging: log.logging,
            hooks: { name, log in HookRunner(strategy: name, log: log) }, events: { _ in RecordingEvents() }))
        // A renewal is due 0.5 s after each acquisition or renewal (every
        // 200 ms check); the budget leaves 5.5 s beyond that before the lease
        // expires, so a suite that starves the process for a second or two
        // on two cores cannot pass for a missed renewal (it did with a 2 s
        // budget and 1.5 s of slack: acquired, then expiring, in CI).
        let strategy = try BackgroundTaskPlugin.make([
            "budget": .string("6s"), "renew_when": .string("5500ms"), "check_every": .string("200ms"),
            "command": .array(["sleep", "100"].map(ConfigValue.string)),
        ])
        let stream = await registry.events()
        await supervisor.start([SupervisedStrategy(name: "long", kind: "background-task", strategy: strategy)])
        var kinds: [LeaseEvent.Kind] = []
        for await e in stream {
            kinds.append(e.kind)
            if kinds.filter({ $0 == .renewed }).count == 3 || e.kind == .expiring || e.kind == .released { break }
        }
        #expect(kinds == [.acquired, .renewed, .renewed, .renewed], "\(kinds)")
        await supervisor.stopAll()
        // The strategy itself returned: the supervisor gives up after 10 s
        // and says so (as it did when the wait ignored cancellation, and
        // when a cancelled wait went round without waiting).
        #expect(!log.all.contains { $0.message.contains("did not stop") })
        #expect(await registry.active.isEmpty)
    }

    @Test func badOptionsAreRefusedClearly() throws {
        let problems = try BackgroundTaskPlugin.problems([
            "what": .array([.string("sleeep")]), "budget": .string("0s"), "mode": .string("later"),
        ])
        let text = problems.joined(separator: "\n")
        #expect(text.contains("strategy[0].what: unknown inhibitor \"sleeep\" (did you mean \"sleep\"?)"), "\(text)")
        #expect(text.contains("strategy[0].budget: expected a duration greater than zero"))
        #expect(text.contains("strategy[0].mode: expected one of \"block\", \"delay\""))
        let more = try BackgroundTaskPlugin.problems(["budget": .string("2m"), "renew_when": .string("5m")])
        #expect(more.contains { $0.contains("renew_when: must be less than the budget (2m)") })
        let fraction = try BackgroundTaskPlugin.problems(["renew_when": .float(1.5)])
        #expect(fraction.contains { $0.contains("between 0 and 1") })
        let negative = try BackgroundTaskPlugin.problems(["budget": .string("-5m")])
        #expect(negative.contains { $0.contains("expected a non-negative duration, found \"-5m\"") })
    }
}
