import CVigilLoop
import CTimer
import Foundation
import VigilKit

/// Sleeps until a `CLOCK_BOOTTIME` (or, `awake`, a `CLOCK_MONOTONIC`)
/// deadline on Vigil's own timer threads.
///
/// Why not `Task.sleep`: in Swift 6.3 it schedules through libdispatch's
/// global queues, whose worker monitor then wakes the process every second
/// for the rest of its life. This timer is one timerfd armed for the earliest
/// pending deadline; a cancelled sleep is removed and never wakes anything.
enum DeadlineTimer {
    /// One sleeper. Resumed exactly once: by the timer, or by cancellation.
    private final class Sleeper: Sendable {
        struct State {
            var continuation: CheckedContinuation<Void, any Error>?
            var id: UInt64 = 0
            var cancelled = false
        }
        let state = Lock(State())

        func resume(_ result: Result<Void, any Error>) {
            let c: CheckedContinuation<Void, any Error>? = state.withLock { state in
                defer { state.continuation = nil }
                return state.continuation
            }
            c?.resume(with: result)
        }
    }

    /// A deadline already past returns at once (after a cancellation check).
    static func sleep(until deadline: Int64, awake: Bool = false) async throws {
        guard deadline > vigil_clock_ns(awake ? vigil_CLOCK_MONOTONIC : vigil_CLOCK_BOOTTIME) else {
            try Task.checkCancellation()
            return
        }
        let timeline: Int32 = awake ? 1 : 0
        let sleeper = Sleeper()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let alreadyCancelled: Bool = sleeper.state.withLock {
                    if $0.cancelled { return true }
                    $0.continuation = c
                    return false
                }
                if alreadyCancelled {
                    c.resume(throwing: CancellationError())
                    return
                }
                // The timer owns one reference until it fires or is cancelled.
                let context = Unmanaged.passRetained(sleeper).toOpaque()
                let id = vigil_timer_schedule(timeline, deadline, { context in
                    guard let context else { return }
                    Unmanaged<Sleeper>.fromOpaque(context).takeRetainedValue().resume(.success(()))
                }, context)
                if id == 0 {
                    Unmanaged<Sleeper>.fromOpaque(context).release()
                    sleeper.resume(.failure(POSIXError(.EAGAIN)))
                    return
                }
                sleeper.state.withLock { $0.id = id }
            }
        } onCancel: {
            let id: UInt64 = sleeper.state.withLock {
                $0.cancelled = true
                return $0.id
            }
            // Removed before firing: the timer's reference is ours to drop.
            if id != 0, vigil_timer_cancel(timeline, id) != 0 {
                Unmanaged.passUnretained(sleeper).release()
            }
            sleeper.resume(.failure(CancellationError()))
        }
    }
}
