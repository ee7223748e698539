import VigilKit

/// A ``WakeTimer`` that waits with `VigilClock.sleep(until:)`: with a
/// ``ManualClock``, tests of hours of scheduling run in milliseconds. The
/// host's wake scheduler takes it in place of its timerfd timer
/// (`WakeScheduler(clock:timer:)`).
///
/// Each arming starts one task that sleeps until the deadline; re-arming
/// cancels it and starts another.
public final class ClockDrivenWakeTimer: WakeTimer {
    private struct State {
        var handler: (@Sendable () async -> Void)?
        var sleeper: Task<Void, Never>?
        var generation: UInt64 = 0
        var deadline: VigilInstant?
        var armings = 0
        var deliveries = 0
    }

    private let state = Lock(State())
    private let clock: any VigilClock

    public let clockName: String

    public init(clock: any VigilClock, clockName: String = "test") {
        self.clock = clock
        self.clockName = clockName
    }

    /// The deadline the timer is armed for, if any.
    public var armedDeadline: VigilInstant? { state.withLock { $0.deadline } }

    /// How many times `arm(at:)` was called (disarming included).
    public var armCount: Int { state.withLock { $0.armings } }

    /// True from the moment an expiry is taken until its handler returns.
    /// Tests wait for false before moving a ``ManualClock`` on, because the
    /// handler re-arms the timer.
    public var isDeliveringExpiry: Bool { state.withLock { $0.deliveries > 0 } }

    public func setExpiryHandler(_ handler: @escaping @Sendable () async -> Void) {
        state.withLock { $0.handler = handler }
    }

    public func arm(at deadline: VigilInstant?) {
        let clock = self.clock
        state.withLock { state in
            state.sleeper?.cancel()
            state.sleeper = nil
            state.generation &+= 1
            state.armings += 1
            state.deadline = deadline
            guard let deadline else { return }
            let armedGeneration = state.generation
            // Unstructured task: cancelled when the timer is armed again or invalidated.
            state.sleeper = Task { [weak self] in
                do {
                    try await clock.sleep(until: deadline)
                } catch {
                    return  // re-armed or invalidated
                }
                guard let self, let handler = self.expire(armedGeneration) else { return }
                await handler()
                self.state.withLock { $0.deliveries -= 1 }
            }
        }
    }

    /// Marks the arming `armedGeneration` as expired and returns the handler,
    /// or nil when the timer was re-armed in the meantime (a stale wake).
    private func expire(_ armedGeneration: UInt64) -> (@Sendable () async -> Void)? {
        state.withLock { state in
            guard state.generation == armedGeneration else { return nil }
            state.deadline = nil
            state.sleeper = nil
            guard let handler = state.handler else { return nil }
            state.deliveries += 1
            return handler
        }
    }

    public func invalidate() {
        state.withLock { state in
            state.sleeper?.cancel()
            state.sleeper = nil
            state.generation &+= 1
            state.deadline = nil
            state.handler = nil
        }
    }
}
