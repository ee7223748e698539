import CConditions
import CTimer
import Foundation
import Synchronization
import VigilKit

/// A few descriptors watched on the host's ``EventLoop``, calling
/// `readable` (on the loop: it must not block) with each one that is ready.
/// No timeout: while nothing happens on its descriptors nothing wakes (the
/// host's idle cost stays as it is), and no thread is its own.
///
/// `onLoop: false` keeps the old shape, a thread of its own blocked in
/// `poll`, for a watcher whose `prepare` and `readable` must run on a thread
/// that entered a test's network namespace (a namespace is per thread, and
/// the loop's must not change).
final class PollThread: Sendable {
    // `readable` is fixed at init. On the loop, `watches` holds the watches
    // until the first `stop()` takes them; with a thread, `stopWriter` is
    // written once by the first `stop()` (`stopped` says which), then the
    // thread exits and signals `done`. The polled descriptors belong to the
    // caller, who closes them after `stop()`.
    private let stopFD: Int32
    private let stopWriter: Int32
    private let readable: @Sendable (Int32) -> Void
    private let done = DispatchSemaphore(value: 0)
    private let stopped = Lock(false)
    private let watches = Lock<[EventLoop.Watch]>([])
    private let wakes = WakeCount()

    /// How many times a descriptor was found ready and `readable` called:
    /// what this watcher costs the process in wakeups (tests check an idle
    /// one makes none).
    var wakeups: Int { wakes.value.load(ordering: .relaxed) }

    /// Runs `prepare` (opening the descriptors to watch, and reading the
    /// first state) on the caller's thread, or with `onLoop: false` starts
    /// the thread, which runs it first (a test's network namespace is
    /// entered there), then waits. Throws what `prepare` failed with.
    init(
        name: String, onLoop: Bool = true, prepare: @escaping @Sendable () -> Result<[Int32], ConditionWatchError>,
        readable: @escaping @Sendable (Int32) -> Void
    ) throws(ConditionWatchError) {
        let wakes = self.wakes
        let readable: @Sendable (Int32) -> Void = { fd in
            wakes.value.wrappingAdd(1, ordering: .relaxed)
            readable(fd)
        }
        self.readable = readable
        if onLoop {
            stopFD = -1
            stopWriter = -1
            let fds = try prepare().get()
            var made: [EventLoop.Watch] = []
            for fd in fds {
                do {
                    made.append(try EventLoop.watch(fd, for: .readable) { _ in readable(fd) })
                } catch {
                    for watch in made { watch.cancel() }
                    throw ConditionWatchError("watch", error.code)
                }
            }
            watches.withLock { $0 = made }
            return
        }
        var pipeFDs: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&pipeFDs) == 0 else { throw ConditionWatchError("pipe", errno) }
        let stopFD = pipeFDs[0]
        self.stopFD = stopFD
        self.stopWriter = pipeFDs[1]
        let ready = DispatchSemaphore(value: 0)
        let prepared = Lock<Result<[Int32], ConditionWatchError>?>(nil)
        let thread = Thread { [self] in
            // Foundation does not name the kernel thread on Linux; the
            // benchmark and `top -H` find the watchers by this name.
            vigil_name_thread(name)
            let result = prepare()
            prepared.withLock { $0 = result }
            ready.signal()
            if case .success(let fds) = result { self.loop(fds) } else { self.done.signal() }
        }
        thread.name = name
        thread.start()
        ready.wait()
        if case .failure(let error)? = prepared.withLock({ $0 }) {
            close(stopFD)
            close(stopWriter)
            stopped.withLock { $0 = true }
            throw error
        }
    }

    private func loop(_ fds: [Int32]) {
        var polled = (fds + [stopFD]).map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        while true {
            let n = poll(&polled, nfds_t(polled.count), -1)
            if n < 0 {
                if errno == EINTR { continue }
                break
            }
            if polled[polled.count - 1].revents != 0 { break }
            for i in 0..<(polled.count - 1) where polled[i].revents != 0 {
                readable(polled[i].fd)
                polled[i].revents = 0
            }
        }
        done.signal()
    }

    /// Stops watching; once it returns `readable` is not called again, so
    /// the caller may close the descriptors. Idempotent.
    func stop() {
        let first = stopped.withLock { stopped -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        guard stopFD >= 0 else {
            let taken = watches.withLock { watches in
                defer { watches = [] }
                return watches
            }
            // On the loop no handler is under way, and a cancelled watch's
            // is not called again. Elsewhere one may be: wait until the loop
            // released every watch (it never waits for this thread).
            if EventLoop.isCurrent {
                for watch in taken { watch.cancel() }
                return
            }
            let released = DispatchSemaphore(value: 0)
            for watch in taken {
                EventLoop.post { watch.cancel() }
            }
            EventLoop.post { released.signal() }
            released.wait()
            return
        }
        var one: UInt8 = 1
        _ = write(stopWriter, &one, 1)
        done.wait()
        close(stopFD)
        close(stopWriter)
    }
}

/// A ``PollThread``'s count of wakeups, shared with its handler: a
/// counter, so an atomic (as `StrategyErrors`'), not a lock.
private final class WakeCount: Sendable {
    let value = Atomic<Int>(0)
}

/// A watch that could not be set up: what failed and the system's reason.
public struct ConditionWatchError: Error, Sendable, CustomStringConvertible {
    public var description: String

    init(_ what: String, _ code: Int32) {
        description = "\(what): \(String(cString: strerror(code)))"
    }

    init(message: String) {
        description = message
    }
}

/// Reads everything queued on a non-blocking descriptor, returning each
/// datagram (netlink) or chunk (inotify).
func drain(_ fd: Int32, _ each: (UnsafeRawBufferPointer) -> Void = { _ in }) {
    var buffer = [UInt8](repeating: 0, count: 16 * 1024)
    while true {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n < 0 && errno == ENOTSOCK {
            // inotify: not a socket.
            let m = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if m <= 0 { return }
            buffer.withUnsafeBytes { each(UnsafeRawBufferPointer(rebasing: $0[0..<m])) }
            continue
        }
        if n < 0 && errno == EINTR { continue }
        // ENOBUFS: the kernel dropped messages; the caller re-reads the state anyway.
        if n < 0 && errno == ENOBUFS { continue }
        if n <= 0 { return }
        buffer.withUnsafeBytes { each(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }
}
