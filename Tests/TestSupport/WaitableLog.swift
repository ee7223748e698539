import Foundation

/// Items appended from any thread, and a bounded wait for a condition over
/// all of them so far: tests await what a server or a strategy did instead
/// of sleeping.
public final class WaitableLog<Item: Sendable>: @unchecked Sendable {
    // Invariant: `items`, `waiters` and `nextWaiter` are only touched while
    // holding `lock`.
    private let lock = NSLock()
    private var items: [Item] = []
    private var waiters: [(id: UInt64, check: ([Item]) -> Bool, continuation: CheckedContinuation<Bool, Never>)] = []
    private var nextWaiter: UInt64 = 0

    public init() {}

    public var all: [Item] { lock.withLock { items } }

    /// Appends `item` and wakes the waiters whose condition now holds.
    public func append(_ item: Item) {
        let ready: [CheckedContinuation<Bool, Never>] = lock.withLock {
            items.append(item)
            let snapshot = items
            var out: [CheckedContinuation<Bool, Never>] = []
            waiters.removeAll { waiter in
                guard waiter.check(snapshot) else { return false }
                out.append(waiter.continuation)
                return true
            }
            return out
        }
        for continuation in ready { continuation.resume(returning: true) }
    }

    /// Waits until `condition` holds for the items so far; false after `timeout`.
    public func wait(timeout: Duration = .seconds(10), until condition: @escaping @Sendable ([Item]) -> Bool) async -> Bool {
        let id: UInt64 = lock.withLock { nextWaiter += 1; return nextWaiter }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            let waiter = lock.withLock { () -> CheckedContinuation<Bool, Never>? in
                guard let index = waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return waiters.remove(at: index).continuation
            }
            waiter?.resume(returning: false)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            let now: Bool = lock.withLock {
                if condition(items) { return true }
                waiters.append((id, condition, continuation))
                return false
            }
            if now { continuation.resume(returning: true) }
        }
    }
}
