import VigilKit

/// The next keep-alive rounds of every connection, one heap per wake
/// scheduler, alignment and window, woken through that scheduler.
///
/// Why not a task per connection: a task keeps its stack slab (a few
/// kilobytes) for as long as it lives, and waking it for a ping costs
/// several executor hops. Here a connection's next round is an entry on a
/// heap; one wake request (the earliest window's) stands for all of them,
/// and when it fires every connection whose window has opened pings in the
/// same batch, from that one wake. The host's scheduler still sees the
/// window of the most urgent round, so it coalesces with other strategies'
/// wakes as before, and a test clock drives it exactly.
///
/// With an alignment, rounds that came apart merge again. A batch goes when
/// every window it takes in has opened (the request's `earliest` is the
/// latest opening among the rounds whose window opens before the most
/// urgent one's end), so a wake coalesced early or an aligned slot cannot
/// cut it in two. One keeper of the group leads: a batch without the
/// leader's round (while the leader has one waiting) goes at that opening,
/// as early as its windows allow, instead of as late as they allow, and so
/// closes on the leader's batch by up to the window's width less the
/// margin each round (1.5 s for 10 s and 20 %) until its windows hold the
/// leader's batch and it rides along (docs/benchmarks.md, "The spread is
/// the start's wall time"). No ping goes outside its window: a batch fires
/// inside every window it takes in.
final class KeepAliveSchedule: Sendable {
    static let shared = KeepAliveSchedule()

    /// Rounds waiting on one scheduler, with one alignment and the same
    /// window (interval and jitter): rounds of one period, which can keep
    /// in step once merged. Other periods still coalesce in the scheduler.
    struct Key: Hashable {
        var scheduler: ObjectIdentifier
        var align: Duration?
        /// Where the window opens and where it aims, after the base (ns).
        var opens: Int64
        var aims: Int64

        /// A keeper's key, worked out once per session: telling schedulers
        /// apart takes a dynamic cast, too dear for every ping.
        init(_ scheduler: any WakeScheduling, align: Duration?, window: (earliest: Int64, target: Int64)) {
            self.scheduler = instanceIdentity(of: scheduler)
            self.align = align
            self.opens = window.earliest
            self.aims = window.target
        }
    }

    /// A round that came due: its keeper and the generation it was for.
    struct Due: Sendable {
        var keeper: PingKeeper
        var generation: UInt64
    }

    private struct Entry: InstantOrdered {
        var earliest: VigilInstant
        var latest: VigilInstant
        var keeper: PingKeeper
        var generation: UInt64
        var instant: VigilInstant { latest }
    }

    private struct Group {
        let scheduler: any WakeScheduling
        /// Ordered by `latest`: the most urgent round on top.
        var heap = InstantHeap<Entry>()
        /// Keepers with a live entry. A keeper's live entry is the one whose
        /// generation its ``PingKeeper/scheduledEntry`` holds; its other
        /// entries are stale and dropped when they come up.
        var live = 0
        /// The wake request in flight: its number, window end and task.
        var waker: (number: UInt64, latest: VigilInstant, task: Task<Void, Never>)?
        /// The keeper whose batch the others close on (aligned groups): the
        /// first one added, replaced by the next one added when it goes.
        var leader: PingKeeper?
    }

    private struct State {
        var groups: [Key: Group] = [:]
        var lastWaker: UInt64 = 0
    }

    private let state = Lock(State())

    /// Runs `keeper.due(generation:)` once the host's scheduler fires a wake
    /// inside [earliest, latest]; replaces the keeper's earlier entry.
    func add(_ keeper: PingKeeper, generation: UInt64, earliest: VigilInstant, latest: VigilInstant) {
        let key = keeper.scheduleKey
        let cancel: Task<Void, Never>? = state.withLock { s in
            // Changed in place: one lookup, no copy of the heap.
            func add(_ group: inout Group, _ lastWaker: inout UInt64) -> Task<Void, Never>? {
                if keeper.scheduledEntry.exchange(generation, ordering: .relaxed) == 0 { group.live += 1 }
                group.heap.push(Entry(earliest: earliest, latest: latest, keeper: keeper, generation: generation))
                if group.leader == nil { group.leader = keeper }
                // The leader's round decides whether the batch waiting
                // closes on it or is its batch: the wake is worked out again.
                let leads = key.align != nil && group.leader === keeper
                if !leads, let waker = group.waker, waker.latest <= latest { return nil }
                // None waits yet, it waits past this window's end, or the
                // leader's round came.
                let old = group.waker?.task
                arm(&group, key: key, lastWaker: &lastWaker)
                return old
            }
            return add(&s.groups[key, default: Group(scheduler: keeper.scheduler)], &s.lastWaker)
        }
        cancel?.cancel()
    }

