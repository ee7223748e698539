import CTimer
import Foundation

/// Tells when the other side of a pipe is gone: a client lease's fd is the
/// write end of a pipe whose read end the host keeps here, and when every
/// copy of the write end is closed (by the client, or by the kernel when the
/// client dies) the read end reports end-of-file.
///
/// One thread blocked in `poll(2)` watches every read end, started with the
/// first watch; it wakes only for those events (no timeout), so an idle host
/// makes no wakeups. The thread alone closes watched descriptors, after its
/// `poll` returned, so a descriptor number is never reused while polled.
final class HangupWatcher: @unchecked Sendable {
    // Invariant: `watches`, `byFD`, `nextToken`, `toClose`, `started` and
    // `stopping` are read and written only with `lock` held; `wakeRead`,
    // `wakeWrite` and `onHangup` are set in init and never change (the wake
    // pipe is closed only in deinit).
    private let lock = NSLock()
    private var watches: [UInt64: Int32] = [:]
    private var byFD: [Int32: UInt64] = [:]
    private var nextToken: UInt64 = 1
    private var toClose: [Int32] = []
    private var started = false
    private var stopping = false
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let onHangup: @Sendable (UInt64) -> Void

    /// `onHangup` runs on the watcher thread with the token of a watch whose
    /// pipe lost its last writer, once per watch.
    init(onHangup: @escaping @Sendable (UInt64) -> Void) throws {
        var fds: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&fds) == 0 else {
            throw PowerBackendError("cannot create the lease fd watcher's wake pipe: \(String(cString: strerror(errno)))")
        }
        wakeRead = fds[0]
        wakeWrite = fds[1]
        self.onHangup = onHangup
        _ = fcntl(wakeRead, F_SETFL, fcntl(wakeRead, F_GETFL) | O_NONBLOCK)
        _ = fcntl(wakeWrite, F_SETFL, fcntl(wakeWrite, F_GETFL) | O_NONBLOCK)
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }

    /// Makes a pipe and watches its read end. Returns a token naming the
    /// watch and the write end, which is the caller's: hand it out, then
    /// close the local copy.
    func makeWatchedPipe() throws -> (token: UInt64, writeEnd: Int32) {
        var fds: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&fds) == 0 else {
            throw PowerBackendError("cannot create a lease pipe: \(String(cString: strerror(errno)))")
        }
        _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
        let (token, startThread) = lock.withLock { () -> (UInt64, Bool) in
            let token = nextToken
            nextToken += 1
            watches[token] = fds[0]
            byFD[fds[0]] = token
            defer { started = true }
            return (token, !started)
        }
        if startThread {
            let thread = Thread { [self] in loop() }
            thread.name = "vigil-lease-fds"
            thread.start()
        } else {
            wake()
        }
        return (token, fds[1])
    }

    /// Stops a watch without its hang-up being reported (the lease ended
    /// another way); the watcher thread closes the read end. Unknown tokens
    /// (already reported) are ignored.
    func forget(_ token: UInt64) {
        let known = lock.withLock { () -> Bool in
            guard let fd = watches.removeValue(forKey: token) else { return false }
            byFD[fd] = nil
            toClose.append(fd)
            return true
        }
        if known { wake() }
    }

    /// How many pipes are watched.
    var watchedCount: Int { lock.withLock { watches.count } }

    /// Ends the thread; the remaining read ends are closed unreported.
    func stop() {
        lock.withLock { stopping = true }
        wake()
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    private func loop() {
        while true {
            let (watched, closing, stop) = lock.withLock { () -> ([Int32], [Int32], Bool) in
                defer { toClose = [] }
                return (Array(byFD.keys), toClose, stopping)
            }
            for fd in closing { close(fd) }
            if stop {
                let rest = lock.withLock { () -> [Int32] in
                    defer { watches = [:]; byFD = [:] }
                    return Array(byFD.keys)
                }
                for fd in rest { close(fd) }
                return
            }
            var fds = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            fds += watched.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            let ready = poll(&fds, nfds_t(fds.count), -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if fds[0].revents != 0 { drain(wakeRead) }
            for entry in fds.dropFirst() where entry.revents != 0 && hungUp(entry) {
                report(entry.fd)
            }
        }
    }

    /// True when the pipe's writers are all gone: POLLHUP/POLLERR, or
    /// end-of-file after draining whatever a client wrote into it.
    private func hungUp(_ entry: pollfd) -> Bool {
        if entry.revents & Int16(POLLIN) != 0 {
            var buffer = [UInt8](repeating: 0, count: 256)
            while true {
                let n = read(entry.fd, &buffer, buffer.count)
                if n == 0 { return true }
                if n < 0 { return errno != EAGAIN && errno != EINTR }
            }
        }
        return entry.revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0
    }

    private func report(_ fd: Int32) {
        let token = lock.withLock { () -> UInt64? in
            guard let token = byFD.removeValue(forKey: fd) else { return nil }
            watches[token] = nil
            return token
        }
        guard let token else { return }
        close(fd)
        onHangup(token)
    }

    private func drain(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(fd, &buffer, buffer.count) > 0 {}
    }
}
