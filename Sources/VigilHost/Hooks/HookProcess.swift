import CTimer
import Foundation
import Glibc
import VigilKit

/// One running hook: watches its exit, drains its output, feeds its stdin and
/// enforces its timeout, from one monitor thread blocked in `poll(2)`.
///
/// Why a thread and not dispatch sources: creating and cancelling read sources
/// on short-lived pipes and pidfds for every hook run crashed vigild now and
/// then inside libdispatch's epoll loop (`_dispatch_event_loop_drain`, a
/// freed event note); hooks are occasional, a thread each is cheap, and
/// `poll` with the next deadline as its timeout wakes only for events.
///
/// Lifecycle: the process is done when its leader has been reaped AND its
/// output pipe reached end-of-file (every process in the group that holds
/// the pipe has exited or closed it). The timeout covers both, so a
/// background child still holding the output past the timeout gets the group
/// killed too. After the final SIGKILL, output is awaited for a short drain
/// time only: a process that left the group (setsid) while keeping the pipe
/// open cannot hold the hook forever.
final class HookProcess: Sendable {
    /// The only state shared with callers; the monitor state (`Monitor`) is
    /// touched only by the monitor thread.
    private struct Shared {
        var finished: HookResult?
        var waiter: CheckedContinuation<HookResult, Never>?
        var killRequested = false
    }
    private let shared = Lock(Shared())
    /// Written to wake the monitor thread (cancellation).
    private let wakeWrite: Int32
    let pid: pid_t

    /// Takes ownership of `outputFD` (read end of the output pipe) and
    /// `stdinFD` (write end of the stdin pipe, or -1 when stdin is /dev/null).
    init(
        pid: pid_t, outputFD: Int32, stdinFD: Int32, stdin: [UInt8],
        outputCap: Int, timeout: Duration, killGrace: Duration,
        drainAfterKill: Duration = .milliseconds(500), started: ContinuousClock.Instant
    ) {
        self.pid = pid
        var wake: [Int32] = [-1, -1]
        if vigil_pipe_cloexec(&wake) != 0 { wake = [-1, -1] }
        self.wakeWrite = wake[1]
        let monitor = Monitor(
            pid: pid, outputFD: outputFD, stdinFD: stdinFD, stdin: stdin, wakeRead: wake[0],
            outputCap: max(0, outputCap), timeout: timeout, killGrace: killGrace,
            drainAfterKill: drainAfterKill, started: started)
        let thread = Thread { [self] in
            let result = monitor.run { [self] in shared.withLock { $0.killRequested } }
            finish(result)
        }
        thread.name = "vigil.hook.\(pid)"
        thread.start()
    }

    deinit {
        if wakeWrite >= 0 { close(wakeWrite) }
    }

