import Foundation
import VigilKit
import VigilSurvival

/// `[host] return_to_sleep` and `return_to_sleep_grace`.
public struct ReturnToSleepSettings: Sendable, Equatable {
    /// Return the system to sleep after vigild's own alarm woke it.
    public var enabled = true
    /// How long after the work's end vigild waits before it asks logind to
    /// suspend: a run that starts right after another (catch-up runs) is
    /// still the same work.
    public var grace: Duration = .seconds(1)
    public init() {}
}

/// What the host asks of the system when it decides about a dark wake:
/// logind in vigild (``LogindSleepSystem``), a fake in tests.
public protocol SleepSystem: Sendable {
    /// Other programs' `sleep` inhibitors in block mode (not vigild's own),
    /// each described for people ("who: why").
    func sleepBlockers() async throws -> [String]
    /// Sessions a person is using since `resumeMonotonicMicros`: user
    /// sessions that are not idle, each described ("session 3 of alice").
    func busySessions(since resumeMonotonicMicros: Int64) async throws -> [String]
    /// Whether logind reports a sleep operation in progress.
    func sleepInProgress() async throws -> Bool
    /// logind's Suspend; throws ``SleepSystemBusy`` while logind is still
    /// finishing a sleep operation (right after a resume).
    func suspend() async throws
}

/// logind's `OperationInProgress`: its own sleep operation has not finished
/// yet (right after a resume); the same call succeeds a moment later.
public struct SleepSystemBusy: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Input from a person (keys, pointer, lid, power button) since a moment.
public protocol InputActivity: Sendable {
    /// Starts watching (at the start of a dark wake).
    func begin() async
    /// What was seen since ``begin()``, for people ("keys pressed"), or nil.
    func seen() async -> String?
    /// Stops watching.
    func end() async
}

/// No input devices to watch (tests, or none readable).
public struct NoInputActivity: InputActivity {
    public init() {}
    public func begin() async {}
    public func seen() async -> String? { nil }
    public func end() async {}
}

