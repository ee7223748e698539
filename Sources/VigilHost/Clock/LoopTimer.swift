import CTimer
import CVigilLoop
import VigilKit

/// A callback on the host's ``EventLoop`` after a delay: a one-shot timer of
/// the loop's timer wheel (`vigil_timer_schedule`), for waiting code that is
/// not a task (a grace period before SIGKILL, a back-off before accepting
/// again). The callback runs on the loop, so it must not block.
struct LoopTimer: Sendable {
    private final class Callback: Sendable {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    private let id: UInt64
    /// The `Callback`'s address: the loop holds one reference to it until
    /// the timer fires or `cancel` removes it.
    private let context: UInt

    /// Calls `body` on the loop once `delay` has passed on CLOCK_BOOTTIME
    /// (suspended time counts). Nil if the loop cannot be started (out of
    /// memory or descriptors).
    static func after(_ delay: Duration, _ body: @escaping @Sendable () -> Void) -> LoopTimer? {
        let parts = delay.components
        let ns = max(0, parts.seconds) * 1_000_000_000 + max(0, parts.attoseconds) / 1_000_000_000
        let deadline = vigil_clock_ns(vigil_CLOCK_BOOTTIME) + ns
        let context = Unmanaged.passRetained(Callback(body)).toOpaque()
        let id = vigil_timer_schedule(0, deadline, { context in
            guard let context else { return }
            Unmanaged<Callback>.fromOpaque(context).takeRetainedValue().body()
        }, context)
        guard id != 0 else {
            Unmanaged<Callback>.fromOpaque(context).release()
            return nil
        }
        return LoopTimer(id: id, context: UInt(bitPattern: context))
    }

    /// Stops the timer if it has not fired; from any thread. A fired or
    /// cancelled timer is left alone.
    func cancel() {
        // Removed before it ran: the loop's reference is ours to drop.
        guard vigil_timer_cancel(0, id) != 0, let context = UnsafeMutableRawPointer(bitPattern: context) else { return }
        Unmanaged<Callback>.fromOpaque(context).release()
    }
}
