import CFDWatch
import CTimer
import Foundation
import VigilKit

/// Tells when the other side of a pipe is gone: a client lease's fd is the
/// write end of a pipe whose read end the host keeps here, and when every
/// copy of the write end is closed (by the client, or by the kernel when the
/// client dies) the read end reports end-of-file.
///
/// One thread blocked in `epoll_wait(2)` watches every read end, started
/// with the first watch; it wakes only for those events (no timeout), so an
/// idle host makes no wakeups. Adding and dropping a watch changes the epoll
/// set from the caller's thread (`epoll_ctl` is safe against a concurrent
/// wait), so a lease's begin and end never wake the thread: with `poll(2)`
/// each did, and each rebuilt the whole set.
///
/// A read end is closed, and leaves the set, under `state`'s lock; the
/// thread looks up and reads an fd only under that lock too, so it never
/// reads a descriptor number that was closed and reused.
final class HangupWatcher: Sendable {
    // A watched read end is read, removed from the epoll set or closed only
    // with `state`'s lock held. `epoll`, `wakeRead`, `wakeWrite` and
    // `onHangup` are set in init and never change (the descriptors are
    // closed only in deinit, after the thread, which holds the watcher, has
    // returned).
    private struct State {
        var watches: [UInt64: Int32] = [:]
        var nextToken: UInt64 = 1
        var started = false
        var stopping = false
    }
    private let state = Lock(State())
    private let epoll: Int32
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let onHangup: @Sendable (UInt64) -> Void

    /// The epoll data of the wake pipe; watches have tokens from 1.
    private static let wakeToken: UInt64 = 0
    /// The most a client's writes into its lease pipe are drained per
    /// event; what is left is reported again (the set is level-triggered).
    private static let drainLimit = 64 * 1024

