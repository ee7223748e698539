import CTimer
import Dispatch
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
/// deadline (`TFD_TIMER_ABSTIME`), watched by a `DispatchSource` read source
/// (epoll inside), so the process sleeps in the kernel until the deadline:
/// no polling and no wakeups besides the armed ones.
///
/// `CLOCK_BOOTTIME` and `CLOCK_BOOTTIME_ALARM` share the `VigilInstant`
/// timeline (boottime nanoseconds), so deadlines need no conversion.
public final class TimerFDWakeTimer: WakeTimer, @unchecked Sendable {
    // Invariant: `handler` and `closed` are in `state`; `source` (a dispatch
    // source, safe to cancel from any thread but not marked Sendable) is set
    // in init and only cancelled afterwards; `fd` stays open until `source`
    // is cancelled and its cancel handler closes it, and `arm` checks
    // `closed` under the lock before touching `fd`.
    private struct State {
        var handler: (@Sendable () async -> Void)?
        var closed = false
    }
    private let state = Lock(State())
    private let fd: Int32
    private let source: any DispatchSourceRead

    public let clockName: String

    /// Creates a timerfd on `CLOCK_BOOTTIME`.
    public convenience init() throws(WakeTimerError) {
        try self.init(clockID: vigil_CLOCK_BOOTTIME, clockName: "CLOCK_BOOTTIME")
    }

    /// Creates a timerfd on `clockID` (a `CLOCK_*` id from CTimer).
    public convenience init(clockID: Int32, clockName: String) throws(WakeTimerError) {
        let fd = vigil_timerfd_create(clockID, vigil_TFD_CLOEXEC | vigil_TFD_NONBLOCK)
        guard fd >= 0 else { throw WakeTimerError(operation: "timerfd_create(\(clockName))", code: errno) }
        self.init(adopting: fd, clockName: clockName)
    }

    /// Takes ownership of an open, non-blocking timerfd.
    public init(adopting fd: Int32, clockName: String) {
        self.fd = fd
        self.clockName = clockName
        let queue = DispatchQueue(label: "vigil.wake.timerfd.\(clockName)")
        source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { [weak self] in self?.readExpiry() }
        source.setCancelHandler { close(fd) }
        source.resume()
    }

    deinit {
        source.cancel()
    }

    /// Runs on the source's queue when the fd is readable.
    private func readExpiry() {
        // EAGAIN means the timer was re-armed (which resets the count)
        // between becoming readable and this read: not an expiry.
        guard vigil_timerfd_read(fd) > 0 else { return }
        guard let handler = state.withLock({ $0.closed ? nil : $0.handler }) else { return }
        // Hop into Swift concurrency; the handler hops into the scheduler
        // actor. At high priority: Swift's pool keeps a set of threads per
        // priority, so a wake is delivered even while every thread of the
        // default priority is busy or blocked (a plugin's slow work, a long
        // reply being built), and the requesters it resumes at high priority
        // go on there too.
        // Unstructured task: not cancelled: delivers one expiry to the handler (the scheduler),
        // from the dispatch source's queue into Swift concurrency.
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
            source.cancel()
        }
    }
}
