import Synchronization
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

    private struct Entry {
        var deadline: VigilInstant
        var link: TCPLink
        var generation: UInt64
    }

    /// One clock's pending deadlines; dropped (with the clock) once empty.
    private struct Queue {
        let clock: any VigilClock
        var heap: [Entry] = []
        /// The running sleeper's number and target.
        var sleeper: UInt64 = 0
        var sleepingUntil: VigilInstant?
    }

    private struct State {
        var queues: [ObjectIdentifier: Queue] = [:]
        var lastSleeper: UInt64 = 0
    }

    private let state = Mutex(State())

    /// Fails `link`'s handler `generation` (``TCPLink/expireHandler(generation:)``)
    /// once `deadline` passes on `clock`, unless a newer handler runs by then.
    func add(_ deadline: VigilInstant, clock: any VigilClock, link: TCPLink, generation: UInt64) {
        let key = Self.key(of: clock)
        let start: (UInt64, VigilInstant)? = state.withLock { s in
            // Changed in place: one lookup, no copy of the heap.
            func add(_ queue: inout Queue, _ lastSleeper: inout UInt64) -> (UInt64, VigilInstant)? {
                Self.push(&queue.heap, Entry(deadline: deadline, link: link, generation: generation))
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
            Task.detached { [self] in await sleep(key: key, clock: clock, sleeper: sleeper, until: target) }
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
                var due: [Entry] = []
                while let top = queue.heap.first, top.deadline <= now { due.append(Self.pop(&queue.heap)) }
                // Handlers that already finished need no wake: a batch of
                // pings answered at once leaves one sleep, not one per ping.
                while let top = queue.heap.first, !top.link.runsHandler(generation: top.generation) { _ = Self.pop(&queue.heap) }
                queue.sleepingUntil = queue.heap.first?.deadline
                if !queue.heap.isEmpty { s.queues[key] = queue }
                return (due, queue.sleepingUntil)
            }
            for entry in due { entry.link.expireHandler(generation: entry.generation) }
            guard let next else { return }
            target = next
        }
    }

    /// A class clock is one clock per instance; a value-type clock (the
    /// system clock) has no identity, so its type names it.
    private static func key(of clock: any VigilClock) -> ObjectIdentifier {
        if type(of: clock) is AnyObject.Type { return ObjectIdentifier(clock as AnyObject) }
        return ObjectIdentifier(type(of: clock))
    }

    private static func push(_ heap: inout [Entry], _ entry: Entry) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private static func pop(_ heap: inout [Entry]) -> Entry {
        let top = heap[0]
        let last = heap.removeLast()
        guard !heap.isEmpty else { return top }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count, heap[right].deadline < heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return top }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