/// Wake, work, sleep again: after a resume that vigild's own alarm caused
/// (``SystemWake/Cause/vigilAlarm``), waits until the work that alarm was
/// for has ended (the leases its strategy holds or begins, the woken runs
/// hold one each, and any lease begun since the resume: a run's `vigilctl
/// hold`, a download it started) and then, a grace later, asks logind to
/// suspend, unless something needs the machine. Each refusal is logged once, at info, with its reason;
/// every dark wake ends in one ``DarkWake`` given to `outcome`.
///
/// The grace is waited on the host's clock, so tests drive it with a
/// ManualClock.
public actor ReturnToSleep {
    public nonisolated let settings: ReturnToSleepSettings
    private let registry: LeaseRegistry
    private let system: any SleepSystem
    private let input: any InputActivity
    private let clock: any VigilClock
    private let log: Logger
    private let outcome: @Sendable (_ dark: DarkWake, _ resume: ClockReadings, _ at: ClockReadings) async -> Void
    private let readings: @Sendable () -> ClockReadings
    private let nextAlarm: @Sendable () async -> SystemWakeAlarm?

    /// The dark wake being followed.
    private struct Episode {
        var number: UInt64
        var wake: SystemWake
        var resumedAt: VigilInstant
        var resume: ClockReadings
        /// The work's leases still active.
        var work: Set<LeaseID> = []
        /// The woken strategy's leases (its runs).
        var runs = 0
        var workEndedAt: VigilInstant
    }
    private var episode: Episode?
    private var nextEpisode: UInt64 = 0
    private var following: Task<Void, Never>?
    /// The pending decision: its task, and the instant it sleeps until.
    private var check: (task: Task<Void, Never>, due: VigilInstant)?
    /// When the pending decision is due, if one is. With
    /// ``leaseEventsSeen``, what a test on a manual clock waits for before
    /// it moves time on.
    public var pendingCheck: VigilInstant? { check?.due }
    /// Lease events handled so far.
    public private(set) var leaseEventsSeen = 0
    /// How long Suspend is retried while logind says its previous sleep
    /// operation is still in progress, and the pause between tries.
    static let busyRetryBound: Duration = .seconds(10)
    static let busyRetryPause: Duration = .milliseconds(100)
    /// The shortest sleep worth a suspend. When one of vigild's own
    /// system-waking alarms falls due sooner than this after the work's
    /// end, its work is this wake's work too: the kernel refuses to suspend
    /// with an alarm less than 2 s away (alarmtimer, -EBUSY), an alarm that
    /// falls due while the suspend is still on its way is lost until
    /// something else wakes the machine, and a suspend and resume take
    /// seconds of their own (1.4 to 8.5 s from logind's Suspend to the
    /// sleep in the qemu guest, docs/deployment.md).
    static let shortestSleep: Duration = .seconds(10)
    /// How long after the resume a wake by a strategy's alarm waits for that
    /// strategy's first lease (its woken run) before it decides without one.
    /// The run begins once the strategy's task has run after the timer fired,
    /// which took more than the 1 s grace in a slow guest: vigild suspended
    /// before the run it had woken the system for. A wake whose run never
    /// comes (a skipped catch-up) sleeps this long after the resume.
    static let wokenRunWait: Duration = .seconds(10)

    /// - Parameter nextAlarm: vigild's first pending system-waking alarm
    ///   (``WakeScheduler/nextSystemWakeAlarm()``), on `clock`'s timeline.
    public init(settings: ReturnToSleepSettings, registry: LeaseRegistry, system: any SleepSystem,
                input: any InputActivity = NoInputActivity(), clock: any VigilClock, logging: HostLogging,
                readings: @escaping @Sendable () -> ClockReadings = { ClockReadings.now() },
                nextAlarm: @escaping @Sendable () async -> SystemWakeAlarm? = { nil },
                outcome: @escaping @Sendable (_ dark: DarkWake, _ resume: ClockReadings, _ at: ClockReadings) async -> Void) {
        self.settings = settings
        self.registry = registry
        self.system = system
        self.input = input
        self.clock = clock
        self.log = logging.logger("sleep")
        self.readings = readings
        self.nextAlarm = nextAlarm
        self.outcome = outcome
    }

    /// Follows the registry's lease events. Call once, before the first resume.
    public func start() async {
        let events = await registry.events(LeaseEventFilter(kinds: LeaseEventFilter.endings.union([.acquired])))
        // Unstructured task: cancelled by stop().
        following = Task { [weak self] in
            for await event in events { await self?.leaseEvent(event) }
        }
    }

    public func stop() async {
        following?.cancel()
        cancelCheck()
        if episode != nil { await input.end() }
        episode = nil
    }

    /// A resume, as ``SystemWake/attribute`` explained it.
    public func resumed(_ wake: SystemWake, readings resume: ClockReadings) async {
        if let previous = episode {
            // Woken again before the last one was decided: that one is over.
            episode = nil
            cancelCheck()
            await input.end()
            log.debug("dark wake #\(previous.number) ended by another suspend")
        }
        guard wake.cause == .vigilAlarm else {
            log.info("staying awake: the wake was not vigild's (\(SurvivalReportFormat.wakeCause(wake)))")
            return
        }
        nextEpisode += 1
        let now = clock.now
        var fresh = Episode(number: nextEpisode, wake: wake, resumedAt: now, resume: resume, workEndedAt: now)
        guard settings.enabled else {
            log.info("staying awake after vigild's alarm woke the system: [host] return_to_sleep is off")
            await finish(fresh, outcome: .stayedAwake, reason: "return_to_sleep is off", refusal: .settingOff, workEnded: false)
            return
        }
        // The woken run may have begun its lease before the resume was seen.
        if let strategy = wake.alarmStrategy {
            for lease in await registry.active where lease.strategy == strategy {
                fresh.work.insert(lease.id)
                fresh.runs += 1
            }
        }
        episode = fresh
        await input.begin()
        log.debug("dark wake #\(fresh.number) for \(wake.alarm ?? "?"): waiting for \(fresh.work.count) lease(s) of its work")
        if fresh.work.isEmpty { scheduleCheck() }
    }

    /// Whether `lease` is part of the episode's work: its strategy's, or
    /// begun since the resume.
    private static func isWork(_ lease: LeaseSnapshot, of episode: Episode) -> Bool {
        lease.strategy == episode.wake.alarmStrategy || lease.acquiredAt >= episode.resumedAt
    }

    private func leaseEvent(_ event: LeaseEvent) {
        leaseEventsSeen += 1
        guard var current = episode else { return }
        switch event.kind {
        case .acquired:
            guard Self.isWork(event.lease, of: current), current.work.insert(event.lease.id).inserted else { return }
            if event.lease.strategy == current.wake.alarmStrategy { current.runs += 1 }
            cancelCheck()
        case .expired, .released, .failed:
            guard current.work.remove(event.lease.id) != nil else { return }
            current.workEndedAt = max(current.workEndedAt, event.at)
        default:
            return
        }
        episode = current
        if current.work.isEmpty { scheduleCheck() }
    }

    /// After the grace (from the work's end, or from `after`), if no work
    /// began meanwhile, decides.
    private func scheduleCheck(after: VigilInstant? = nil) {
        guard let current = episode else { return }
        cancelCheck()
        let deadline = (after ?? current.workEndedAt) + settings.grace
        let number = current.number
        let clock = self.clock
        // Unstructured task: cancelled when a newer check replaces it, when the episode ends, and
        // by stop().
        let task = Task { [weak self] in
            do { try await clock.sleep(until: deadline) } catch { return }
            await self?.decide(number)
        }
        check = (task, deadline)
    }

    private func cancelCheck() {
        check?.task.cancel()
        check = nil
    }

    private func decide(_ number: UInt64) async {
        guard var current = episode, current.number == number, current.work.isEmpty else { return }
        // Work whose lease is still being taken: the woken run's waits for
        // logind to finish its sleep operation, which took over a second in
        // a slow guest, so the grace ran out first and vigild suspended as
        // the run began. Decide again a grace later; its acquired event
        // makes it work. (Asked before `active`: a lease moves from one to
        // the other, never back.)
        let taking = await registry.beingTaken.filter { $0.strategy == current.wake.alarmStrategy || $0.since >= current.resumedAt }
        guard episode?.number == number else { return }
        if !taking.isEmpty {
            log.debug("dark wake #\(number): \(taking.count) lease(s) of its work still being taken; deciding again in \(settings.grace.vigilDescription)")
            scheduleCheck(after: clock.now)
            return
        }
        // Work whose event is still on its way: wait for its end.
        let late = await registry.active.filter { Self.isWork($0, of: current) }
        guard episode?.number == number else { return }
        if !late.isEmpty {
            for lease in late where current.work.insert(lease.id).inserted {
                if lease.strategy == current.wake.alarmStrategy { current.runs += 1 }
            }
            episode = current
            return
        }
        if let (refusal, reason) = await refusal(current) {
            guard episode?.number == number else { return }
            log.info("staying awake after vigild's alarm woke the system for \(current.wake.alarmStrategy ?? current.wake.alarm ?? "?"): \(reason)")
            await finish(current, outcome: .stayedAwake, reason: reason, refusal: refusal, workEnded: true)
            return
        }
        // The woken run has not begun its lease yet: wait for it, up to
        // wokenRunWait after the resume. Its acquired event makes it work
        // and cancels this check. (After the refusals: a reason to stay
        // awake is decided at once.)
        if current.runs == 0, let strategy = current.wake.alarmStrategy, clock.now < current.resumedAt + Self.wokenRunWait {
            guard episode?.number == number else { return }
            log.debug("dark wake #\(number): the woken run of \(ClientText.excerpt(strategy)) has not begun; waiting for it until \(Self.wokenRunWait.vigilDescription) after the resume")
            scheduleCheck(after: current.resumedAt + Self.wokenRunWait - settings.grace)
            return
        }
        if let alarm = await nextAlarm(), alarm.deadline - clock.now < Self.shortestSleep {
            guard episode?.number == number else { return }
            // Not a refusal (those come first): the alarm's run begins a lease
            // after the resume, which is work, and the decision comes again after it.
            log.debug("dark wake #\(number): vigild's next alarm (\(ClientText.excerpt(alarm.label))) is due in \((alarm.deadline - clock.now).vigilDescription), sooner than \(Self.shortestSleep.vigilDescription): its work is this wake's work too")
            scheduleCheck(after: alarm.deadline)
            return
        }
        guard episode?.number == number else { return }
        let giveUp = clock.now + Self.busyRetryBound
        do {
            var at = readings()
            while true {
                do {
                    try await system.suspend()
                    break
                } catch let busy as SleepSystemBusy where clock.now + Self.busyRetryPause <= giveUp {
                    // logind's own sleep operation (the one that just ended)
                    // is still finishing: try again shortly, unless a new
                    // sleep began meanwhile or the episode ended.
                    log.debug("logind is busy (\(busy)); asking again in \(Self.busyRetryPause.vigilDescription)")
                    try await clock.sleep(for: Self.busyRetryPause)
                    guard episode?.number == number else { return }
                    if (try? await system.sleepInProgress()) == true {
                        let reason = "logind already has a sleep operation in progress"
                        log.info("staying awake after vigild's alarm woke the system for \(current.wake.alarmStrategy ?? current.wake.alarm ?? "?"): \(reason)")
                        await finish(current, outcome: .stayedAwake, reason: reason, refusal: .sleepInProgress, workEnded: true)
                        return
                    }
                    at = readings()
                }
            }
            let awake = (clock.now - current.resumedAt).vigilDescription
            await finish(current, outcome: .asleepAgain, reason: nil, refusal: nil, workEnded: true, at: at)
            log.info("returned the system to sleep: the work of \(current.wake.alarm ?? "?") is done (\(current.runs) lease\(current.runs == 1 ? "" : "s"), awake \(awake))")
        } catch is CancellationError {
            return
        } catch {
            let reason = "logind refused Suspend: \(ClientText.excerpt("\(error)"))"
            log.info("staying awake after vigild's alarm woke the system: \(reason)")
            await finish(current, outcome: .stayedAwake, reason: reason, refusal: .suspendFailed, workEnded: true)
        }
    }

    /// The first reason to stay awake, in the order the docs list them.
    private func refusal(_ current: Episode) async -> (DarkWake.Refusal, String)? {
        let holding = await registry.active.filter { lease in
            guard let hold = lease.hold else { return false }
            return hold.mode == "block" && hold.what.contains("sleep")
        }
        if let lease = holding.first {
            let holder = lease.client?.name ?? lease.strategy
            return (.vigilLease, "lease \(lease.id) of \(ClientText.excerpt(holder)) holds sleep (\(ClientText.excerpt(lease.reason)))")
        }
        do {
            if let blocker = try await system.sleepBlockers().first {
                return (.inhibitor, "another program holds a sleep inhibitor: \(ClientText.excerpt(blocker))")
            }
        } catch {
            log.debug("cannot list logind's inhibitors: \(error)")
        }
        if let input = await input.seen() {
            return (.person, input)
        }
        do {
            if let session = try await system.busySessions(since: current.resume.monotonicMicros).first {
                return (.person, "\(ClientText.excerpt(session)) is not idle")
            }
        } catch {
            log.debug("cannot read logind's sessions: \(error)")
        }
        do {
            if try await system.sleepInProgress() {
                return (.sleepInProgress, "logind already has a sleep operation in progress")
            }
        } catch {
            log.debug("cannot read logind's PreparingForSleep: \(error)")
        }
        return nil
    }

    private func finish(_ ended: Episode, outcome kind: DarkWake.Outcome, reason: String?, refusal: DarkWake.Refusal?,
                        workEnded: Bool, at given: ClockReadings? = nil) async {
        if episode?.number == ended.number {
            episode = nil
            cancelCheck()
            await input.end()
        }
        let now = given ?? readings()
        let dark = DarkWake(
            wall: ended.resume.wallMicros, startOffsetMicros: 0, alarm: ended.wake.alarm, alarmStrategy: ended.wake.alarmStrategy,
            alarmKind: ended.wake.alarmKind, runs: ended.runs,
            workEndedAfterMicros: workEnded ? max(0, (ended.workEndedAt - ended.resumedAt).microseconds) : nil,
            awakeMicros: max(0, (clock.now - ended.resumedAt).microseconds), outcome: kind, reason: reason, refusal: refusal?.rawValue)
        await outcome(dark, ended.resume, now)
    }
}