    /// Drops `keeper`'s entry; the wake goes when no round is left.
    func remove(_ keeper: PingKeeper) {
        let key = keeper.scheduleKey
        let cancel: Task<Void, Never>? = state.withLock { s in
            guard var group = s.groups.removeValue(forKey: key) else { return nil }
            if keeper.scheduledEntry.exchange(0, ordering: .relaxed) != 0 { group.live -= 1 }
            if group.leader === keeper { group.leader = nil }  // the next one added leads
            guard group.live == 0 else {
                s.groups[key] = group
                return nil
            }
            return group.waker?.task
        }
        cancel?.cancel()
    }

    /// Requests a wake for the most urgent live entry (dropping stale ones
    /// on the way), or none when nothing is left.
    private func arm(_ group: inout Group, key: Key, lastWaker: inout UInt64) {
        _ = group.heap.popAll { $0.keeper.scheduledEntry.load(ordering: .relaxed) != $0.generation }
        guard let top = group.heap.first else {
            group.waker = nil
            return
        }
        let (earliest, latest) = window(for: top, in: group, aligned: key.align != nil)
        lastWaker += 1
        let number = lastWaker
        // The wake is the most urgent round's, so its strategy's wakeup
        // (the task below is detached: the host cannot tell by itself).
        // Rounds of other instances that come due in the same firing ride
        // along, as requests coalesce.
        let request = WakeRequest(
            earliest: earliest, latest: latest, align: key.align,
            label: "voip-socket keep-alive (\(group.live) connection\(group.live == 1 ? "" : "s"))",
            forStrategy: top.keeper.strategy)
        let scheduler = group.scheduler
        // High priority, like the host's timer task that resumes it: pings
        // do not wait for a thread of the default priority (see
        // docs/wake-scheduler.md, "Priority").
        // Unstructured task: kept as the group's waker; cancelled when a more urgent waker replaces
        // it or the group's last entry goes (add, remove).
        let task = Task.detached(priority: .high) { [self] in
            guard let firing = try? await scheduler.wake(request) else { return }  // cancelled: replaced or nothing left
            fire(key: key, number: number, at: firing.firedAt)
        }
        group.waker = (number, latest, task)
    }

    /// The window of the wake for the batch `top` heads. Without alignment,
    /// `top`'s own (its random target as the end), as before. With it: from
    /// the latest opening among the live rounds whose window opens by
    /// `top`'s end (they are the batch, and fire together wherever the
    /// scheduler puts the wake), to `top`'s end; or at that opening when
    /// the leader has a round waiting outside the batch, so that the batch
    /// closes on the leader's. Every round of the batch has the window
    /// inside its own, and one pass over the heap (once or twice a round)
    /// finds it.
    private func window(for top: Entry, in group: Group, aligned: Bool) -> (VigilInstant, VigilInstant) {
        guard aligned else { return (top.earliest, top.latest) }
        let leader = group.leader
        var opens = top.earliest
        var leaderIn = false
        group.heap.forEach { entry in
            guard entry.earliest <= top.latest,
                entry.keeper.scheduledEntry.load(ordering: .relaxed) == entry.generation
            else { return }
            if entry.earliest > opens { opens = entry.earliest }
            if entry.keeper === leader { leaderIn = true }
        }
        if let leader, !leaderIn, leader.scheduledEntry.load(ordering: .relaxed) != 0 {
            return (opens, opens)  // behind the leader's batch: catch up
        }
        return (opens, top.latest)
    }

    /// A wake fired at `now`: every round whose window opened is due.
    private func fire(key: Key, number: UInt64, at now: VigilInstant) {
        let due: [Entry] = state.withLock { s in
            guard var group = s.groups.removeValue(forKey: key) else { return [] }
            guard group.waker?.number == number else {  // replaced by a more urgent one
                s.groups[key] = group
                return []
            }
            // The top's window is what the scheduler fired for; the others
            // whose window opened go along (their `latest` is later).
            var due: [Entry] = []
            if let top = group.heap.pop() { due.append(top) }
            group.heap.popAll(while: { $0.earliest <= now }, into: &due)
            // Stale entries (their keeper was rescheduled or removed since)
            // are dropped in place.
            var kept = 0
            for i in due.indices where due[i].keeper.scheduledEntry.compareExchange(
                expected: due[i].generation, desired: 0, ordering: .relaxed).exchanged {
                if kept != i { due.swapAt(kept, i) }
                kept += 1
            }
            due.removeLast(due.count - kept)
            group.live -= kept
            arm(&group, key: key, lastWaker: &s.lastWaker)
            if group.live > 0 || group.waker != nil { s.groups[key] = group }
            return due
        }
        // A few pings go from here at once; many go to the event thread,
        // where they do not fight the handling of their pongs (a hop to that
        // thread costs a wake-up, which a busy machine can make tens of
        // milliseconds late: worth it only for a large round).
        if due.count < Self.roundToEventThread {
            for entry in due { entry.keeper.due(generation: entry.generation) }
        } else {
            SocketEventLoop.shared.run(due.map { Due(keeper: $0.keeper, generation: $0.generation) })
        }
    }

    /// From how many connections due at once their pings are sent by the
    /// event thread (``SocketEventLoop/run(_:)``).
    static let roundToEventThread = 64
}