    /// Waits until the process is done; cancellation of the caller kills
    /// the process group with SIGKILL and returns promptly.
    func result() async -> HookResult {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let done: HookResult? = shared.withLock {
                    if let finished = $0.finished { return finished }
                    $0.waiter = continuation
                    return nil
                }
                if let done { continuation.resume(returning: done) }
            }
        } onCancel: {
            shared.withLock { $0.killRequested = true }
            if wakeWrite >= 0 {
                var byte: UInt8 = 1
                _ = write(wakeWrite, &byte, 1)
            }
        }
    }

    private func finish(_ result: HookResult) {
        let w: CheckedContinuation<HookResult, Never>? = shared.withLock { shared in
            shared.finished = result
            defer { shared.waiter = nil }
            return shared.waiter
        }
        w?.resume(returning: result)
    }

    /// The monitor thread's state and loop.
    // Invariant: created in init and handed to the monitor thread, which is
    // then the only thread that touches it.
    private final class Monitor: @unchecked Sendable {
        let pid: pid_t
        var pidfd: Int32
        var outputFD: Int32
        var stdinFD: Int32
        let wakeRead: Int32
        let outputCap: Int
        let timeout: Duration
        let killGrace: Duration
        let drainAfterKill: Duration
        let started: ContinuousClock.Instant

        var waitStatus: HookExit?
        var cpuTime: Duration = .zero
        var output: [UInt8] = []
        var outputTotal = 0
        var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
        var pendingStdin: [UInt8]
        var stdinOffset = 0
        var timedOut = false
        var termSentAt: ContinuousClock.Instant?
        var killSentAt: ContinuousClock.Instant?

        init(pid: pid_t, outputFD: Int32, stdinFD: Int32, stdin: [UInt8], wakeRead: Int32,
             outputCap: Int, timeout: Duration, killGrace: Duration, drainAfterKill: Duration,
             started: ContinuousClock.Instant) {
            self.pid = pid
            self.outputFD = outputFD
            self.stdinFD = stdinFD
            self.pendingStdin = stdin
            self.wakeRead = wakeRead
            self.outputCap = outputCap
            self.timeout = timeout
            self.killGrace = killGrace
            self.drainAfterKill = drainAfterKill
            self.started = started
            self.pidfd = vigil_pidfd_open(pid)
            for fd in [outputFD, stdinFD] where fd >= 0 {
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            }
            if stdinFD >= 0 && stdin.isEmpty { closeStdin() }
        }

        func run(killRequested: () -> Bool) -> HookResult {
            while waitStatus == nil || outputFD >= 0 {
                var fds: [pollfd] = []
                if pidfd >= 0 { fds.append(pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)) }
                if outputFD >= 0 { fds.append(pollfd(fd: outputFD, events: Int16(POLLIN), revents: 0)) }
                if stdinFD >= 0 { fds.append(pollfd(fd: stdinFD, events: Int16(POLLOUT), revents: 0)) }
                if wakeRead >= 0 { fds.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)) }
                let ready = poll(&fds, nfds_t(fds.count), pollTimeoutMilliseconds())
                if ready < 0 && errno != EINTR { break }
                for entry in fds where entry.revents != 0 {
                    switch entry.fd {
                    case pidfd: reap()
                    case outputFD: drainOutput()
                    case stdinFD: writeStdin()
                    case wakeRead:
                        var sink = [UInt8](repeating: 0, count: 16)
                        _ = read(wakeRead, &sink, sink.count)
                    default: break
                    }
                }
                if pidfd < 0 && waitStatus == nil { reap() }  // no pidfd (kernel < 5.3): check each turn
                if killRequested() { sendFinalKill() }
                checkDeadlines()
            }
            return finish()
        }

        /// Milliseconds until the next deadline (timeout, kill grace, drain), or -1.
        func pollTimeoutMilliseconds() -> Int32 {
            var next: ContinuousClock.Instant?
            if let killSentAt {
                next = killSentAt + drainAfterKill
            } else if let termSentAt {
                next = termSentAt + min(killGrace, timeout / 2)
            } else if timeout > .zero {
                next = started + timeout
            }
            if pidfd < 0 && waitStatus == nil {
                // Without a pidfd the exit is noticed on a timed re-check.
                let recheck = ContinuousClock.now + .milliseconds(50)
                next = next.map { min($0, recheck) } ?? recheck
            }
            guard let next else { return -1 }
            let ms = (next - ContinuousClock.now).clampedNanoseconds / 1_000_000 + 1
            return Int32(clamping: ms)
        }

        func checkDeadlines() {
            let now = ContinuousClock.now
            if let killSentAt {
                if now >= killSentAt + drainAfterKill, outputFD >= 0 { closeOutput() }
            } else if let termSentAt {
                if now >= termSentAt + min(killGrace, timeout / 2) { sendFinalKill() }
            } else if timeout > .zero, now >= started + timeout, !(waitStatus != nil && outputFD < 0) {
                timedOut = true
                termSentAt = now
                _ = kill(-pid, SIGTERM)
            }
        }

        func sendFinalKill() {
            guard killSentAt == nil else { return }
            killSentAt = ContinuousClock.now
            _ = kill(-pid, SIGKILL)
        }

        func reap() {
            var status: Int32 = 0
            var usage = rusage()
            var got: pid_t
            // wait4, not waitpid: the rusage is the command's CPU (its
            // strategy's ChildCPUUsec), with the children it waited for.
            repeat { got = wait4(pid, &status, WNOHANG, &usage) } while got < 0 && errno == EINTR
            if got == 0 { return }  // not exited yet
            if pidfd >= 0 { close(pidfd); pidfd = -1 }
            waitStatus = got < 0 ? .exited(-1) : HookProcess.exit(fromWaitStatus: status)
            if got > 0 { cpuTime = HookProcess.duration(usage.ru_utime) + HookProcess.duration(usage.ru_stime) }
        }

        func drainOutput() {
            while outputFD >= 0 {
                let count = readBuffer.withUnsafeMutableBytes { read(outputFD, $0.baseAddress, $0.count) }
                if count > 0 {
                    let room = outputCap - output.count
                    if room > 0 { output.append(contentsOf: readBuffer[0..<min(room, count)]) }
                    outputTotal += count
                    continue
                }
                if count < 0 && errno == EINTR { continue }
                if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
                closeOutput()  // 0: end of file; any other error ends the output too
            }
        }

        func closeOutput() {
            if outputFD >= 0 { close(outputFD); outputFD = -1 }
        }

        func writeStdin() {
            while stdinFD >= 0, stdinOffset < pendingStdin.count {
                let count = pendingStdin.withUnsafeBytes { buffer -> Int in
                    guard let base = buffer.baseAddress else { return 0 }
                    return write(stdinFD, base + stdinOffset, buffer.count - stdinOffset)
                }
                if count > 0 { stdinOffset += count; continue }
                if count < 0 && errno == EINTR { continue }
                if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
                break  // EPIPE (SIGPIPE is ignored by the runner): the child stopped reading
            }
            closeStdin()
        }

        func closeStdin() {
            if stdinFD >= 0 { close(stdinFD); stdinFD = -1 }
            pendingStdin = []
        }

        func finish() -> HookResult {
            closeStdin()
            closeOutput()
            if pidfd >= 0 { close(pidfd); pidfd = -1 }
            if wakeRead >= 0 { close(wakeRead) }
            var text = String(decoding: output, as: UTF8.self)
            if outputTotal > output.count {
                if !text.isEmpty && !text.hasSuffix("\n") { text += "\n" }
                text += "[output truncated after \(outputCap) bytes]"
            }
            return HookResult(
                exit: timedOut ? .timedOut : (waitStatus ?? .exited(-1)),
                output: text,
                duration: ContinuousClock.now - started,
                cpuTime: cpuTime)
        }
    }

    // MARK: - Wait status

    static func duration(_ time: timeval) -> Duration {
        .seconds(Int64(time.tv_sec)) + .microseconds(Int64(time.tv_usec))
    }

    static func exit(fromWaitStatus status: Int32) -> HookExit {
        if vigil_wifexited(status) != 0 { return .exited(vigil_wexitstatus(status)) }
        if vigil_wifsignaled(status) != 0 { return .signaled(vigil_wtermsig(status)) }
        return .exited(-1)
    }

}

extension Duration {
    /// Nanoseconds, clamped to `0...Int.max` so a huge timeout cannot overflow.
    var clampedNanoseconds: Int {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return Int.max }
        let (total, overflow2) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        return overflow2 ? Int.max : Int(total)
    }
}
