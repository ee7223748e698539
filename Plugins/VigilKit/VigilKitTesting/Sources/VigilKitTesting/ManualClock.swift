import Glibc
import VigilKit

/// A clock that moves only when told to: tests drive budgets, renewals and
/// schedules through it, so minutes of behaviour take milliseconds. Give it
/// to a strategy as `StrategyContext.clock`.
///
/// `advance(by:)` moves time in steps, stopping at every pending deadline and
/// letting the woken tasks run (and register new sleepers) before moving on.
public final class ManualClock: VigilClock {
    private struct Sleeper {
        var id: UInt64
        var deadline: VigilInstant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: VigilInstant
        var wallOffsetMicros: Int64 = 1_700_000_000_000_000
        var sleepers: [Sleeper] = []
        var nextID: UInt64 = 0
        var cancelled: Set<UInt64> = []
        /// Sleepers resumed by a move of time whose tasks have not run yet.
        var waking: Set<UInt64> = []
    }

    private let state: Lock<State>

    public init(start: VigilInstant = VigilInstant(nanoseconds: 1_000_000_000_000)) {
        state = Lock(State(now: start))
    }

    public var now: VigilInstant { state.withLock { $0.now } }

    public var wallMicroseconds: Int64 {
        state.withLock { $0.wallOffsetMicros + $0.now.nanoseconds / 1_000 }
    }

    /// Number of tasks currently sleeping on this clock.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// Number of tasks sleeping until `deadline` or earlier.
    public func sleeperCount(dueBy deadline: VigilInstant) -> Int {
        state.withLock { $0.sleepers.count { $0.deadline <= deadline } }
    }

    /// The earliest pending deadline, if any.
    public var nextDeadline: VigilInstant? { state.withLock { $0.sleepers.map(\.deadline).min() } }

    public func sleep(until deadline: VigilInstant) async throws {
        let id: UInt64 = state.withLock {
            $0.nextID += 1
            return $0.nextID
        }
        defer { _ = state.withLock { $0.waking.remove(id) } }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let resumeNow: Result<Void, any Error>? = state.withLock { state in
                    if state.cancelled.remove(id) != nil { return .failure(CancellationError()) }
                    if deadline <= state.now { return .success(()) }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: c))
                    return nil
                }
                if let resumeNow { c.resume(with: resumeNow) }
            }
        } onCancel: {
            let c: CheckedContinuation<Void, any Error>? = state.withLock { state in
                if let i = state.sleepers.firstIndex(where: { $0.id == id }) {
                    return state.sleepers.remove(at: i).continuation
                }
                state.cancelled.insert(id)
                return nil
            }
            c?.resume(throwing: CancellationError())
        }
    }

    /// Moves time forward by `duration`, waking sleepers in deadline order.
    /// After each wake it yields until the system settles, so that tasks woken
    /// at one deadline can schedule the next before time moves on.
    public func advance(by duration: Duration) async {
        let target = now + duration
        await advance(to: target)
    }

    public func advance(to target: VigilInstant) async {
        while true {
            await settle()
            let due: [Sleeper] = state.withLock { state in
                guard let next = state.sleepers.map(\.deadline).min(), next <= target else {
                    state.now = max(state.now, target)
                    return []
                }
                state.now = max(state.now, next)
                let due = state.sleepers.filter { $0.deadline <= next }
                state.sleepers.removeAll { $0.deadline <= next }
                state.waking.formUnion(due.map(\.id))
                return due
            }
            if due.isEmpty { break }
            for s in due { s.continuation.resume() }
            await awaitWoken()
        }
        await settle()
    }

    /// Moves time forward by `duration` in one step, as a system suspend or a
    /// frozen process sees it: nothing runs in between, and every sleeper due
    /// by the new time wakes at once, late.
    public func jump(by duration: Duration) async {
        await settle()
        let due: [Sleeper] = state.withLock { state in
            let now = state.now + duration
            state.now = now
            let due = state.sleepers.filter { $0.deadline <= now }
            state.sleepers.removeAll { $0.deadline <= now }
            state.waking.formUnion(due.map(\.id))
            return due
        }
        for s in due { s.continuation.resume() }
        await awaitWoken()
        await settle()
    }

    /// Waits until every task this clock woke has run again, up to
    /// `wokenBound` of real time: a resumed continuation only makes its task
    /// runnable, and a busy machine (or ThreadSanitizer) may leave it
    /// waiting for a thread longer than `settle()`'s yields last. Time must
    /// not move on before it ran, or the sleep it takes next starts late.
    /// Past the bound it moves on: the test then fails on what it expected.
    private func awaitWoken() async {
        try? await settle(until: "the woken tasks ran", timeout: Self.wokenBound) { state.withLock { $0.waking.isEmpty } }
    }

    /// How long a move of time waits for the tasks it woke to run.
    static let wokenBound: Duration = .seconds(10)

    /// Settles until `condition` holds, up to `timeout` of real time, and
    /// throws ``ManualClock/Timeout`` if it never does.
    ///
    /// Wait with this for what a test expects a move of time to cause: a
    /// woken task's state, an event, or its next sleep (`sleeperCount`,
    /// `nextDeadline`). `settle()` gives the woken work a fixed number of
    /// yields, which actor hops on a loaded machine can outlast.
    public func settle(until what: String, timeout: Duration = .seconds(30), _ condition: () async throws -> Bool) async throws {
        let end = ContinuousClock.now + timeout
        while try await !condition() {
            guard ContinuousClock.now < end else { throw Timeout(what: what, after: timeout) }
            for _ in 0..<8 { await Task.yield() }
            sched_yield()
        }
    }

    /// What ``settle(until:timeout:_:)`` throws when its condition never held.
    public struct Timeout: Error, CustomStringConvertible {
        public let what: String
        public let after: Duration
        public var description: String { "the test clock settled for \(after) of real time and this never held: \(what)" }
    }

    /// Lets runnable tasks run: yields repeatedly so work triggered by a wake
    /// (actor hops, new sleeps) completes before the test looks at state.
    ///
    /// `Task.yield` only reschedules this task; woken tasks may be runnable on
    /// other threads that a busy machine has not given a core yet, so every
    /// few yields this thread also gives up its core (`sched_yield`).
    public func settle() async {
        for i in 0..<400 {
            await Task.yield()
            if i % 8 == 7 { sched_yield() }
        }
    }
}
