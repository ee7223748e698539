import CTimer
import Foundation
import Glibc
import VigilKit

/// One running hook: watches its exit (pidfd), drains its output, feeds its
/// stdin and enforces its timeout, all on the host's ``EventLoop``: a watch
/// per descriptor and one loop timer for the next deadline. No thread of its
/// own, and nothing wakes but its events and deadlines.
///
/// (Before issue 47 a monitor thread per hook blocked in `poll(2)`: dispatch
/// read sources made and cancelled for every run had crashed vigild inside
/// libdispatch's epoll loop. The loop's watches are released explicitly, and
/// a descriptor is closed only once its watch is released.)
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
    /// touched only on the loop.
    private struct Shared {
        var finished: HookResult?
        var waiter: CheckedContinuation<HookResult, Never>?
    }
    /// `Shared` in a class, so that the monitor's completion can hold it.
    private final class Outcome: Sendable {
        let state = Lock(Shared())

        func finish(_ result: HookResult) {
            let w: CheckedContinuation<HookResult, Never>? = state.withLock { shared in
                shared.finished = result
                defer { shared.waiter = nil }
                return shared.waiter
            }
            w?.resume(returning: result)
        }
    }
    private let outcome = Outcome()
    private let monitor: Monitor
    let pid: pid_t

    /// Takes ownership of `outputFD` (read end of the output pipe) and
    /// `stdinFD` (write end of the stdin pipe, or -1 when stdin is /dev/null).
    init(
        pid: pid_t, outputFD: Int32, stdinFD: Int32, stdin: [UInt8],
        outputCap: Int, timeout: Duration, killGrace: Duration,
        drainAfterKill: Duration = .milliseconds(500), started: ContinuousClock.Instant
    ) {
        self.pid = pid
        let outcome = self.outcome
        monitor = Monitor(
            pid: pid, outputFD: outputFD, stdinFD: stdinFD, stdin: stdin,
            outputCap: max(0, outputCap), timeout: timeout, killGrace: killGrace,
            drainAfterKill: drainAfterKill, started: started
        ) { result in outcome.finish(result) }
        let monitor = self.monitor
        EventLoop.post { monitor.start() }
    }

    /// Waits until the process is done; cancellation of the caller kills
    /// the process group with SIGKILL and returns promptly.
    func result() async -> HookResult {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let done: HookResult? = outcome.state.withLock {
                    if let finished = $0.finished { return finished }
                    $0.waiter = continuation
                    return nil
                }
                if let done { continuation.resume(returning: done) }
            }
        } onCancel: {
            let monitor = self.monitor
            EventLoop.post { monitor.killRequested() }
        }
    }

    /// The monitor's state and handlers.
    // Invariant: created in init and then touched only on the loop (`start`
    // and `killRequested` are posted there; the watches' handlers and the
    // timer run there), one call at a time.
    private final class Monitor: @unchecked Sendable {
        let pid: pid_t
        var pidfd: Int32
        var outputFD: Int32
        var stdinFD: Int32
        let outputCap: Int
        let timeout: Duration
        let killGrace: Duration
        let drainAfterKill: Duration
        let started: ContinuousClock.Instant
        let onFinish: @Sendable (HookResult) -> Void

        var pidWatch: EventLoop.Watch?
        var outputWatch: EventLoop.Watch?
        var stdinWatch: EventLoop.Watch?
        var timer: EventLoop.Timer?
        var finished = false

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

        init(pid: pid_t, outputFD: Int32, stdinFD: Int32, stdin: [UInt8],
             outputCap: Int, timeout: Duration, killGrace: Duration, drainAfterKill: Duration,
             started: ContinuousClock.Instant, onFinish: @escaping @Sendable (HookResult) -> Void) {
            self.pid = pid
            self.outputFD = outputFD
            self.stdinFD = stdinFD
            self.pendingStdin = stdin
            self.outputCap = outputCap
            self.timeout = timeout
            self.killGrace = killGrace
            self.drainAfterKill = drainAfterKill
            self.started = started
            self.onFinish = onFinish
            self.pidfd = vigil_pidfd_open(pid)
            for fd in [outputFD, stdinFD] where fd >= 0 {
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            }
        }

        /// On the loop: watches the descriptors and arms the first deadline.
        func start() {
            if stdinFD >= 0 && pendingStdin.isEmpty { closeStdin() }
            // Each descriptor is closed when the loop releases its watch.
            if pidfd >= 0 {
                let fd = pidfd
                pidWatch = try? EventLoop.watch(fd, for: .readable) { [self] _ in reap(); step() } released: { close(fd) }
                if pidWatch == nil { closePidfd() }  // then re-checked on a timer
            }
            if outputFD >= 0 {
                let fd = outputFD
                outputWatch = try? EventLoop.watch(fd, for: .readable) { [self] _ in drainOutput(); step() } released: { close(fd) }
                if outputWatch == nil { closeOutput() }  // out of memory: the output is lost
            }
            if stdinFD >= 0 {
                let fd = stdinFD
                stdinWatch = try? EventLoop.watch(fd, for: .writable) { [self] _ in writeStdin(); step() } released: { close(fd) }
                if stdinWatch == nil { closeStdin() }
            }
            step()
        }

        /// On the loop: the caller of `result()` was cancelled.
        func killRequested() {
            guard !finished else { return }
            sendFinalKill()
            step()
        }

        /// After each event: the deadlines, then either the result or the
        /// timer for the next deadline.
        func step() {
            guard !finished else { return }
            if pidfd < 0 && waitStatus == nil { reap() }  // no pidfd (kernel < 5.3): check each turn
            checkDeadlines()
            timer?.cancel()
            timer = nil
            guard waitStatus == nil || outputFD >= 0 else {
                finished = true
                onFinish(finish())
                return
            }
            if let delay = nextDeadline() {
                timer = try? EventLoop.Timer.after(delay) { [self] in
                    timer = nil
                    step()
                }
            }
        }

        /// Time until the next deadline (timeout, kill grace, drain), or nil.
        func nextDeadline() -> Duration? {
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
            guard let next else { return nil }
            // A millisecond late rather than early, as poll's timeout was.
            return max(.zero, next - ContinuousClock.now) + .milliseconds(1)
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
            guard waitStatus == nil else { return }
            var status: Int32 = 0
            var usage = rusage()
            var got: pid_t
            // wait4, not waitpid: the rusage is the command's CPU (its
            // strategy's ChildCPUUsec), with the children it waited for.
            // WNOHANG: the loop never waits.
            repeat { got = wait4(pid, &status, WNOHANG, &usage) } while got < 0 && errno == EINTR
            if got == 0 { return }  // not exited yet
            closePidfd()
            waitStatus = got < 0 ? .exited(-1) : HookProcess.exit(fromWaitStatus: status)
            if got > 0 { cpuTime = HookProcess.duration(usage.ru_utime) + HookProcess.duration(usage.ru_stime) }
        }

        /// Reads what is there, at most 1 MiB a turn (the watch reports the
        /// rest), so a hook that floods its output cannot hold the loop.
        func drainOutput() {
            var drained = 0
            while outputFD >= 0, drained < 1 << 20 {
                let count = readBuffer.withUnsafeMutableBytes { read(outputFD, $0.baseAddress, $0.count) }
                if count > 0 {
                    let room = outputCap - output.count
                    if room > 0 { output.append(contentsOf: readBuffer[0..<min(room, count)]) }
                    outputTotal += count
                    drained += count
                    continue
                }
                if count < 0 && errno == EINTR { continue }
                if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
                closeOutput()  // 0: end of file; any other error ends the output too
            }
        }

        /// Cancels `watch`, whose `released` closes `fd`; closes `fd` at
        /// once when it was never watched.
        private static func release(_ watch: EventLoop.Watch?, _ fd: Int32) {
            guard let watch else {
                close(fd)
                return
            }
            watch.cancel()
        }

        func closePidfd() {
            if pidfd >= 0 { Self.release(pidWatch, pidfd); pidfd = -1; pidWatch = nil }
        }

        func closeOutput() {
            if outputFD >= 0 { Self.release(outputWatch, outputFD); outputFD = -1; outputWatch = nil }
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
            if stdinFD >= 0 { Self.release(stdinWatch, stdinFD); stdinFD = -1; stdinWatch = nil }
            pendingStdin = []
        }

        func finish() -> HookResult {
            closeStdin()
            closeOutput()
            closePidfd()
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