    /// `onHangup` runs on the watcher thread with the token of a watch whose
    /// pipe lost its last writer, once per watch.
    init(onHangup: @escaping @Sendable (UInt64) -> Void) throws {
        let epoll = vigil_fdwatch_create()
        guard epoll >= 0 else {
            throw PowerBackendError("cannot create the lease fd watcher's epoll set: \(String(cString: strerror(errno)))")
        }
        var fds: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&fds) == 0 else {
            let message = String(cString: strerror(errno))
            close(epoll)
            throw PowerBackendError("cannot create the lease fd watcher's wake pipe: \(message)")
        }
        self.epoll = epoll
        wakeRead = fds[0]
        wakeWrite = fds[1]
        self.onHangup = onHangup
        _ = fcntl(wakeRead, F_SETFL, fcntl(wakeRead, F_GETFL) | O_NONBLOCK)
        _ = fcntl(wakeWrite, F_SETFL, fcntl(wakeWrite, F_GETFL) | O_NONBLOCK)
        guard Self.add(wakeRead, token: Self.wakeToken, to: epoll) == 0 else {
            let message = String(cString: strerror(errno))
            close(epoll)
            close(wakeRead)
            close(wakeWrite)
            throw PowerBackendError("cannot watch the lease fd watcher's wake pipe: \(message)")
        }
    }

    deinit {
        close(epoll)
        close(wakeRead)
        close(wakeWrite)
    }

    /// Makes a pipe and watches its read end. Returns a token naming the
    /// watch and the write end, which is the caller's: hand it out, then
    /// close the local copy.
    func makeWatchedPipe() throws -> (token: UInt64, writeEnd: Int32) {
        var fds: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&fds) == 0 else { throw Self.failure("cannot create a lease pipe", errno) }
        // The reply that hands the write end out needs one descriptor more
        // (libdbus dups it): make sure there is one, so running out is
        // reported here, with the limit named, rather than as a reply that
        // cannot be built.
        let spare = fcntl(fds[1], F_DUPFD_CLOEXEC, 3)
        guard spare >= 0 else {
            let code = errno
            close(fds[0])
            close(fds[1])
            throw Self.failure("cannot pass a lease pipe", code)
        }
        close(spare)
        _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
        let (token, startThread, failure) = state.withLock { state -> (UInt64, Bool, String?) in
            let token = state.nextToken
            guard Self.add(fds[0], token: token, to: epoll) == 0 else {
                return (0, false, String(cString: strerror(errno)))
            }
            state.nextToken += 1
            state.watches[token] = fds[0]
            defer { state.started = true }
            return (token, !state.started, nil)
        }
        if let failure {
            close(fds[0])
            close(fds[1])
            throw PowerBackendError("cannot watch a lease pipe: \(failure)")
        }
        if startThread {
            let thread = Thread { [self] in loop() }
            thread.name = "vigil-lease-fds"
            thread.start()
        }
        return (token, fds[1])
    }

    /// The error for a descriptor call that failed with `code`: one that
    /// names the open-file limit when descriptors ran out.
    private static func failure(_ doing: String, _ code: Int32) -> any Error {
        if DescriptorLimit.isExhaustion(code) { return DescriptorsExhausted(doing: doing, code: code) }
        return PowerBackendError("\(doing): \(String(cString: strerror(code)))")
    }

    /// Stops a watch without its hang-up being reported (the lease ended
    /// another way) and closes the read end. Unknown tokens (already
    /// reported) are ignored.
    func forget(_ token: UInt64) {
        state.withLock { state in
            guard let fd = state.watches.removeValue(forKey: token) else { return }
            unwatch(fd)
        }
    }

    /// How many pipes are watched.
    var watchedCount: Int { state.withLock { $0.watches.count } }

    /// Ends the thread; the remaining read ends are closed unreported.
    func stop() {
        state.withLock { $0.stopping = true }
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    private static func add(_ fd: Int32, token: UInt64, to epoll: Int32) -> Int32 {
        vigil_fdwatch_add(epoll, fd, token, UInt32(VIGIL_FDWATCH_IN))
    }

    /// Takes `fd` out of the set and closes it. `state`'s lock held.
    private func unwatch(_ fd: Int32) {
        _ = vigil_fdwatch_remove(epoll, fd)
        close(fd)
    }

    private func loop() {
        var tokens = [UInt64](repeating: 0, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        while true {
            let ready = vigil_fdwatch_wait(epoll, &tokens, &events, Int32(tokens.count), -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            var hungUp: [UInt64] = []
            let stop = state.withLock { state -> Bool in
                for (token, event) in zip(tokens, events).prefix(Int(ready)) {
                    if token == Self.wakeToken {
                        drainWakePipe()
                        continue
                    }
                    // Forgotten since epoll_wait returned: already closed.
                    guard let fd = state.watches[token], lostWriters(fd, events: event) else { continue }
                    state.watches[token] = nil
                    unwatch(fd)
                    hungUp.append(token)
                }
                guard state.stopping else { return false }
                for fd in state.watches.values { unwatch(fd) }
                state.watches = [:]
                return true
            }
            if stop { return }
            for token in hungUp { onHangup(token) }
        }
    }

    /// True when the pipe's writers are all gone: hang-up or error, or
    /// end-of-file after draining whatever a client wrote into it. `state`'s lock held.
    private func lostWriters(_ fd: Int32, events: UInt32) -> Bool {
        if events & UInt32(VIGIL_FDWATCH_IN) != 0 {
            var buffer = [UInt8](repeating: 0, count: 4096)
            var drained = 0
            while drained < Self.drainLimit {
                let n = read(fd, &buffer, buffer.count)
                if n == 0 { return true }
                if n < 0 { return errno != EAGAIN && errno != EINTR }
                drained += n
            }
            // More is waiting: reported again by the next epoll_wait.
            return false
        }
        return events & UInt32(VIGIL_FDWATCH_HUP | VIGIL_FDWATCH_ERR) != 0
    }

    private func drainWakePipe() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(wakeRead, &buffer, buffer.count) > 0 {}
    }
}
