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
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count, items[left].instant < items[smallest].instant { smallest = left }
            if right < items.count, items[right].instant < items[smallest].instant { smallest = right }
            guard smallest != parent else { return top }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
