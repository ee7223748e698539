import VigilKit

/// The deadlines of every running ping handler, one min-heap per clock,
/// watched by one sleeping task per clock.
///
/// Why not a timer per ping: with thousands of connections pinging in the
/// same batch, a child task and a timer armed and cancelled for each ping
/// was the largest part of a ping's CPU cost. Here a ping pushes its
/// deadline onto a heap under one lock; a handler that finishes leaves its
/// entry behind (the link's handler generation makes it stale); the
/// sleeper wakes at the earliest deadline, expires the handlers still
/// running, drops the stale entries and sleeps until the next deadline of
/// a handler that still runs. A batch of
/// pings with one deadline costs one wake-up. Deadlines stay on the host's
/// clock (a test clock drives them exactly).
final class HandlerDeadlines: Sendable {
    static let shared = HandlerDeadlines()

    private struct Entry: InstantOrdered {
        var deadline: VigilInstant
        var link: TCPLink
        var generation: UInt64
        var instant: VigilInstant { deadline }
    }

    /// One clock's pending deadlines; dropped (with the clock) once empty.
    private struct Queue {
        let clock: any VigilClock
        var heap = InstantHeap<Entry>()
        /// The running sleeper's number and target.
        var sleeper: UInt64 = 0
        var sleepingUntil: VigilInstant?
    }

    private struct State {
        var queues: [ObjectIdentifier: Queue] = [:]
        var lastSleeper: UInt64 = 0
    }

    private let state = Lock(State())

    /// Fails `link`'s handler `generation` (``TCPLink/expireHandler(generation:)``)
    /// once `deadline` passes on `clock`, unless a newer handler runs by then.
    /// `identity`: the clock's ``instanceIdentity(of:)``.
    func add(_ deadline: VigilInstant, clock: any VigilClock, identity key: ObjectIdentifier, link: TCPLink, generation: UInt64) {
        let start: (UInt64, VigilInstant)? = state.withLock { s in
            // Changed in place: one lookup, no copy of the heap.
            func add(_ queue: inout Queue, _ lastSleeper: inout UInt64) -> (UInt64, VigilInstant)? {
                queue.heap.push(Entry(deadline: deadline, link: link, generation: generation))
                if let target = queue.sleepingUntil, target <= deadline { return nil }
                // None sleeps yet, or it sleeps past this deadline: a new one
                // takes over (the old one sees it was replaced and ends).
                lastSleeper += 1
                queue.sleeper = lastSleeper
                queue.sleepingUntil = deadline
                return (lastSleeper, deadline)
            }
            return add(&s.queues[key, default: Queue(clock: clock)], &s.lastSleeper)
        }
        if let (sleeper, target) = start {
            // High priority, as the keep-alive rounds: an overrun is cut off
            // on time even while the default priority's threads are busy.
            // Unstructured task: not cancelled: it ends when its queue is empty or a sleeper with
            // an earlier target replaced it.
            Task.detached(priority: .high) { [self] in await sleep(key: key, clock: clock, sleeper: sleeper, until: target) }
        }
    }

    private func sleep(key: ObjectIdentifier, clock: any VigilClock, sleeper: UInt64, until first: VigilInstant) async {
        var target = first
        while true {
            do { try await clock.sleep(until: target) } catch { return }
            let now = clock.now
            let (due, next): ([Entry], VigilInstant?) = state.withLock { s in
                // Taken out of the table while it changes, so its heap is not copied.
                guard var queue = s.queues.removeValue(forKey: key) else { return ([], nil) }
                guard queue.sleeper == sleeper else {  // replaced by a sleeper with an earlier target
                    s.queues[key] = queue
                    return ([], nil)
                }
                let due = queue.heap.popAll { $0.deadline <= now }
                // Handlers that already finished need no wake: a batch of
                // pings answered at once leaves one sleep, not one per ping.
                _ = queue.heap.popAll { !$0.link.runsHandler(generation: $0.generation) }
                queue.sleepingUntil = queue.heap.first?.deadline
                if !queue.heap.isEmpty { s.queues[key] = queue }
                return (due, queue.sleepingUntil)
            }
            for entry in due { entry.link.expireHandler(generation: entry.generation) }
            guard let next else { return }
            target = next
        }
    }

}

/// What tells apart the clocks (and schedulers) a shared table serves: a
/// class instance is one per instance; a value (the system clock) has no
/// identity, so its type names it.
func instanceIdentity(of value: Any) -> ObjectIdentifier {
    if type(of: value) is AnyObject.Type { return ObjectIdentifier(value as AnyObject) }
    return ObjectIdentifier(type(of: value))
}
