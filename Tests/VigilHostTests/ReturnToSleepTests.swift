import Foundation
import Testing
import VigilKit
@testable import VigilHost
import VigilKitTesting

/// Wake, work, sleep again (``ReturnToSleep``) on the test clock: which
/// wake, which work, which refusal, and when Suspend is called.
@Suite("Return to sleep")
struct ReturnToSleepTests {
    /// A logind that answers as told and records each Suspend with the
    /// test clock's time.
    final class FakeSleepSystem: SleepSystem, @unchecked Sendable {
        // Invariant: every field is read and written under `state`'s lock.
        struct State {
            var blockers: [String] = []
            var sessions: [String] = []
            var inProgress = false
            var refuseSuspend = false
            /// Suspend calls answered "busy" before one succeeds.
            var busy = 0
            var suspends: [VigilInstant] = []
        }
        let state = Lock(State())
        let clock: ManualClock
        init(clock: ManualClock) { self.clock = clock }

        func sleepBlockers() async throws -> [String] { state.withLock { $0.blockers } }
        func busySessions(since resumeMonotonicMicros: Int64) async throws -> [String] { state.withLock { $0.sessions } }
        func sleepInProgress() async throws -> Bool { state.withLock { $0.inProgress } }
        func suspend() async throws {
            let now = clock.now
            let (refused, busy) = state.withLock { s in
                if s.busy > 0 {
                    s.busy -= 1
                    return (false, true)
                }
                if !s.refuseSuspend { s.suspends.append(now) }
                return (s.refuseSuspend, false)
            }
            if busy { throw SleepSystemBusy("operation in progress") }
            if refused { throw PowerBackendError("org.freedesktop.DBus.Error.AccessDenied") }
        }
        var suspends: [VigilInstant] { state.withLock { $0.suspends } }
    }

    final class FakeInput: InputActivity, @unchecked Sendable {
        // Invariant: guarded by its lock.
        let seenText = Lock<String?>(nil)
        func begin() async {}
        func seen() async -> String? { seenText.withLock { $0 } }
        func end() async {}
    }

    /// vigild's next system-waking alarm, as the wake scheduler would say.
    final class NextAlarm: @unchecked Sendable {
        // Invariant: guarded by its lock.
        let alarm = Lock<SystemWakeAlarm?>(nil)
        func set(_ label: String, at deadline: VigilInstant) {
            alarm.withLock { $0 = SystemWakeAlarm(label: label, deadline: deadline, firedAt: nil) }
        }
        var value: SystemWakeAlarm? { alarm.withLock { $0 } }
    }

    struct Rig {
        let clock = ManualClock()
        let registry: LeaseRegistry
        let system: FakeSleepSystem
        let input = FakeInput()
        let logs = WaitableLog<LogLine>()
        let outcomes = WaitableLog<DarkWake>()
        let alarm = NextAlarm()
        let cycle: ReturnToSleep
        /// Lease events this rig caused (the cycle follows acquired and endings).
        private let caused = Counter()

        init(settings: ReturnToSleepSettings = ReturnToSleepSettings(), backend: any PowerBackend = NoPowerBackend()) async {
            registry = LeaseRegistry(clock: clock, backend: backend)
            system = FakeSleepSystem(clock: clock)
            let outcomes = self.outcomes
            let alarm = self.alarm
            cycle = ReturnToSleep(
                settings: settings, registry: registry, system: system, input: input, clock: clock, logging: logs.logging,
                readings: { ClockReadings(wallMicros: 1, monotonicMicros: 2, boottimeMicros: 3) },
                nextAlarm: { alarm.value },
                outcome: { dark, _, _ in outcomes.append(dark) })
            await cycle.start()
        }

        func wake(_ cause: SystemWake.Cause = .vigilAlarm, strategy: String = "tick") async {
            let wake = SystemWake(wall: 1_750_000_000_000_000, startOffsetMicros: 0, suspendedMicros: 60_000_000, cause: cause,
                                  alarm: cause == .vigilAlarm ? "\(strategy) periodic-wake" : nil,
                                  alarmStrategy: cause == .vigilAlarm ? strategy : nil, alarmKind: cause == .vigilAlarm ? "periodic-wake" : nil)
            await cycle.resumed(wake, readings: ClockReadings(wallMicros: 1, monotonicMicros: 2, boottimeMicros: 3))
            await settled()
        }

