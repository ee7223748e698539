import CTimer
import Foundation
import VigilKit

/// A failed timer system call, with the call and the errno it returned.
public struct WakeTimerError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What was attempted, e.g. "timerfd_create(CLOCK_BOOTTIME_ALARM)".
    public var operation: String
    /// The errno value.
    public var code: Int32

    public init(operation: String, code: Int32) {
        self.operation = operation
        self.code = code
    }

    /// Symbolic errno name for the common cases ("EPERM"), else the number.
    public var errnoName: String {
        switch code {
        case EPERM: "EPERM"
        case EINVAL: "EINVAL"
        case EMFILE: "EMFILE"
        case ENFILE: "ENFILE"
        case ENOMEM: "ENOMEM"
        case ENODEV: "ENODEV"
        default: "errno \(code)"
        }
    }

    public var description: String {
        "\(operation) failed: \(errnoName) (\(String(cString: strerror(code))))"
    }
}

/// The real ``WakeTimer``: a non-blocking timerfd armed with an absolute
/// deadline (`TFD_TIMER_ABSTIME`), watched on the host's ``EventLoop`` (one
/// epoll for the whole process), so the process sleeps in the kernel until
/// the deadline: no polling, no thread of its own and no wakeups besides the
/// armed ones.
///
/// `CLOCK_BOOTTIME` and `CLOCK_BOOTTIME_ALARM` share the `VigilInstant`
/// timeline (boottime nanoseconds), so deadlines need no conversion.
public final class TimerFDWakeTimer: WakeTimer, @unchecked Sendable {
    // Invariant: `handler` and `closed` are in `state`; `watch` is set in
    // init and only cancelled afterwards (from any thread); `fd` stays open
    // until the loop releases the watch and `released` closes it, and `arm`
    // checks `closed` under the lock before touching `fd`.
    private struct State {
        var handler: (@Sendable () async -> Void)?
        var closed = false
    }
    private let state = Lock(State())
    private let fd: Int32
    private var watch: EventLoop.Watch?

    public let clockName: String

    /// Creates a timerfd on `CLOCK_BOOTTIME`.
    public convenience init() throws(WakeTimerError) {
        try self.init(clockID: vigil_CLOCK_BOOTTIME, clockName: "CLOCK_BOOTTIME")
    }

    /// Creates a timerfd on `clockID` (a `CLOCK_*` id from CTimer).
    public convenience init(clockID: Int32, clockName: String) throws(WakeTimerError) {
        let fd = vigil_timerfd_create(clockID, vigil_TFD_CLOEXEC | vigil_TFD_NONBLOCK)
        guard fd >= 0 else { throw WakeTimerError(operation: "timerfd_create(\(clockName))", code: errno) }
        try self.init(adopting: fd, clockName: clockName)
    }

    /// Takes ownership of an open, non-blocking timerfd (closed on failure).
    public init(adopting fd: Int32, clockName: String) throws(WakeTimerError) {
        self.fd = fd
        self.clockName = clockName
        do {
            // Weak: the loop keeps the handler until the watch is cancelled,
            // which deinit does.
            watch = try EventLoop.watch(fd, for: .readable) { [weak self] _ in
                self?.readExpiry()
            } released: {
                close(fd)
            }
        } catch {
            close(fd)
            throw WakeTimerError(operation: "watch timerfd(\(clockName))", code: error.code)
        }
    }

    deinit {
        watch?.cancel()
    }

    /// Runs on the loop when the fd is readable; never blocks (the fd is
    /// non-blocking and one read drains it).
    private func readExpiry() {
        // EAGAIN means the timer was re-armed (which resets the count)
        // between becoming readable and this read: not an expiry.
        guard vigil_timerfd_read(fd) > 0 else { return }
        guard let handler = state.withLock({ $0.closed ? nil : $0.handler }) else { return }
        // Hop into Swift concurrency; the handler hops into the scheduler
        // actor, and the loop returns to its epoll at once. At high priority
        // so that, where the executor has a pool, a wake is served ahead of
        // default-priority work, and the requesters it resumes go on there too.
        // Unstructured task: not cancelled: delivers one expiry to the handler (the scheduler),
        // from the loop into Swift concurrency.
        Task(priority: .high) { await handler() }
    }

    public func setExpiryHandler(_ handler: @escaping @Sendable () async -> Void) {
        state.withLock { $0.handler = handler }
    }

    public func arm(at deadline: VigilInstant?) {
        state.withLock { state in
            guard !state.closed else { return }
            // A boottime deadline is never 0 on a running system, and 0 means
            // "disarm" to the shim; clamp so a deadline of 0 still fires.
            let ns = deadline.map { max($0.nanoseconds, 1) } ?? 0
            // timerfd_settime fails only for a bad fd or a negative time, both
            // excluded here, so the result carries no information.
            _ = vigil_timerfd_arm_abs(fd, ns)
        }
    }

    public func invalidate() {
        let wasOpen = state.withLock { state in
            defer { state.closed = true; state.handler = nil }
            return !state.closed
        }
        if wasOpen {
            watch?.cancel()
        }
    }
}
