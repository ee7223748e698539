import CVigilLoop
import Glibc

/// The host's event loop: one thread waiting in one `epoll_wait(2)` for
/// every descriptor, timer and job of the process (Sources/CVigilLoop).
///
/// In vigild the loop's thread is the main thread and Swift's global
/// executor: a watch's handler, a timer's callback and every task's jobs
/// run there, one at a time. A handler must therefore never block: read
/// what is ready (descriptors are non-blocking), hand longer work to a task,
/// and return. In a process that did not install the loop as its executor
/// (tests, vigilctl, a plugin's own test suite) the loop starts on a thread
/// of its own at its first use.
///
/// A plugin waits on a descriptor the same way the host does:
///
/// ```swift
/// let watch = try EventLoop.watch(fd, for: .readable) { events in
///     // on the loop: read fd until EAGAIN
/// } released: {
///     close(fd)
/// }
/// ...
/// watch.cancel()
/// ```
public enum EventLoop {
    /// What a watch waits for, and what its handler is told.
    public struct Events: OptionSet, Sendable, Hashable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }

        public static let readable = Events(rawValue: UInt32(VIGIL_LOOP_IN))
        public static let writable = Events(rawValue: UInt32(VIGIL_LOOP_OUT))
        /// The other side is gone (reported whether asked for or not).
        public static let hangUp = Events(rawValue: UInt32(VIGIL_LOOP_HUP))
        /// An error is pending on the descriptor (reported whether asked for or not).
        public static let error = Events(rawValue: UInt32(VIGIL_LOOP_ERR))
    }

    /// Watches `fd` (level-triggered) and calls `handler` on the loop each
    /// time it is ready. `released` runs on the loop once the watch is
    /// cancelled and no call of `handler` is under way: close `fd` there.
    /// Throws the `epoll_ctl(2)` error (for example EPERM for a regular
    /// file, which is always ready).
    public static func watch(
        _ fd: Int32,
        for events: Events,
        handler: @escaping @Sendable (Events) -> Void,
        released: (@Sendable () -> Void)? = nil
    ) throws(EventLoopError) -> Watch {
        let box = Unmanaged.passRetained(Watch.Callbacks(handler: handler, released: released))
        let id = vigil_loop_watch(fd, events.rawValue, { context, events in
            guard let context else { return }
            Unmanaged<Watch.Callbacks>.fromOpaque(context).takeUnretainedValue().handler(Events(rawValue: events))
        }, box.toOpaque())
        guard id != 0 else {
            let code = errno
            box.release()
            throw EventLoopError(operation: "watch fd \(fd)", code: code)
        }
        return Watch(id: id)
    }

    /// Runs `body` on the loop, after the work queued before it.
    public static func post(_ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Posted(body: body))
        vigil_loop_post({ context in
            guard let context else { return }
            Unmanaged<Posted>.fromOpaque(context).takeRetainedValue().body()
        }, box.toOpaque())
    }

    /// True on the loop's thread.
    public static var isCurrent: Bool { vigil_loop_is_current() != 0 }

    /// The clock a ``Timer``'s deadline is read on.
    public enum TimerClock: Sendable, Hashable {
        /// `CLOCK_BOOTTIME`: time spent suspended counts.
        case boottime
        /// `CLOCK_MONOTONIC`: stops while the system is suspended (awake time).
        case monotonic

        /// Now on this clock, in nanoseconds.
        public var now: Int64 {
            var ts = timespec()
            clock_gettime(self == .boottime ? CLOCK_BOOTTIME : CLOCK_MONOTONIC, &ts)
            return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
        }

        var awake: Int32 { self == .monotonic ? 1 : 0 }
    }

    /// A callback that runs once on the loop at a deadline: an entry of the
    /// loop's timer heap, which waits on one timerfd per clock with every
    /// other timer of the process (and every `Task.sleep`). For waiting code
    /// that is not a task: a grace period before SIGKILL, a back-off, a
    /// library's timeout. A strategy times its own work through its
    /// context's `clock` and `scheduler` instead, which tests drive.
    ///
    /// ```swift
    /// let timer = try EventLoop.Timer.after(.seconds(5)) {
    ///     // on the loop, once, unless cancelled before
    /// }
    /// ...
    /// timer.cancel()
    /// ```
    ///
    /// Dropping the value does not stop the timer: the loop holds `body`
    /// until it runs or ``cancel()`` removes it.
    public struct Timer: Sendable, Hashable {
        let id: UInt64
        let clock: TimerClock
        /// The `Posted` box's address: the loop holds one reference to it
        /// until the timer runs (which takes it) or `cancel` removes it.
        let context: UInt

        /// Calls `body` on the loop at `deadline` (nanoseconds on `clock`),
        /// at once if it has passed. Throws when the loop cannot be started
        /// (out of memory or descriptors).
        public static func at(
            _ deadline: Int64, on clock: TimerClock = .boottime, _ body: @escaping @Sendable () -> Void
        ) throws(EventLoopError) -> Timer {
            let box = Unmanaged.passRetained(Posted(body: body))
            let id = vigil_timer_schedule(clock.awake, deadline, { context in
                guard let context else { return }
                Unmanaged<Posted>.fromOpaque(context).takeRetainedValue().body()
            }, box.toOpaque())
            guard id != 0 else {
                let code = errno
                box.release()
                throw EventLoopError(operation: "schedule a timer", code: code == 0 ? ENOMEM : code)
            }
            return Timer(id: id, clock: clock, context: UInt(bitPattern: box.toOpaque()))
        }

        /// Calls `body` on the loop once `delay` has passed on `clock`
        /// (a negative delay counts as none).
        public static func after(
            _ delay: Duration, on clock: TimerClock = .boottime, _ body: @escaping @Sendable () -> Void
        ) throws(EventLoopError) -> Timer {
            let parts = delay.components
            let ns = max(0, parts.seconds) &* 1_000_000_000 &+ max(0, parts.attoseconds) / 1_000_000_000
            return try at(clock.now &+ ns, on: clock, body)
        }

        /// Stops the timer from any thread. True if it was removed before it
        /// ran (`body` will never run); false if it ran, is running now, or
        /// was cancelled already.
        @discardableResult
        public func cancel() -> Bool {
            // Removed before it ran: the loop's reference is ours to drop.
            guard vigil_timer_cancel(clock.awake, id) != 0,
                  let context = UnsafeMutableRawPointer(bitPattern: context) else { return false }
            Unmanaged<Posted>.fromOpaque(context).release()
            return true
        }
    }

    private final class Posted: Sendable {
        let body: @Sendable () -> Void
        init(body: @escaping @Sendable () -> Void) { self.body = body }
    }

    /// A descriptor watched on the loop. Cancel it to stop: the watch does
    /// not end when this value is dropped (the loop keeps its handler until
    /// `cancel()`), so that a handler may hold what it needs.
    public struct Watch: Sendable, Hashable {
        let id: UInt64

        final class Callbacks: Sendable {
            let handler: @Sendable (Events) -> Void
            let released: (@Sendable () -> Void)?
            init(handler: @escaping @Sendable (Events) -> Void, released: (@Sendable () -> Void)?) {
                self.handler = handler
                self.released = released
            }
        }

        /// Changes what the watch waits for. False once it is cancelled.
        @discardableResult
        public func change(to events: Events) -> Bool {
            vigil_loop_rewatch(id, events.rawValue) == 0
        }

        /// Stops the watch: its handler is not called once the loop has seen
        /// this, and `released` then runs on the loop. From any thread; a
        /// second call does nothing.
        public func cancel() {
            _ = vigil_loop_unwatch(id) { context in
                guard let context else { return }
                let callbacks = Unmanaged<Callbacks>.fromOpaque(context).takeRetainedValue()
                callbacks.released?()
            }
        }
    }
}

/// A loop call that failed, with the errno it returned.
public struct EventLoopError: Error, Sendable, CustomStringConvertible {
    public var operation: String
    public var code: Int32
    public init(operation: String, code: Int32) {
        self.operation = operation
        self.code = code
    }
    public var description: String { "\(operation): \(String(cString: strerror(code)))" }
}
