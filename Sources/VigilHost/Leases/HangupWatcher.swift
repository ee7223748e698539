import CTimer
import Foundation
import VigilKit

/// Tells when the other side of a pipe is gone: a client lease's fd is the
/// write end of a pipe whose read end the host keeps here, and when every
/// copy of the write end is closed (by the client, or by the kernel when the
/// client dies) the read end reports end-of-file.
///
/// Each read end is one watch on the host's ``EventLoop``: the process's one
/// epoll wakes only for those events (no timeout, no thread of its own), so
/// an idle host makes no wakeups, and a lease's begin and end only add or
/// cancel a watch (`epoll_ctl`).
///
/// A read end is closed only when the loop releases its watch, after which
/// the handler that reads it is never called again: the handler never reads
/// a descriptor number that was closed and reused.
final class HangupWatcher: Sendable {
    // The live watches are in `state`; a token leaves it exactly once, under
    // the lock (by a hang-up, `forget` or `stop`), and whoever removes it
    // cancels the watch, outside the lock. `onHangup` is set in init and
    // never changes.
    private struct State {
        var watches: [UInt64: EventLoop.Watch] = [:]
        var nextToken: UInt64 = 1
        var stopped = false
    }
    private let state = Lock(State())
    private let onHangup: @Sendable (UInt64) -> Void

    /// The most a client's writes into its lease pipe are drained per
    /// event; what is left is reported again (the watch is level-triggered),
    /// so one chatty client cannot hold the loop.
    private static let drainLimit = 64 * 1024

    /// `onHangup` runs on the loop (it must not block) with the token of a
    /// watch whose pipe lost its last writer, once per watch.
    init(onHangup: @escaping @Sendable (UInt64) -> Void) throws {
        self.onHangup = onHangup
    }

    deinit {
        // Unreported, as by `stop`: a watch left live would keep reporting
        // its end-of-file to a handler whose watcher is gone.
        for watch in state.withLock({ $0.watches.values }) { watch.cancel() }
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
        let readEnd = fds[0]
        _ = fcntl(readEnd, F_SETFL, fcntl(readEnd, F_GETFL) | O_NONBLOCK)
        guard let token = state.withLock({ state -> UInt64? in
            guard !state.stopped else { return nil }
            defer { state.nextToken += 1 }
            return state.nextToken
        }) else {
            close(fds[0])
            close(fds[1])
            throw PowerBackendError("cannot watch a lease pipe: the lease fd watcher is stopped")
        }
        // The watch is made outside the lock (the handler takes it on the
        // loop). Until it is in `watches` its handler ignores the pipe; the
        // caller still holds the write end, so no hang-up can be missed.
        let watch: EventLoop.Watch
        do {
            watch = try EventLoop.watch(readEnd, for: .readable) { [weak self] events in
                self?.ready(token, readEnd, events)
            } released: {
                close(readEnd)
            }
        } catch {
            close(fds[0])
            close(fds[1])
            throw PowerBackendError("cannot watch a lease pipe: \(error)")
        }
        let added = state.withLock { state -> Bool in
            guard !state.stopped else { return false }
            state.watches[token] = watch
            return true
        }
        guard added else {
            watch.cancel()
            close(fds[1])
            throw PowerBackendError("cannot watch a lease pipe: the lease fd watcher is stopped")
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
    /// another way); the loop closes the read end once it lets the watch go.
    /// Unknown tokens (already reported) are ignored.
    func forget(_ token: UInt64) {
        state.withLock { $0.watches.removeValue(forKey: token) }?.cancel()
    }

    /// How many pipes are watched.
    var watchedCount: Int { state.withLock { $0.watches.count } }

    /// Stops every watch; the remaining read ends are closed unreported, and
    /// no pipe is made afterwards.
    func stop() {
        let watches = state.withLock { state in
            state.stopped = true
            defer { state.watches = [:] }
            return state.watches.values
        }
        for watch in watches { watch.cancel() }
    }

    /// On the loop, when `fd` (the read end of `token`'s pipe) is ready.
    private func ready(_ token: UInt64, _ fd: Int32, _ events: EventLoop.Events) {
        guard Self.lostWriters(fd, events: events) else { return }
        // Forgotten or stopped meanwhile: not reported.
        guard let watch = state.withLock({ $0.watches.removeValue(forKey: token) }) else { return }
        watch.cancel()
        onHangup(token)
    }

    /// True when the pipe's writers are all gone: hang-up or error, or
    /// end-of-file after draining whatever a client wrote into it.
    private static func lostWriters(_ fd: Int32, events: EventLoop.Events) -> Bool {
        if events.contains(.readable) {
            return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 4096) { buffer in
                var drained = 0
                while drained < Self.drainLimit {
                    let n = read(fd, buffer.baseAddress, buffer.count)
                    if n == 0 { return true }
                    if n < 0 { return errno != EAGAIN && errno != EINTR }
                    drained += n
                }
                // More is waiting: reported again on the loop's next turn.
                return false
            }
        }
        return !events.isDisjoint(with: [.hangUp, .error])
    }
}
