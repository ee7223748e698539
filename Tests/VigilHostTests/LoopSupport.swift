import VigilKit
import VigilTestSupport

/// Returns once the host's ``EventLoop`` has gone round at least once since
/// the call: the first posted job runs in one turn, and the second only in a
/// later one, after the loop asked epoll again and dispatched what it got.
///
/// Posted work runs in order, so work the loop queued before the call (a
/// cancelled watch's `released`) has run when this returns. A descriptor
/// that was ready has been handed to its handler only if epoll reported it
/// in those turns: it reports at most 64 a turn, so with more ready at once
/// (other tests' descriptors) it may come later. So use this to check that
/// nothing more happened (a handler called again, a descriptor left ready),
/// and wait for what must happen (``WaitableCount``).
func loopTurns(_ turns: Int = 2) async {
    for _ in 0..<max(2, turns) {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            EventLoop.post { done.resume() }
        }
    }
}

/// A count that a test can wait to reach, without polling.
final class WaitableCount: Sendable {
    private struct Waiter {
        let id: UInt64
        let target: Int
        let done: CheckedContinuation<Void, Never>
    }
    private struct State {
        var value = 0
        var waiters: [Waiter] = []
        var nextID: UInt64 = 0
        var cancelled: Set<UInt64> = []
    }
    private let state = Lock(State())

    var value: Int { state.withLock { $0.value } }

    func add(_ n: Int = 1) {
        let due = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.value += n
            let value = state.value
            let due = state.waiters.filter { $0.target <= value }.map(\.done)
            state.waiters.removeAll { $0.target <= value }
            return due
        }
        for done in due { done.resume() }
    }

    /// True once the count is at least `target`; false if `timeout` passes
    /// first (a bound for a broken run, not a measure).
    func wait(for target: Int, timeout: Duration = .seconds(30)) async -> Bool {
        let id = state.withLock { state -> UInt64 in
            defer { state.nextID += 1 }
            return state.nextID
        }
        let reached = await first(within: timeout) { [self] () async -> Bool? in
            await withTaskCancellationHandler {
                await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                    let now = state.withLock { state -> Bool in
                        if state.value >= target || state.cancelled.contains(id) { return true }
                        state.waiters.append(Waiter(id: id, target: target, done: done))
                        return false
                    }
                    if now { done.resume() }
                }
            } onCancel: {
                let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                    state.cancelled.insert(id)
                    guard let i = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: i).done
                }
                waiter?.resume()
            }
            return value >= target ? true : nil
        }
        state.withLock { _ = $0.cancelled.remove(id) }
        return reached ?? false
    }
}
