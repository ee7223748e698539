import VigilKit

/// Returns once the host's ``EventLoop`` has gone round at least once since
/// the call: the first posted job runs in one turn, and the second only in a
/// later one, after the loop asked epoll again and dispatched what was ready.
/// So a descriptor that was ready when this was called (a watch that is
/// level-triggered and left unread, or an event already queued) has been
/// handed to its handler by the time this returns. Each turn's epoll returns
/// at most 64 descriptors: more turns for more ready at once.
func loopTurns(_ turns: Int = 2) async {
    for _ in 0..<max(2, turns) {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            EventLoop.post { done.resume() }
        }
    }
}
