import VigilKit

/// An entry of an ``InstantHeap``: the instant it is ordered by.
protocol InstantOrdered {
    var instant: VigilInstant { get }
}

/// A binary min-heap: the entry with the earliest instant on top. Shared by
/// the handler deadlines and the keep-alive schedule, which each keep one
/// entry per connection and take the most urgent first.
struct InstantHeap<Element: InstantOrdered> {
    private var items: [Element] = []

    var first: Element? { items.first }
    var isEmpty: Bool { items.isEmpty }

    /// Visits every entry, in no order.
    func forEach(_ body: (Element) -> Void) {
        for item in items { body(item) }
    }

    mutating func push(_ element: Element) {
        items.append(element)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].instant < items[parent].instant else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    /// Takes the top entry off; nil when empty.
    mutating func pop() -> Element? {
        guard let top = items.first else { return nil }
        let last = items.removeLast()
        guard !items.isEmpty else { return top }
        items[0] = last
        siftDown(from: 0)
        return top
    }

    /// Pops entries from the top while `predicate` holds for the top, and
    /// returns them (earliest first, then in no order). Popping k entries
    /// one by one costs O(k log n); a round of thousands of connections
    /// leaves thousands due or stale at once, so after `popLimit` pops the
    /// rest is taken in one O(n) pass over the whole heap instead. That pass
    /// takes every entry `predicate` picks, also one below an entry it does
    /// not pick: callers use a test for which that is right (a deadline
    /// passed, an entry gone stale, a window opened).
    mutating func popAll(while predicate: (Element) -> Bool, popLimit: Int = 64) -> [Element] {
        var taken: [Element] = []
        popAll(while: predicate, into: &taken, popLimit: popLimit)
        return taken
    }

    /// ``popAll(while:popLimit:)``, appending to `taken`.
    mutating func popAll(while predicate: (Element) -> Bool, into taken: inout [Element], popLimit: Int = 64) {
        var popped = 0
        while let top = items.first, predicate(top) {
            guard popped < popLimit else {
                partition(taking: predicate, into: &taken)
                return
            }
            _ = pop()
            taken.append(top)
            popped += 1
        }
    }

    /// Moves every entry `predicate` picks into `taken`, then restores the
    /// heap order of the rest (Floyd's bottom-up heapify): O(n).
    private mutating func partition(taking predicate: (Element) -> Bool, into taken: inout [Element]) {
        var kept = 0
        for i in items.indices {
            if predicate(items[i]) {
                taken.append(items[i])
            } else {
                if kept != i { items.swapAt(kept, i) }
                kept += 1
            }
        }
        items.removeLast(items.count - kept)
        for parent in stride(from: items.count / 2 - 1, through: 0, by: -1) { siftDown(from: parent) }
    }

    private mutating func siftDown(from start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count, items[left].instant < items[smallest].instant { smallest = left }
            if right < items.count, items[right].instant < items[smallest].instant { smallest = right }
            guard smallest != parent else { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
