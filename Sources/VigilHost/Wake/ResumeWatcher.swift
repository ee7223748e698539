import CTimer
import Foundation
import VigilKit

/// Tells the host, as it happens, that the system has resumed from suspend.
///
/// The kernel treats a resume like a change of the wall clock: a
/// `CLOCK_REALTIME` timerfd armed with `TFD_TIMER_CANCEL_ON_SET` (here for a
/// date centuries away, so it never simply expires) becomes readable and its
/// read fails with `ECANCELED`. Setting the clock does the same, so each such
/// wake compares `CLOCK_BOOTTIME − CLOCK_MONOTONIC` with the last value: it
/// grows only across a suspend, by exactly the time slept. The timerfd is
/// watched on the host's ``EventLoop``: the process sleeps in its epoll in
/// between, with no polling and no thread of its own.
public final class ResumeWatcher: @unchecked Sendable {
    // Invariant: the mutable state is in `state`; `watch` is set in init,
    // before `self` is shared, and only cancelled afterwards (from any
    // thread); `fd` stays open until the loop releases the watch and
    // `released` closes it.
    private struct State {
        var lastOffsetMicros: Int64
        var handler: (@Sendable (_ resume: ClockReadings, _ suspendedMicros: Int64) async -> Void)?
        var closed = false
    }
    private let state: Lock<State>
    /// The timerfd (internal for the tests, which wake it).
    let fd: Int32
    private var watch: EventLoop.Watch?
    private let readings: @Sendable () -> ClockReadings

    /// Creates the timerfd; `handler` is called once per resume with the clock
    /// readings just after it and the time suspended.
    public init(
        readings: @escaping @Sendable () -> ClockReadings = { ClockReadings.now() },
        handler: @escaping @Sendable (_ resume: ClockReadings, _ suspendedMicros: Int64) async -> Void
    ) throws(WakeTimerError) {
        let fd = vigil_timerfd_create(vigil_CLOCK_REALTIME, vigil_TFD_CLOEXEC | vigil_TFD_NONBLOCK)
        guard fd >= 0 else { throw WakeTimerError(operation: "timerfd_create(CLOCK_REALTIME)", code: errno) }
        guard Self.arm(fd) == 0 else {
            let code = errno
            close(fd)
            throw WakeTimerError(operation: "timerfd_settime(TFD_TIMER_CANCEL_ON_SET)", code: code)
        }
        self.fd = fd
        self.readings = readings
        let now = readings()
        state = Lock(State(lastOffsetMicros: now.boottimeMicros - now.monotonicMicros, handler: handler))
        do {
            // Weak: the loop keeps the handler until the watch is cancelled,
            // which deinit does.
            watch = try EventLoop.watch(fd, for: .readable) { [weak self] _ in
                self?.clockChanged()
            } released: {
                close(fd)
            }
        } catch {
            close(fd)
            throw WakeTimerError(operation: "watch timerfd(CLOCK_REALTIME)", code: error.code)
        }
    }

    deinit { invalidate() }

    /// A date far beyond any wall clock (about the year 2200).
    private static func arm(_ fd: Int32) -> Int32 {
        vigil_timerfd_arm_cancel_on_set(fd, 7_258_118_400 * 1_000_000_000)
    }

    /// Runs on the loop when the fd is readable; never blocks (the fd is
    /// non-blocking).
    private func clockChanged() {
        // ECANCELED (clock set or resume) is the event; re-arm for the next.
        _ = vigil_timerfd_read(fd)
        _ = Self.arm(fd)
        let now = readings()
        let offset = now.boottimeMicros - now.monotonicMicros
        let pending: (call: @Sendable (ClockReadings, Int64) async -> Void, slept: Int64)? = state.withLock { state in
            guard !state.closed else { return nil }
            let slept = offset - state.lastOffsetMicros
            state.lastOffsetMicros = offset
            // Below the gap rule's threshold it is reading noise (a clock set).
            guard slept > GapRule.suspendThresholdMicros, let handler = state.handler else { return nil }
            return (handler, slept)
        }
        guard let pending else { return }
        // Unstructured task: not cancelled: delivers one resume to the handler, from the loop
        // into Swift concurrency.
        Task { await pending.call(now, pending.slept) }
    }

    /// Stops watching and closes the timerfd.
    public func invalidate() {
        let wasOpen = state.withLock { state in
            defer { state.closed = true; state.handler = nil }
            return !state.closed
        }
        if wasOpen { watch?.cancel() }
    }
}
