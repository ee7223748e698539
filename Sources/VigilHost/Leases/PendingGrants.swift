/// Grants under way: leases and inhibits whose request passed the per-uid
/// limits and now waits on the registry (or the power backend). Each is
/// counted against its uid's limits from before the first suspension point
/// until it is held or refused, so no interleaving of calls can exceed a
/// limit (docs/security.md, "Limits hold under concurrency").
struct PendingGrants {
    struct Ticket: Hashable {
        fileprivate let number: UInt64
    }

    private var pending: [UInt64: (uid: UInt32, budget: Duration)] = [:]
    private var issued: UInt64 = 0

    /// Counts one grant of `budget` against `uid` until ``release(_:)``.
    mutating func reserve(uid: UInt32, budget: Duration = .zero) -> Ticket {
        issued += 1
        pending[issued] = (uid, budget)
        return Ticket(number: issued)
    }

    /// The grant is held (and counted where it is held) or was refused.
    mutating func release(_ ticket: Ticket) {
        pending[ticket.number] = nil
    }

    /// How many grants to `uid` are under way.
    func count(uid: UInt32) -> Int {
        pending.values.reduce(0) { $0 + ($1.uid == uid ? 1 : 0) }
    }

    /// The budget of the grants to `uid` under way.
    func budget(uid: UInt32) -> Duration {
        pending.values.reduce(Duration.zero) { $0 + ($1.uid == uid ? $1.budget : .zero) }
    }
}
