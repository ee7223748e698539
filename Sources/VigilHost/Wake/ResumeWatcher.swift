import CTimer
import Dispatch
import Foundation
import VigilKit

/// Tells the host, as it happens, that the system has resumed from suspend.
///
/// The kernel treats a resume like a change of the wall clock: a
/// `CLOCK_REALTIME` timerfd armed with `TFD_TIMER_CANCEL_ON_SET` (here for a
/// date centuries away, so it never simply expires) becomes readable and its
/// read fails with `ECANCELED`. Setting the clock does the same, so each such
/// wake compares `CLOCK_BOOTTIME − CLOCK_MONOTONIC` with the last value: it
/// grows only across a suspend, by exactly the time slept. The process sleeps
/// in epoll in between: no polling.
public final class ResumeWatcher: @unchecked Sendable {
    // Invariant: the mutable state is in `state`; `source` (a dispatch
    // source, safe to cancel from any thread but not marked Sendable) is set
    // in init and only cancelled afterwards; `fd` stays open until `source`
    // is cancelled and its cancel handler closes it.
    private struct State {
        var lastOffsetMicros: Int64
        var handler: (@Sendable (_ resume: ClockReadings, _ suspendedMicros: Int64) async -> Void)?
        var closed = false
    }
    private let state: Lock<State>
    private let fd: Int32
    private let source: any DispatchSourceRead
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
        source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: DispatchQueue(label: "vigil.resume-watcher"))
        source.setEventHandler { [weak self] in self?.clockChanged() }
        source.setCancelHandler { close(fd) }
        source.resume()
    }

    deinit { invalidate() }

    /// A date far beyond any wall clock (about the year 2200).
    private static func arm(_ fd: Int32) -> Int32 {
        vigil_timerfd_arm_cancel_on_set(fd, 7_258_118_400 * 1_000_000_000)
    }

    /// Runs on the source's queue when the fd is readable.
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
        // Unstructured task: not cancelled: delivers one resume to the handler, from the dispatch
        // source's queue into Swift concurrency.
        Task { await pending.call(now, pending.slept) }
    }

    /// Stops watching and closes the timerfd.
    public func invalidate() {
        let wasOpen = state.withLock { state in
            defer { state.closed = true; state.handler = nil }
            return !state.closed
        }
        if wasOpen { source.cancel() }
    }
}
