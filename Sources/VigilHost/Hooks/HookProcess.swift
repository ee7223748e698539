import CTimer
import Dispatch
import Foundation
import Glibc
import VigilKit

/// One running hook: watches its exit, drains its output, feeds its stdin and
/// enforces its timeout, all from one serial queue, without polling.
///
/// Lifecycle: the process is done when its leader has been reaped AND its
/// output pipe reached end-of-file (every process in the group that holds
/// the pipe has exited or closed it). The timeout covers both, so a
/// background child still holding the output past the timeout gets the group
/// killed too. After the final SIGKILL, output is awaited for a short drain
/// time only: a process that left the group (setsid) while keeping the pipe
/// open cannot hold the hook forever.
final class HookProcess: @unchecked Sendable {
    // Invariant: every `var` below is read and written only on `queue`; the
    // `let`s are set in init and never change. That is what makes the
    // unchecked Sendable conformance sound.
    private let queue: DispatchQueue
    let pid: pid_t
    private let outputCap: Int
    private let timeout: Duration
    private let killGrace: Duration
    private let drainAfterKill: Duration
    private let started: ContinuousClock.Instant

    private var exitSource: (any DispatchSourceRead)?
    private var outputSource: (any DispatchSourceRead)?
    private var stdinSource: (any DispatchSourceWrite)?
    private var timers: [any DispatchSourceTimer] = []

    private var waitStatus: HookExit?
    private var outputDone = false
    private var output: [UInt8] = []
    private var outputTotal = 0
    private var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
    private var pendingStdin: [UInt8]
    private var stdinOffset = 0
    private var timedOut = false
    private var finalKillSent = false
    private var finished: HookResult?
    private var waiter: CheckedContinuation<HookResult, Never>?

    /// Takes ownership of `outputFD` (read end of the output pipe) and
    /// `stdinFD` (write end of the stdin pipe, or -1 when stdin is /dev/null).
    init(
        pid: pid_t, outputFD: Int32, stdinFD: Int32, stdin: [UInt8],
        outputCap: Int, timeout: Duration, killGrace: Duration,
        drainAfterKill: Duration = .milliseconds(500), started: ContinuousClock.Instant
    ) {
        self.queue = DispatchQueue(label: "vigil.hook.\(pid)")
        self.pid = pid
        self.outputCap = max(0, outputCap)
        self.timeout = timeout
        self.killGrace = killGrace
        self.drainAfterKill = drainAfterKill
        self.started = started
        self.pendingStdin = stdin
        queue.async { self.start(outputFD: outputFD, stdinFD: stdinFD) }
    }

