import Foundation
import VigilKit

/// The thing the ``WakeScheduler`` waits on: a one-shot timer that can be
/// re-armed to a new absolute deadline on the host's `CLOCK_BOOTTIME` timeline.
///
/// The real one is ``TimerFDWakeTimer`` (a timerfd woken through epoll); tests
/// use ``ClockDrivenWakeTimer`` on a `ManualClock`.
///
/// Contract:
/// - `arm(at:)` replaces any earlier arming; `arm(at: nil)` disarms.
/// - After the armed deadline passes, the handler is called (once per
///   expiry). A handler call may still arrive for an arming that has just been
///   replaced; the scheduler tolerates such stale calls by looking at its
///   clock, so timers need not guarantee their absence.
public protocol WakeTimer: Sendable {
    /// The clock this timer runs on, for reports ("CLOCK_BOOTTIME", "test", ...).
    var clockName: String { get }
    /// Installs the function called when the timer expires. The scheduler
    /// installs it once, before arming.
    func setExpiryHandler(_ handler: @escaping @Sendable () async -> Void)
    /// Arms the timer to expire once at `deadline`, or disarms it (`nil`).
    func arm(at deadline: VigilInstant?)
    /// Stops the timer for good and releases what it holds.
    func invalidate()
}

/// A ``WakeTimer`` that waits with `VigilClock.sleep(until:)`: with a
/// `ManualClock`, tests of hours of scheduling run in milliseconds.
///
/// Each arming starts one task that sleeps until the deadline; re-arming
/// cancels it and starts another.
public final class ClockDrivenWakeTimer: WakeTimer, @unchecked Sendable {
    // Invariant: every `var` below is read and written only while holding `lock`.
    private let lock = NSLock()
    private let clock: any VigilClock
    private var handler: (@Sendable () async -> Void)?
    private var sleeper: Task<Void, Never>?
    private var generation: UInt64 = 0
    private var deadline: VigilInstant?
    private var armings = 0
    private var deliveries = 0

    public let clockName: String

    public init(clock: any VigilClock, clockName: String = "test") {
        self.clock = clock
        self.clockName = clockName
    }

    /// The deadline the timer is armed for, if any.
    public var armedDeadline: VigilInstant? { lock.withLock { deadline } }

    /// How many times `arm(at:)` was called (disarming included).
    public var armCount: Int { lock.withLock { armings } }

    /// True from the moment an expiry is taken until its handler returns.
    /// Tests wait for false before moving a `ManualClock` on, because the
    /// handler re-arms the timer.
    public var isDeliveringExpiry: Bool { lock.withLock { deliveries > 0 } }

    public func setExpiryHandler(_ handler: @escaping @Sendable () async -> Void) {
        lock.withLock { self.handler = handler }
    }

    public func arm(at deadline: VigilInstant?) {
        lock.withLock {
            sleeper?.cancel()
            sleeper = nil
            generation &+= 1
            armings += 1
            self.deadline = deadline
            guard let deadline else { return }
            let armedGeneration = generation
            let clock = self.clock
            sleeper = Task { [weak self] in
                do {
                    try await clock.sleep(until: deadline)
                } catch {
                    return  // re-armed or invalidated
                }
                guard let self, let handler = self.expire(armedGeneration) else { return }
                await handler()
                self.lock.withLock { self.deliveries -= 1 }
            }
        }
    }

    /// Marks the arming `armedGeneration` as expired and returns the handler,
    /// or nil when the timer was re-armed in the meantime (a stale wake).
    private func expire(_ armedGeneration: UInt64) -> (@Sendable () async -> Void)? {
        lock.withLock {
            guard generation == armedGeneration else { return nil }
            deadline = nil
            sleeper = nil
            guard let handler else { return nil }
            deliveries += 1
            return handler
        }
    }

    public func invalidate() {
        lock.withLock {
            sleeper?.cancel()
            sleeper = nil
            generation &+= 1
            deadline = nil
            handler = nil
        }
    }
}
