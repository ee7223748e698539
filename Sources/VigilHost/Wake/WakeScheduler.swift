import CTimer
import Foundation
import VigilKit

/// Counters of a ``WakeScheduler`` since it started.
public struct WakeStatistics: Sendable, Hashable {
    /// Times a timer woke the scheduler (each is one wakeup of the process).
    public var timerExpirations = 0
    /// Batches fired by timer expirations (several requests fire per batch).
    public var batchesFired = 0
    /// Requests answered with a firing (past-due ones included).
    public var requestsFired = 0
    /// Requests that fired in a batch together with at least one other.
    public var coalescedRequests = 0
    /// Requests whose `latest` had already passed when they arrived; they fire
    /// at once, without a timer, and do not count towards lateness.
    public var pastDueRequests = 0
    /// Requests withdrawn because their waiting task was cancelled.
    public var withdrawnRequests = 0
    /// Batches fired by the system-waking alarm timer.
    public var alarmBatches = 0
    /// Largest lateness of a batch (fired minus planned).
    public var maxLateness: Duration = .zero
    /// Sum of batch lateness, for the mean.
    public var totalLateness: Duration = .zero

    public init() {}

    /// Mean lateness per batch.
    public var meanLateness: Duration {
        batchesFired == 0 ? .zero : totalLateness / batchesFired
    }

    /// Wakeups saved by coalescing: requests fired by timers minus batches.
    public var wakeupsSaved: Int { requestsFired - pastDueRequests - batchesFired }
}