    /// Waits until the process is done; cancellation of the caller kills
    /// the process group with SIGKILL and returns promptly.
    func result() async -> HookResult {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                queue.async {
                    if let finished = self.finished {
                        continuation.resume(returning: finished)
                    } else {
                        self.waiter = continuation
                    }
                }
            }
        } onCancel: {
            queue.async { self.sendFinalKill() }
        }
    }

    // MARK: - Set-up (on queue)

    // Event handlers capture `self` strongly: the process stays alive while
    // any source can fire, and every source is cancelled (releasing its
    // handler) by the time the result is delivered.
    private func start(outputFD: Int32, stdinFD: Int32) {
        watchExit()
        watchOutput(outputFD)
        if stdinFD >= 0 { feedStdin(stdinFD) }
        if timeout > .zero {
            after(timeout) { $0.overran() }
        }
    }

    private func watchExit() {
        let pidfd = vigil_pidfd_open(pid)
        if pidfd >= 0 {
            _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
            let source = DispatchSource.makeReadSource(fileDescriptor: pidfd, queue: queue)
            source.setEventHandler { self.reap() }
            source.setCancelHandler { close(pidfd) }
            exitSource = source
            source.resume()
        } else {
            // Kernels before 5.3 have no pidfd: a thread blocks in waitpid for
            // this one pid (never -1, so other children are left alone).
            let pid = self.pid
            let thread = Thread { [self] in
                let exit = HookProcess.waitBlocking(pid)
                self.queue.async { self.recordExit(exit) }
            }
            thread.name = "vigil.hook.wait.\(pid)"
            thread.start()
        }
    }

    private func watchOutput(_ fd: Int32) {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { self.drainOutput(fd) }
        source.setCancelHandler { close(fd) }
        outputSource = source
        source.resume()
    }

    private func feedStdin(_ fd: Int32) {
        if pendingStdin.isEmpty {
            close(fd)
            return
        }
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        let source = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { self.writeStdin(fd) }
        source.setCancelHandler { close(fd) }
        stdinSource = source
        source.resume()
    }

    private func after(_ delay: Duration, _ action: @escaping (HookProcess) -> Void) {
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .nanoseconds(delay.clampedNanoseconds))
        timer.setEventHandler { action(self) }
        timers.append(timer)
        timer.resume()
    }

    // MARK: - Events (on queue)

    private func reap() {
        var status: Int32 = 0
        var got: pid_t
        repeat { got = waitpid(pid, &status, WNOHANG) } while got < 0 && errno == EINTR
        if got == 0 { return }  // spurious wake-up: not exited yet
        exitSource?.cancel()
        exitSource = nil
        recordExit(got < 0 ? .exited(-1) : HookProcess.exit(fromWaitStatus: status))
    }

    private func recordExit(_ exit: HookExit) {
        waitStatus = exit
        finishIfDone()
    }

    private func drainOutput(_ fd: Int32) {
        guard !outputDone else { return }
        while true {
            let count = readBuffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count > 0 {
                let room = outputCap - output.count
                if room > 0 { output.append(contentsOf: readBuffer[0..<min(room, count)]) }
                outputTotal += count
                continue
            }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            break  // 0: end of file; any other error ends the output too
        }
        endOutput()
    }

    private func endOutput() {
        outputDone = true
        outputSource?.cancel()
        outputSource = nil
        finishIfDone()
    }

    private func writeStdin(_ fd: Int32) {
        while stdinOffset < pendingStdin.count {
            let count = pendingStdin.withUnsafeBytes {
                write(fd, $0.baseAddress! + stdinOffset, $0.count - stdinOffset)
            }
            if count > 0 { stdinOffset += count; continue }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            break  // EPIPE (SIGPIPE is ignored by the runner): the child stopped reading
        }
        closeStdin()
    }

    private func closeStdin() {
        stdinSource?.cancel()
        stdinSource = nil
        pendingStdin = []
    }

    private func overran() {
        guard finished == nil, !timedOut else { return }
        timedOut = true
        _ = kill(-pid, SIGTERM)
        let grace = min(killGrace, timeout / 2)
        after(grace) { $0.sendFinalKill() }
    }

    private func sendFinalKill() {
        guard finished == nil, !finalKillSent else { return }
        finalKillSent = true
        _ = kill(-pid, SIGKILL)
        after(drainAfterKill) { process in
            if !process.outputDone { process.endOutput() }
        }
    }

    private func finishIfDone() {
        guard finished == nil, let waitStatus, outputDone else { return }
        closeStdin()
        for timer in timers { timer.cancel() }
        timers = []
        var text = String(decoding: output, as: UTF8.self)
        if outputTotal > output.count {
            if !text.isEmpty && !text.hasSuffix("\n") { text += "\n" }
            text += "[output truncated after \(outputCap) bytes]"
        }
        output = []
        readBuffer = []
        let result = HookResult(
            exit: timedOut ? .timedOut : waitStatus,
            output: text,
            duration: ContinuousClock.now - started
        )
        finished = result
        waiter?.resume(returning: result)
        waiter = nil
    }

    // MARK: - Wait status

    static func exit(fromWaitStatus status: Int32) -> HookExit {
        if vigil_wifexited(status) != 0 { return .exited(vigil_wexitstatus(status)) }
        if vigil_wifsignaled(status) != 0 { return .signaled(vigil_wtermsig(status)) }
        return .exited(-1)
    }

    private static func waitBlocking(_ pid: pid_t) -> HookExit {
        var status: Int32 = 0
        var got: pid_t
        repeat { got = waitpid(pid, &status, 0) } while got < 0 && errno == EINTR
        return got < 0 ? .exited(-1) : exit(fromWaitStatus: status)
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
