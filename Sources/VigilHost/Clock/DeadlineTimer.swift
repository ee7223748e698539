import Foundation
import VigilKit

/// Sleeps until a `CLOCK_BOOTTIME` (or, `awake`, a `CLOCK_MONOTONIC`)
/// deadline, on the host's event loop (an ``EventLoop/Timer``).
///
/// Why not `Task.sleep`: in Swift 6.3 it schedules through libdispatch's
/// global queues, whose worker monitor then wakes the process every second
/// for the rest of its life. The loop's timers wait on one timerfd per
/// clock, armed for the earliest pending deadline; a cancelled sleep is
/// removed and never wakes anything.
enum DeadlineTimer {
    /// One sleeper. Resumed exactly once: by the timer, or by cancellation.
    private final class Sleeper: Sendable {
        struct State {
            var continuation: CheckedContinuation<Void, any Error>?
            var timer: EventLoop.Timer?
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
    /// Throws `CancellationError` when cancelled, or the loop's error when
    /// it cannot be started.
    static func sleep(until deadline: Int64, awake: Bool = false) async throws {
        let clock: EventLoop.TimerClock = awake ? .monotonic : .boottime
        guard deadline > clock.now else {
            try Task.checkCancellation()
            return
        }
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
                do {
                    let timer = try EventLoop.Timer.at(deadline, on: clock) { sleeper.resume(.success(())) }
                    // A cancellation that came in between found no timer to
                    // stop: stopped here, so it does not hold the sleeper
                    // until its deadline.
                    let cancelledMeanwhile: Bool = sleeper.state.withLock {
                        $0.timer = timer
                        return $0.cancelled
                    }
                    if cancelledMeanwhile { timer.cancel() }
                } catch {
                    sleeper.resume(.failure(error))
                }
            }
        } onCancel: {
            let timer: EventLoop.Timer? = sleeper.state.withLock {
                $0.cancelled = true
                return $0.timer
            }
            timer?.cancel()
            sleeper.resume(.failure(CancellationError()))
        }
    }
}
