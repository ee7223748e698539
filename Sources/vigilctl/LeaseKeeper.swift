import Foundation
import VigilCommon
import VigilDBus

/// Keeps a client lease for `vigilctl hold` while the command runs, across
/// restarts of vigild.
///
/// The lease fd is the write end of a pipe whose read end vigild holds:
/// when vigild ends the lease or dies, the read end closes and `poll`
/// reports POLLERR on ours. That is the event the keeper waits for (no
/// polling); then it begins a new lease on whatever vigild answers next,
/// retrying with backoff, and counts the time spent without one.
actor LeaseKeeper {
    struct Held {
        var client: VigilBusClient
        var path: String
        var fd: BusFileDescriptor
    }

    /// What the command ran without.
    struct Gaps: Sendable {
        var count = 0
        var total: Duration = .zero
        /// True when the command ended while no lease was held.
        var endedWithoutLease = false
    }

    private let options: BusOptions
    private let name: String
    private let reason: String
    private let budgetMicros: UInt64
    private var held: Held?
    private var gaps = Gaps()
    private var stopped = false
    /// Written once at stop: wakes the hang-up wait.
    private let stopPipe: (read: Int32, write: Int32)

    init(options: BusOptions, name: String, reason: String, budgetMicros: UInt64, first: Held) {
        self.options = options
        self.name = name
        self.reason = reason
        self.budgetMicros = budgetMicros
        self.held = first
        var fds: [Int32] = [-1, -1]
        // Invariant: pipe fails only without free fds; then stop() cannot
        // wake the wait, and the process is ending anyway.
        _ = pipe(&fds)
        for fd in fds where fd >= 0 { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        stopPipe = (fds[0], fds[1])
    }

    /// Renews the lease every `every` while held (errors are left to the
    /// hang-up watch, which sees the lease end).
    func renewLoop(every: Duration) async {
        while !stopped, !Task.isCancelled {
            try? await Task.sleep(for: every)
            guard !stopped, let held else { continue }
            try? await held.client.renewClientLease(held.path, budgetMicros: budgetMicros)
        }
    }

    /// Waits for the lease to end and begins new ones, until `stop`.
    func keepLoop() async {
        while !stopped {
            guard let current = held else { return }
            let lost = await Self.waitForHangup(current.fd.rawValue, stop: stopPipe.read)
            guard lost, !stopped else { return }
            let lostAt = ContinuousClock.now
            held = nil
            current.fd.close()
            await current.client.close()
            Self.say("lease \(current.path) ended by vigild (it stopped or restarted); beginning a new one")
            var delay = Duration.milliseconds(100)
            while !stopped {
                do {
                    let client = try await VigilBusClient.connect(options)
                    do {
                        let lease = try await client.beginBackgroundTask(name: name, reason: reason, budgetMicros: budgetMicros)
                        _ = fcntl(lease.fd.rawValue, F_SETFD, FD_CLOEXEC)
                        held = Held(client: client, path: lease.path, fd: lease.fd)
                    } catch {
                        await client.close()
                        throw error
                    }
                    let gap = ContinuousClock.now - lostAt
                    gaps.count += 1
                    gaps.total += gap
                    Self.say("new lease \(lease(of: held)) after \(Self.seconds(gap)) without one")
                    break
                } catch {
                    if stopped { break }
                    try? await Task.sleep(for: delay)
                    delay = min(delay * 2, .seconds(2))
                }
            }
            if held == nil, stopped {
                gaps.count += 1
                gaps.total += ContinuousClock.now - lostAt
                gaps.endedWithoutLease = true
            }
        }
    }

    private func lease(of held: Held?) -> String { held?.path ?? "?" }

    /// Whether `path` is the lease held now.
    func holds(_ path: String) -> Bool { held?.path == path }

    /// Makes both loops return soon (wakes the hang-up wait).
    func requestStop() {
        guard !stopped else { return }
        stopped = true
        var byte: UInt8 = 1
        _ = write(stopPipe.write, &byte, 1)
    }

    /// After the loops returned: ends the lease held now and reports the gaps.
    func finish() async -> Gaps {
        if let held {
            do {
                try await held.client.endClientLease(held.path)
            } catch {
                Self.say("cannot end \(held.path): \(error)")
            }
            held.fd.close()
            await held.client.close()
            self.held = nil
        }
        close(stopPipe.read)
        close(stopPipe.write)
        return gaps
    }

    /// Blocks a thread in poll(2) until `fd` reports POLLERR/POLLHUP (true)
    /// or `stop` becomes readable (false).
    private static func waitForHangup(_ fd: Int32, stop: Int32) async -> Bool {
        await withCheckedContinuation { continuation in
            let thread = Thread {
                var fds = [pollfd(fd: fd, events: 0, revents: 0), pollfd(fd: stop, events: Int16(POLLIN), revents: 0)]
                while true {
                    let n = poll(&fds, 2, -1)
                    if n < 0, errno == EINTR { continue }
                    if n < 0 || fds[1].revents != 0 { continuation.resume(returning: false); return }
                    if fds[0].revents & Int16(POLLERR | POLLHUP | POLLNVAL) != 0 { continuation.resume(returning: true); return }
                }
            }
            thread.start()
        }
    }

    static func seconds(_ d: Duration) -> String {
        String(format: "%.1fs", Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
    }

    static func say(_ message: String) {
        FileHandle.standardError.write(Data("vigilctl hold: \(TerminalText.escaped(message))\n".utf8))
    }
}
