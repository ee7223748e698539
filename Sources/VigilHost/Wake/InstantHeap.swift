import VigilKit

/// A binary min-heap of (instant, request id), for the wake scheduler's
/// three orders (by preferred time, by earliest time, and waking requests by
/// preferred time). Entries are never removed from the middle: the scheduler
/// skips ids that are no longer pending when they reach the top (lazy
/// deletion) and rebuilds a heap that holds too many of them.
struct InstantHeap {
    private(set) var items: [(at: VigilInstant, id: UInt64)] = []

    var count: Int { items.count }
    var top: (at: VigilInstant, id: UInt64)? { items.first }

    mutating func push(_ at: VigilInstant, _ id: UInt64) {
        items.append((at, id))
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard less(child, parent) else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    @discardableResult
    mutating func pop() -> (at: VigilInstant, id: UInt64)? {
        guard !items.isEmpty else { return nil }
        items.swapAt(0, items.count - 1)
        let popped = items.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count && less(left, smallest) { smallest = left }
            if right < items.count && less(right, smallest) { smallest = right }
            guard smallest != parent else { break }
            items.swapAt(parent, smallest)
            parent = smallest
        }
        return popped
    }

    /// Drops entries from the top while `isStale` says so; returns the top.
    mutating func cleanTop(_ isStale: (UInt64) -> Bool) -> (at: VigilInstant, id: UInt64)? {
        while let first = items.first, isStale(first.id) { pop() }
        return items.first
    }

    /// Keeps only the entries `keep` accepts.
    mutating func rebuild(keeping keep: (UInt64) -> Bool) {
        let kept = items.filter { keep($0.id) }
        items = []
        for item in kept { push(item.at, item.id) }
    }

    private func less(_ a: Int, _ b: Int) -> Bool {
        items[a].at < items[b].at || (items[a].at == items[b].at && items[a].id < items[b].id)
    }
}