        func run(_ strategy: String = "tick", holds: String = "command", reason: String = "periodic-wake run") async throws -> LeaseID {
            let id = try await registry.acquire(strategy: strategy, LeaseRequest(
                holds: holds, reason: reason, power: PowerHold(what: ["sleep"], mode: "block")))
            await caused.increment()
            await settled()
            return id
        }

        func release(_ lease: LeaseID) async {
            await registry.release(lease)
            await caused.increment()
            await settled()
        }

        /// Waits until the cycle has handled every lease event this rig
        /// caused and its pending decision sleeps on the clock: moving time
        /// before that would decide at the wrong instant (a loaded machine
        /// can outlast `settle()`'s yields).
        func settled(sourceLocation: SourceLocation = #_sourceLocation) async {
            do {
                try await cycle.settled(seen: await caused.value, on: clock)
            } catch {
                Issue.record(error, sourceLocation: sourceLocation)
            }
        }

        func outcome() async -> DarkWake? {
            _ = await outcomes.wait(forCount: 1)
            return outcomes.all.first
        }

        /// Ends the work by releasing `lease`, lets `grace` pass, and expects
        /// the system asleep again after `runs` runs, Suspend exactly a grace
        /// after the release.
        func expectAsleepAgain(releasing lease: LeaseID, grace: Duration = .seconds(1), runs: Int, _ comment: Comment? = nil,
                               sourceLocation: SourceLocation = #_sourceLocation) async throws {
            let ended = clock.now
            await release(lease)
            await clock.advance(by: grace)
            let dark = try #require(await outcome(), sourceLocation: sourceLocation)
            #expect(dark.outcome == .asleepAgain && dark.runs == runs, sourceLocation: sourceLocation)
            #expect(system.suspends == [ended + grace], comment, sourceLocation: sourceLocation)
        }

        /// The info lines saying why it stayed awake.
        var refusalLines: [LogLine] { logs.all.filter { $0.level == .info && $0.message.contains("staying awake") } }
    }