/// The host's single wake scheduler: every timer of the host goes through it.
///
/// A request carries a window `[earliest, latest]`. Each pending request has a
/// *preferred time*: `latest`, or with `align` the last slot boundary (a
/// multiple of `align` since the Unix epoch) inside
/// `[max(earliest, now), latest]` if there is one. The next batch fires at
/// `T` = the smallest preferred time; at `T` every pending request with
/// `earliest <= T` fires. Since `T <= preferred <= latest` for every pending
/// request, nothing fires before its `earliest` or (timer latency apart) after
/// its `latest`; requests whose windows overlap the first-ending one fire with
/// it. See docs/wake-scheduler.md.
///
/// Ordinary requests run on a `CLOCK_BOOTTIME` timer, which does not wake a
/// suspended machine (a heartbeat that woke a laptop every minute would defeat
/// suspend). Only while a `wakeSystem` request is pending, and only where the
/// alarm clock can be used, the `CLOCK_BOOTTIME_ALARM` timer is armed for it.
public actor WakeScheduler: WakeScheduling {
    /// Which clock is used and why.
    public nonisolated let clockInfo: WakeClockInfo

    private let clock: any VigilClock
    private let timer: any WakeTimer
    private let alarmTimer: (any WakeTimer)?

    private struct Pending {
        var request: WakeRequest
        var owner: WakeOwner?
        var preferred: VigilInstant
        var continuation: CheckedContinuation<WakeFiring, any Error>
    }

    private var pending: [UInt64: Pending] = [:]
    /// Requests waiting to fire. Tests wait for the count they expect
    /// before they move a test clock on.
    public var pendingRequests: Int { pending.count }
    /// Pending ids by preferred time, by earliest time, and the wakeSystem
    /// ones by preferred time: each step is O(log n), so thousands of
    /// requests (one per keep-alive socket) stay cheap. Lazily cleaned.
    private var byPreferred = InstantHeap()
    private var byEarliest = InstantHeap()
    private var wakingByPreferred = InstantHeap()
    private var lastID: UInt64 = 0
    private var armedOrdinary: VigilInstant?
    private var armedAlarm: VigilInstant?

    /// Counters since start.
    public private(set) var statistics = WakeStatistics()
    /// The latest system-waking requests that fired, newest last (at most
    /// `firedAlarmMemory`), for the wake attribution after a resume.
    private var firedAlarms: [SystemWakeAlarm] = []
    private static let firedAlarmMemory = 32
    /// Sees each batch's lateness as it fires (the metrics histogram).
    private var latenessObserver: (@Sendable (Duration) -> Void)?

    /// Calls `body` with the lateness of every batch fired from now on, on
    /// the scheduler; it must be quick and must not call back.
    public func observeLateness(_ body: @escaping @Sendable (Duration) -> Void) {
        latenessObserver = body
    }

    /// Sees, at each timer expiration, the strategies whose requests it
    /// fired (the cost counters).
    private var expirationObserver: (@Sendable (Set<String>) -> Void)?

    /// Calls `body` at every timer expiration from now on with the
    /// strategies (``WakeOwner``) whose requests it fired, each once however
    /// many of its requests fired; on the scheduler, quick, no call back.
    public func observeExpirations(_ body: @escaping @Sendable (Set<String>) -> Void) {
        expirationObserver = body
    }

    /// - Parameters:
    ///   - clock: the host clock; its `now` is the timeline timers are armed on,
    ///     its `wallMicroseconds` places alignment slots.
    ///   - timer: the ordinary timer (does not wake a suspended system).
    ///   - alarmTimer: the system-waking timer, if usable here; armed only
    ///     while a `wakeSystem` request is pending.
    ///   - clockInfo: what to report; by default derived from the timers.
    public init(clock: any VigilClock, timer: any WakeTimer, alarmTimer: (any WakeTimer)? = nil, clockInfo: WakeClockInfo? = nil) {
        self.clock = clock
        self.timer = timer
        self.alarmTimer = alarmTimer
        self.clockInfo = clockInfo ?? WakeClockInfo(
            clock: alarmTimer?.clockName ?? timer.clockName,
            canWakeSystem: false,
            reason: "timers driven by the injected clock (\(timer.clockName)); nothing here can wake a suspended system"
        )
        // Weak: the timers are owned by the scheduler; a strong capture would
        // keep both alive forever.
        timer.setExpiryHandler { [weak self] in await self?.timerExpired(onAlarm: false) }
        alarmTimer?.setExpiryHandler { [weak self] in await self?.timerExpired(onAlarm: true) }
    }

    deinit {
        timer.invalidate()
        alarmTimer?.invalidate()
    }

    /// The scheduler on real timerfds: `CLOCK_BOOTTIME` for ordinary
    /// requests, plus `CLOCK_BOOTTIME_ALARM` for `wakeSystem` requests where
    /// it can be created; ``clockInfo`` says which and why.
    public static func system(clock: any VigilClock = SystemClock(), rtcDirectory: String = "/sys/class/rtc") throws(WakeTimerError) -> WakeScheduler {
        let (probe, alarmTimer) = WakeClockProbe.run(rtcDirectory: rtcDirectory)
        let timer = try TimerFDWakeTimer()
        return WakeScheduler(clock: clock, timer: timer, alarmTimer: alarmTimer, clockInfo: probe.clockInfo)
    }

    /// The system-waking alarms armed or fired since `since` (boottime): the
    /// pending `wakeSystem` requests and those that fired after `since`, each
    /// at the time the alarm clock was armed for. Empty when no alarm clock
    /// can wake the system here (no alarm timer, or no RTC: nothing of
    /// Vigil's could have woken it).
    public func systemWakeAlarms(since: VigilInstant) -> [SystemWakeAlarm] {
        guard alarmTimer != nil, clockInfo.canWakeSystem else { return [] }
        let waiting = pending.values.filter(\.request.wakeSystem).map {
            SystemWakeAlarm(label: $0.request.label, owner: $0.owner, deadline: $0.preferred, firedAt: nil)
        }
        return firedAlarms.filter { ($0.firedAt ?? $0.deadline) >= since } + waiting
    }

    /// The first pending system-waking request, as an alarm: what the alarm
    /// clock is armed for next. Nil when none is pending or nothing here
    /// can wake the system.
    public func nextSystemWakeAlarm() -> SystemWakeAlarm? {
        guard alarmTimer != nil, clockInfo.canWakeSystem,
              let first = wakingByPreferred.cleanTop({ pending[$0] == nil }), let entry = pending[first.id] else { return nil }
        return SystemWakeAlarm(label: entry.request.label, owner: entry.owner, deadline: entry.preferred, firedAt: nil)
    }

    /// Number of requests waiting.
    public var pendingCount: Int { pending.count }

    /// When the next batch is planned (nil when nothing is pending).
    public var nextTarget: VigilInstant? { pending.values.map(\.preferred).min() }

    /// What the timers are armed for: (ordinary, alarm).
    public var armedDeadlines: (ordinary: VigilInstant?, alarm: VigilInstant?) { (armedOrdinary, armedAlarm) }

    /// Suspends until the request fires, or throws `CancellationError` when
    /// the waiting task is cancelled (the request is then withdrawn).
    /// The request's owner is ``WakeOwner/current`` of the calling task: the
    /// strategy whose run asked, whom a system wake by its alarm names.
    public func wake(_ request: WakeRequest) async throws -> WakeFiring {
        try Task.checkCancellation()
        let owner = WakeOwner.current
        let now = clock.now
        if request.latest <= now {
            statistics.requestsFired += 1
            statistics.pastDueRequests += 1
            return WakeFiring(target: now, firedAt: now, batchSize: 1, onAlarmClock: false)
        }
        lastID += 1
        let id = lastID
        let preferred = preferredTime(of: request, now: now)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<WakeFiring, any Error>) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                pending[id] = Pending(request: request, owner: owner, preferred: preferred, continuation: continuation)
                byPreferred.push(preferred, id)
                byEarliest.push(request.earliest, id)
                if request.wakeSystem { wakingByPreferred.push(preferred, id) }
                rearm()
            }
        } onCancel: {
            // Unstructured task: not cancelled: one hop into the actor to withdraw the request,
            // from a synchronous cancellation handler.
            Task { await self.withdraw(id) }
        }
    }

    /// The time this request would like to fire at (see the type's comment).
    private func preferredTime(of request: WakeRequest, now: VigilInstant) -> VigilInstant {
        guard let align = request.align, align > .zero else { return request.latest }
        let slot = align.nanoseconds
        // Wall time = boottime + offset; read both now so slots follow the
        // wall clock as it is at the time of the request.
        let offset = clock.wallMicroseconds * 1_000 - now.nanoseconds
        let latestWall = request.latest.nanoseconds + offset
        let boundaryWall = latestWall - floorMod(latestWall, slot)
        let boundary = VigilInstant(nanoseconds: boundaryWall - offset)
        return boundary >= max(request.earliest, now) ? boundary : request.latest
    }

    private func floorMod(_ a: Int64, _ b: Int64) -> Int64 {
        let r = a % b
        return r < 0 ? r + b : r
    }

    private func withdraw(_ id: UInt64) {
        guard let entry = pending.removeValue(forKey: id) else { return }
        statistics.withdrawnRequests += 1
        entry.continuation.resume(throwing: CancellationError())
        compactIfSparse()
        rearm()
    }

    private func timerExpired(onAlarm: Bool) {
        let now = clock.now
        statistics.timerExpirations += 1
        // A one-shot timer whose deadline has passed is spent; one that has
        // not is a stale wake from an arming replaced meanwhile (still armed).
        if onAlarm {
            if let armed = armedAlarm, armed <= now { armedAlarm = nil }
        } else {
            if let armed = armedOrdinary, armed <= now { armedOrdinary = nil }
        }
        var owners: Set<String> = []
        while let target = firstPreferred(), target <= now {
            fireBatch(at: target, now: now, onAlarm: onAlarm, owners: &owners)
        }
        expirationObserver?(owners)
        rearm()
    }

    /// The smallest preferred time of the pending requests.
    private func firstPreferred() -> VigilInstant? {
        byPreferred.cleanTop { pending[$0] == nil }?.at
    }

    /// Rebuilds the heaps when withdrawn requests (left in them until they
    /// reach the top) outnumber the pending ones.
    private func compactIfSparse() {
        let limit = 2 * pending.count + 64
        if byPreferred.count > limit { byPreferred.rebuild { pending[$0] != nil } }
        if byEarliest.count > limit { byEarliest.rebuild { pending[$0] != nil } }
        if wakingByPreferred.count > limit { wakingByPreferred.rebuild { pending[$0] != nil } }
    }

    /// Fires every pending request with `earliest <= target`.
    /// Adds the strategies whose requests fired to `owners`.
    private func fireBatch(at target: VigilInstant, now: VigilInstant, onAlarm: Bool, owners: inout Set<String>) {
        // Resumed in order of earliest time (ties: order of request), not in
        // a dictionary's hash order: in a large batch the last resumed runs
        // hundreds of milliseconds after the first, and a periodic requester
        // should keep its place from batch to batch, or its period stretches
        // by that much.
        var due: [Pending] = []
        while let first = byEarliest.cleanTop({ pending[$0] == nil }), first.at <= target {
            byEarliest.pop()
            if let entry = pending.removeValue(forKey: first.id) { due.append(entry) }
        }
        let firing = WakeFiring(target: target, firedAt: now, batchSize: due.count, onAlarmClock: onAlarm)
        statistics.batchesFired += 1
        statistics.requestsFired += due.count
        if due.count > 1 { statistics.coalescedRequests += due.count }
        if onAlarm { statistics.alarmBatches += 1 }
        statistics.totalLateness += firing.lateness
        statistics.maxLateness = max(statistics.maxLateness, firing.lateness)
        if alarmTimer != nil {
            for entry in due where entry.request.wakeSystem {
                firedAlarms.append(SystemWakeAlarm(label: entry.request.label, owner: entry.owner, deadline: entry.preferred, firedAt: now))
            }
            if firedAlarms.count > Self.firedAlarmMemory { firedAlarms.removeFirst(firedAlarms.count - Self.firedAlarmMemory) }
        }
        latenessObserver?(firing.lateness)
        if expirationObserver != nil {
            for entry in due {
                if let strategy = entry.request.forStrategy ?? entry.owner?.strategy { owners.insert(strategy) }
            }
        }
        for entry in due { entry.continuation.resume(returning: firing) }
    }

    /// Arms the timers for the current pending set, touching a timer only
    /// when its target changed.
    ///
    /// The alarm timer is armed for the first `wakeSystem` request; the
    /// ordinary timer for the first request overall, unless that is the
    /// alarm's target already (one expiry per batch, not two).
    private func rearm() {
        let first = firstPreferred()
        let firstWaking: VigilInstant? = alarmTimer == nil
            ? nil
            : wakingByPreferred.cleanTop({ pending[$0] == nil })?.at
        let ordinary: VigilInstant? = if let first, firstWaking.map({ first < $0 }) ?? true { first } else { nil }
        if ordinary != armedOrdinary {
            timer.arm(at: ordinary)
            armedOrdinary = ordinary
        }
        if firstWaking != armedAlarm {
            alarmTimer?.arm(at: firstWaking)
            armedAlarm = firstWaking
        }
    }
}

/// Who asked for a wake: the strategy instance and its kind.
public struct WakeOwner: Sendable, Hashable {
    public var strategy: String
    public var kind: String

    /// The strategy whose run the current task belongs to (the supervisor
    /// sets it around each run; child tasks inherit it, detached ones do
    /// not). A task-local rather than a per-strategy view of the scheduler:
    /// plugins tell schedulers apart by identity to batch their wakes.
    @TaskLocal public static var current: WakeOwner?

    public init(strategy: String, kind: String) {
        self.strategy = strategy
        self.kind = kind
    }
}
