/// A value kept on the heap, one word wide where it is stored, with value
/// semantics: a copy shares the storage until one of them changes
/// (copy-on-write, the storage being a one-element array).
///
/// For the values of a table keyed by lease or strategy. A dictionary's
/// buckets hold its values inline, and a table of n entries has up to
/// 8/3 n buckets (it grows at three quarters full, doubling): at 10,000
/// leases, 16,384 buckets. With a snapshot of a lease inline (about 280
/// bytes) the empty buckets cost more than a third of the table; kept out
/// of line, each bucket costs a word and each entry its own allocation.
struct OutOfLine<Value> {
    private var storage: ContiguousArray<Value>

    init(_ value: Value) { storage = [value] }

    var value: Value {
        _read { yield storage[0] }
        _modify { yield &storage[0] }
    }
}

extension OutOfLine: Sendable where Value: Sendable {}