    @Test func suspendsAGraceAfterTheWokenRunEnds() async throws {
        let rig = await Rig()
        await rig.wake()
        let run = try await rig.run()
        await rig.clock.advance(by: .seconds(9))
        let ended = rig.clock.now
        await rig.release(run)
        await rig.clock.advance(by: .seconds(1) - .milliseconds(1))
        #expect(rig.system.suspends.isEmpty, "not before the grace has passed")
        await rig.clock.advance(by: .milliseconds(1))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .asleepAgain)
        #expect(rig.system.suspends == [ended + .seconds(1)], "Suspend exactly a grace after the work's end")
        #expect(dark.runs == 1)
        #expect(dark.workEndedAfterMicros == 9_000_000)
        #expect(dark.awakeMicros == 10_000_000)
        #expect(dark.alarmStrategy == "tick")
        #expect(rig.refusalLines.isEmpty)
    }

    @Test func aRunThatStartsDuringTheGraceIsTheSameWork() async throws {
        var settings = ReturnToSleepSettings()
        settings.grace = .seconds(2)
        let rig = await Rig(settings: settings)
        await rig.wake()
        let first = try await rig.run()
        await rig.clock.advance(by: .seconds(3))
        await rig.release(first)
        await rig.clock.advance(by: .seconds(1))
        let second = try await rig.run()  // a catch-up run
        await rig.clock.advance(by: .seconds(5))
        #expect(rig.system.suspends.isEmpty, "the second run is still going")
        try await rig.expectAsleepAgain(releasing: second, grace: .seconds(2), runs: 2)
    }

    /// A power backend whose holds wait for the test, as logind's Inhibit
    /// waits right after a resume until its sleep operation has finished.
    final class GatedHoldBackend: PowerBackend, Sendable {
        let name = "gated"
        let reason = "test"
        let started = AsyncGate()
        private let waiting = Lock<CheckedContinuation<Void, Never>?>(nil)

        func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken {
            await withCheckedContinuation { continuation in
                waiting.withLock { $0 = continuation }
                started.open()
            }
            return Token()
        }

        func answer() {
            let continuation = waiting.withLock { waiting in
                defer { waiting = nil }
                return waiting
            }
            continuation?.resume()
        }

        struct Token: PowerToken {
            var description: String { "gated token" }
            func renew(budget: Duration?) async throws {}
            func release() async {}
        }
    }

    /// The woken run's lease still being taken when the grace ends (its
    /// inhibitor waits for logind): no suspend; the run is the work, and the
    /// system sleeps a grace after it ends.
    @Test func aRunWhoseLeaseIsStillBeingTakenIsTheWork() async throws {
        let backend = GatedHoldBackend()
        let rig = await Rig(backend: backend)
        await rig.wake()
        async let taken = rig.run()
        await backend.started.wait()
        await rig.clock.advance(by: .seconds(1))
        #expect(await rig.logs.wait { $0.contains { $0.level == .debug && $0.message.contains("1 lease(s) of its work still being taken") } })
        #expect(rig.system.suspends.isEmpty, "not while the run's lease is being taken")
        backend.answer()
        let run = try await taken
        await rig.clock.advance(by: .seconds(5))
        #expect(rig.system.suspends.isEmpty, "its run is going")
        try await rig.expectAsleepAgain(releasing: run, runs: 1)
    }

    /// An alarm of vigild's due within ``ReturnToSleep/shortestSleep`` of
    /// the work's end: no suspend before it (the kernel would refuse one, or
    /// lose the alarm); its run is the same work, and the system sleeps a
    /// grace after that run.
    @Test func anAlarmDueSoonAfterTheWorkIsTheSameWork() async throws {
        let rig = await Rig()
        await rig.wake()
        let first = try await rig.run()
        await rig.clock.advance(by: .seconds(4))
        let firstEnded = rig.clock.now
        rig.alarm.set("tick periodic-wake", at: firstEnded + .seconds(6))
        await rig.release(first)
        await rig.clock.advance(by: .seconds(6) - .milliseconds(1))
        #expect(rig.system.suspends.isEmpty, "the next alarm is 5 s after the grace")
        #expect(rig.outcomes.all.isEmpty)
        await rig.clock.advance(by: .milliseconds(1))
        // The alarm fires; its run begins.
        rig.alarm.set("tick periodic-wake", at: firstEnded + .seconds(26))
        let second = try await rig.run()
        await rig.clock.advance(by: .seconds(3))
        #expect(rig.system.suspends.isEmpty, "its run is going")
        try await rig.expectAsleepAgain(releasing: second, runs: 2, "a grace after the second run's end, 16 s before the alarm after it")
        #expect(rig.refusalLines.isEmpty, "not a refusal")
        #expect(rig.logs.all.contains { $0.level == .debug && $0.message.contains("next alarm (tick periodic-wake) is due in 5s") },
                "\(rig.logs.all.map(\.message))")
    }

    /// An alarm that fires with no run: the decision comes again a grace
    /// after it. An alarm exactly ``ReturnToSleep/shortestSleep`` away does
    /// not keep the system awake.
    @Test func anAlarmIsWaitedForOnlyWhenItIsSooner() async throws {
        let rig = await Rig()
        await rig.wake()
        let run = try await rig.run()
        await rig.clock.advance(by: .seconds(4))
        let ended = rig.clock.now
        rig.alarm.set("fetch", at: ended + .seconds(3))
        await rig.release(run)
        await rig.clock.advance(by: .seconds(3))
        #expect(rig.system.suspends.isEmpty)
        let next = rig.clock.now + ReturnToSleep.shortestSleep + .seconds(1)
        rig.alarm.set("fetch", at: next)
        await rig.clock.advance(by: .seconds(1))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .asleepAgain && dark.runs == 1)
        #expect(rig.system.suspends == [ended + .seconds(4)], "a grace after the alarm, whose successor is 10 s away")
    }

    /// The woken run's lease can come after the grace (a slow machine): it
    /// is waited for, and the system sleeps a grace after its end.
    @Test func aWokenRunThatBeginsAfterTheGraceIsWaitedFor() async throws {
        let rig = await Rig()
        await rig.wake()
        await rig.clock.advance(by: .seconds(4))
        #expect(rig.system.suspends.isEmpty, "no Suspend before the woken run began")
        #expect(rig.outcomes.all.isEmpty)
        let run = try await rig.run()
        await rig.clock.advance(by: .seconds(2))
        try await rig.expectAsleepAgain(releasing: run, runs: 1)
    }

    /// A wake whose run never comes (its strategy skipped it) sleeps when
    /// the wait for the run ends, 10 s after the resume.
    @Test func aWakeWhoseRunNeverComesSleepsWhenTheWaitEnds() async throws {
        let rig = await Rig()
        let woke = rig.clock.now
        await rig.wake()
        await rig.clock.advance(by: .seconds(10) - .milliseconds(1))
        #expect(rig.system.suspends.isEmpty)
        await rig.clock.advance(by: .milliseconds(1))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .asleepAgain && dark.runs == 0)
        #expect(rig.system.suspends == [woke + .seconds(10)])
    }

    /// The wait is for the woken strategy's run: another strategy's lease
    /// begun since the resume is work, but not that run.
    @Test func anotherStrategysLeaseIsNotTheWokenRun() async throws {
        let rig = await Rig()
        let woke = rig.clock.now
        await rig.wake()
        let other = try await rig.run("download")
        await rig.release(other)
        await rig.clock.advance(by: .seconds(10))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .asleepAgain && dark.runs == 0)
        #expect(rig.system.suspends == [woke + .seconds(10)])
    }

    /// One refusal: the outcome, its reason, one info line, and no Suspend.
    func expectStaysAwake(_ rig: Rig, refusal: DarkWake.Refusal, reason: String) async throws {
        await rig.wake()
        let run = try await rig.run()
        await rig.clock.advance(by: .seconds(4))
        await rig.release(run)
        await rig.clock.advance(by: .seconds(1))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .stayedAwake)
        #expect(dark.refusal == refusal.rawValue)
        #expect(dark.reason?.contains(reason) == true, "\(dark.reason ?? "")")
        await rig.clock.advance(by: .seconds(60))
        #expect(rig.system.suspends.isEmpty)
        #expect(rig.refusalLines.count == 1, "\(rig.logs.all.map(\.message))")
        #expect(rig.refusalLines.first?.message.contains(reason) == true)
    }

    @Test func anotherVigilLeaseHoldingSleepKeepsItAwake() async throws {
        let rig = await Rig()
        _ = try await rig.run("download", holds: "download", reason: "big file")
        await rig.clock.advance(by: .seconds(1))  // held since before the suspend
        try await expectStaysAwake(rig, refusal: .vigilLease, reason: "holds sleep (big file)")
    }

    @Test func anotherProgramsBlockInhibitorKeepsItAwake() async throws {
        let rig = await Rig()
        rig.system.state.withLock { $0.blockers = ["backup (pid 42): copying"] }
        try await expectStaysAwake(rig, refusal: .inhibitor, reason: "backup (pid 42): copying")
    }

    /// A reason to stay awake is decided at once, whatever the next alarm:
    /// waiting for that alarm's work is for a wake that would sleep.
    @Test func aRefusalComesBeforeAnAlarmDueSoon() async throws {
        let rig = await Rig()
        rig.system.state.withLock { $0.blockers = ["backup (pid 42): copying"] }
        rig.alarm.set("tick periodic-wake", at: rig.clock.now + .seconds(8))
        try await expectStaysAwake(rig, refusal: .inhibitor, reason: "backup (pid 42): copying")
    }

    @Test func inputSinceTheResumeKeepsItAwake() async throws {
        let rig = await Rig()
        rig.input.seenText.withLock { $0 = "keys pressed" }
        try await expectStaysAwake(rig, refusal: .person, reason: "keys pressed")
    }

    @Test func aSessionThatIsNotIdleKeepsItAwake() async throws {
        let rig = await Rig()
        rig.system.state.withLock { $0.sessions = ["session 3 of alice"] }
        try await expectStaysAwake(rig, refusal: .person, reason: "session 3 of alice is not idle")
    }

    @Test func neverSuspendsWhileLogindHasASleepInProgress() async throws {
        let rig = await Rig()
        rig.system.state.withLock { $0.inProgress = true }
        try await expectStaysAwake(rig, refusal: .sleepInProgress, reason: "sleep operation in progress")
    }

    @Test func aRefusedSuspendIsRecorded() async throws {
        let rig = await Rig()
        rig.system.state.withLock { $0.refuseSuspend = true }
        await rig.wake()
        await rig.release(try await rig.run())
        await rig.clock.advance(by: .seconds(1))
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .stayedAwake && dark.refusal == DarkWake.Refusal.suspendFailed.rawValue)
        #expect(rig.refusalLines.count == 1)
    }

    @Test func aWakeThatWasNotVigildsIsLeftAlone() async throws {
        let rig = await Rig()
        await rig.wake(.other)
        await rig.clock.advance(by: .seconds(60))
        #expect(rig.system.suspends.isEmpty)
        #expect(rig.outcomes.all.isEmpty)
        #expect(rig.refusalLines.count == 1)
        #expect(rig.refusalLines.first?.message.contains("the wake was not vigild's") == true)
    }

    @Test func theSettingOffKeepsItAwake() async throws {
        var settings = ReturnToSleepSettings()
        settings.enabled = false
        let rig = await Rig(settings: settings)
        await rig.wake()
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .stayedAwake && dark.refusal == DarkWake.Refusal.settingOff.rawValue)
        await rig.clock.advance(by: .seconds(60))
        #expect(rig.system.suspends.isEmpty)
        #expect(rig.refusalLines.count == 1 && rig.refusalLines[0].message.contains("return_to_sleep is off"))
    }

    @Test func theOtherLeasesOfTheWokenStrategyAreItsWork() async throws {
        // A lease of the woken strategy begun before the resume was seen
        // (the run started the moment the alarm fired) is its work too.
        let rig = await Rig()
        let early = try await rig.run()
        await rig.wake()
        await rig.clock.advance(by: .seconds(3))
        #expect(rig.system.suspends.isEmpty)
        try await rig.expectAsleepAgain(releasing: early, runs: 1)
    }

    @Test func aLeaseBegunDuringTheDarkWakeIsPartOfTheWork() async throws {
        // The run's command takes a client lease (`vigilctl hold`) that
        // outlives the run: the return to sleep waits for it too.
        let rig = await Rig()
        await rig.wake()
        let run = try await rig.run()
        let hold = try await rig.run("client")
        await rig.clock.advance(by: .seconds(2))
        await rig.release(run)
        await rig.clock.advance(by: .seconds(5))
        #expect(rig.system.suspends.isEmpty, "the client lease is still held")
        try await rig.expectAsleepAgain(releasing: hold, runs: 1)
        #expect(rig.refusalLines.isEmpty)
    }

    @Test func logindStillFinishingItsLastSleepIsWaitedFor() async throws {
        // Right after a resume logind answers Suspend with
        // OperationInProgress until its sleep operation has finished.
        let rig = await Rig()
        rig.system.state.withLock { $0.busy = 3 }
        let woke = rig.clock.now
        await rig.wake()
        await rig.release(try await rig.run())
        await rig.clock.advance(by: .seconds(1))
        #expect(rig.system.suspends.isEmpty)
        // Each retry waits 100 ms on the clock: move time once it does.
        for attempt in 1...3 {
            try await rig.clock.settle(until: "retry \(attempt) waits") { rig.clock.sleeperCount(dueBy: rig.clock.now + .milliseconds(100)) > 0 }
            await rig.clock.advance(by: .milliseconds(100))
        }
        let dark = try #require(await rig.outcome())
        #expect(dark.outcome == .asleepAgain)
        #expect(rig.system.suspends == [woke + .seconds(1) + .milliseconds(300)])
    }
}

extension ReturnToSleep {
    /// Waits until the cycle has handled `expected` lease events and its
    /// pending decision sleeps on `clock`: moving a test clock before that
    /// would decide at the wrong instant (a loaded machine can outlast
    /// `settle()`'s yields).
    nonisolated func settled(seen expected: Int, on clock: ManualClock) async throws {
        try await clock.settle(until: "the cycle handled \(expected) lease event(s) and its decision sleeps on the clock") {
            let (seen, due) = (await leaseEventsSeen, await pendingCheck)
            guard seen >= expected else { return false }
            guard let due, due > clock.now else { return true }
            return clock.sleeperCount(dueBy: due) > 0
        }
    }
}
