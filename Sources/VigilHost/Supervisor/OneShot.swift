import ServiceLifecycle

/// A value set once and awaited by others; a waiter that is cancelled gets
/// nil. vigild's services use it to start in order where one needs another
/// running (the strategies after the sleep cycle, the bus after the
/// strategies), since a `ServiceGroup` starts all its services at once.
public actor OneShot<Value: Sendable> {
    private var value: Value?
    private var waiters: [UInt64: CheckedContinuation<Value?, Never>] = [:]
    private var nextWaiter: UInt64 = 0

    public init() {}

    public func set(_ value: Value) {
        guard self.value == nil else { return }
        self.value = value
        for waiter in waiters.values { waiter.resume(returning: value) }
        waiters = [:]
    }

    /// The value, once set; nil when the waiting task is cancelled first.
    public func wait() async -> Value? {
        if let value { return value }
        let id = nextWaiter
        nextWaiter += 1
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if Task.isCancelled {
                    continuation.resume(returning: nil)
                } else {
                    waiters[id] = continuation
                }
            }
        } onCancel: {
            // Unstructured task: not cancelled: one hop into the actor to withdraw the waiter, from
            // a synchronous cancellation handler.
            Task { await self.cancel(id) }
        }
    }

    private func cancel(_ id: UInt64) {
        waiters.removeValue(forKey: id)?.resume(returning: nil)
    }
}

/// Said once a service has started what others wait for (``OneShot``).
public typealias Started = OneShot<Bool>

extension OneShot where Value == Bool {
    /// Waits until `self` is set, unless the group shuts down (or the task
    /// is cancelled) first: then false, and the waiting service should
    /// start nothing.
    public func waitUnlessShutDown() async -> Bool {
        await cancelWhenGracefulShutdown { await self.wait() } ?? false
    }
}
