import CTimer
import Foundation
import Glibc
import VigilKit

/// A `dbus-daemon` that vigild started because there was no session bus,
/// kept as its child until ``stop()``.
///
/// Started with `vigil_spawn` (own process group, clean signal state):
/// `dbus-daemon --session --nofork --print-address=1 --address=unix:dir=DIR`.
/// Its stdout and stderr share one pipe: the address line is read from it
/// synchronously at start (bounded by a timeout); afterwards a watch on the
/// host's ``EventLoop`` forwards anything the daemon prints to the log, and
/// a watch on its pidfd notices when it exits. Nothing polls, and no thread
/// is its own.
public final class PrivateBus: Sendable {
    // The mutable state is in `state`; the handlers of the watches and the
    // grace timer run on the loop and take the lock briefly (never while
    // logging or resuming a waiter). The daemon is signalled only under the
    // lock while `exitStatus` is nil, and reaped only under it, so a signal
    // never reaches a reused pid.
    private struct State {
        var output: EventLoop.Watch?
        /// The output reached end-of-file (its watch is, or is to be, cancelled).
        var outputEnded = false
        var exit: EventLoop.Watch?
        var pending = [UInt8]()
        var exitStatus: Int32?
        var stopping = false
        var exitWaiters: [CheckedContinuation<Void, Never>] = []
        var exitTimer: EventLoop.Timer?
    }
    private let state = Lock(State())
    /// The daemon's process id.
    public let pid: pid_t
    /// The address the daemon listens on, as it printed it.
    public let address: String
    /// The file the address was written to.
    public let addressFile: String
    private let log: Logger
    /// False for a daemon adopted from a vigild that died: not our child,
    /// so its exit is seen through its pidfd and never reaped here.
    private let isChild: Bool

    /// The most read from the daemon's output per event; the rest is
    /// reported again (level-triggered), so a chatty daemon cannot hold the loop.
    private static let drainLimit = 64 * 1024

    /// Why a private bus could not be started.
    public struct StartError: Error, CustomStringConvertible {
        public var description: String
    }

    private init(pid: pid_t, address: String, addressFile: String, log: Logger, isChild: Bool = true) {
        self.pid = pid
        self.isChild = isChild
        self.address = address
        self.addressFile = addressFile
        self.log = log
    }

    /// Starts a daemon listening in `socketDirectory`, waits (at most
    /// `timeout`) for its address, and writes it to `addressFile` (mode 0600,
    /// its directory created 0700 if missing).
    public static func start(
        socketDirectory: String, addressFile: String,
        environment: [String: String], log: Logger,
        timeout: Duration = .seconds(10)
    ) throws -> PrivateBus {
        guard let program = findExecutable("dbus-daemon", environment: environment) else {
            throw StartError(description: "there is no session bus and no dbus-daemon to start a private one (looked in $PATH, /usr/bin, /bin); install dbus, or set [host] bus")
        }
        try makePrivateDirectory(socketDirectory)
        try makePrivateDirectory((addressFile as NSString).deletingLastPathComponent)
        // sockaddr_un holds 108 bytes; dbus-daemon adds "/dbus-XXXXXXXXXX".
        let listen = socketDirectory.utf8.count + 17 < 108 ? "unix:dir=" + socketDirectory : "unix:tmpdir=/tmp"
        let arguments = [program, "--session", "--nofork", "--print-address=1", "--address=" + listen]

        var fds: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&fds) == 0 else { throw StartError(description: "cannot create a pipe for dbus-daemon: \(errnoText())") }
        let readEnd = fds[0], writeEnd = fds[1]
        var pid: pid_t = 0
        // stdin -1: dbus-daemon's is /dev/null, opened by the child.
        let spawnError = withCStrings(arguments) { argv in
            withCStrings(environment.map { "\($0.key)=\($0.value)" }) { envp in
                vigil_spawn(program, argv, envp, -1, writeEnd, nil, &pid)
            }
        }
        close(writeEnd)
        guard spawnError == 0 else {
            close(readEnd)
            throw StartError(description: "cannot start \(program): \(String(cString: strerror(spawnError)))")
        }

        let (address, earlyOutput) = readAddress(from: readEnd, timeout: timeout)
        for line in earlyOutput { log.info("dbus-daemon: \(line)") }
        guard let address else {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
            close(readEnd)
            let said = earlyOutput.isEmpty ? "" : ": " + earlyOutput.joined(separator: " / ")
            throw StartError(description: "\(program) did not print its address within \(timeout)\(said)")
        }
        let bus = PrivateBus(pid: pid, address: address, addressFile: addressFile, log: log)
        do {
            try writeAddressFile(addressFile, address: address)
        } catch {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
            close(readEnd)
            throw error
        }
        do {
            try bus.watch(output: readEnd)
        } catch {
            // Out of memory: a daemon whose output nobody reads would block
            // once the pipe is full.
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
            close(readEnd)
            throw StartError(description: "cannot watch \(program)'s output: \(error)")
        }
        return bus
    }

    /// Takes over the private bus an earlier vigild started and did not stop
    /// (it was killed): `pid` is the daemon the bus reports for itself. The
    /// new owner stops it and removes the address file on shutdown, so a
    /// `kill -9` of vigild leaks the daemon only until the next vigild ends.
    /// Returns nil when `pid` is not a `dbus-daemon` this process may watch.
    public static func adopt(pid: pid_t, address: String, addressFile: String, log: Logger) -> PrivateBus? {
        let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        guard pid > 0, comm == "dbus-daemon", kill(pid, 0) == 0 else { return nil }
        let pidfd = vigil_pidfd_open(pid)
        guard pidfd >= 0 else { return nil }
        _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
        let bus = PrivateBus(pid: pid, address: address, addressFile: addressFile, log: log, isChild: false)
        do {
            try bus.watchExit(pidfd)
        } catch {
            close(pidfd)
            return nil
        }
        return bus
    }

    /// Stops the daemon (SIGTERM, SIGKILL after `grace`), reaps it, and
    /// removes the address file if it still names this daemon. Idempotent.
    public func stop(grace: Duration = .seconds(3)) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let signalled = state.withLock { state -> Bool in
                state.stopping = true
                guard state.exitStatus == nil else { return false }
                state.exitWaiters.append(continuation)
                kill(pid, SIGTERM)
                return true
            }
            guard signalled else {
                continuation.resume()
                return
            }
            // Scheduled outside the lock: the loop may be running a handler
            // that waits for it.
            let timer = try? EventLoop.Timer.after(grace) { [self] in
                let killed = state.withLock { state -> Bool in
                    guard state.exitStatus == nil else { return false }
                    kill(pid, SIGKILL)
                    return true
                }
                if killed { log.warning("the private dbus-daemon (pid \(pid)) ignored SIGTERM; killing it") }
            }
            // The exit handler cancels the timer when the daemon went first.
            let exited = state.withLock { state -> Bool in
                if state.exitStatus == nil { state.exitTimer = timer }
                return state.exitStatus != nil
            }
            if exited { timer?.cancel() }
        }
        if BusLocator.readAddressFile(addressFile) == address {
            unlink(addressFile)
        }
    }

    /// True while the daemon has not exited.
    public var isRunning: Bool {
        state.withLock { $0.exitStatus == nil }
    }

    // MARK: - On the loop

    private func watch(output fd: Int32) throws(EventLoopError) {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        // Handlers hold `self` strongly: the bus object lives as long as the
        // daemon can still produce events; both watches are cancelled when it exits.
        let output = try EventLoop.watch(fd, for: .readable) { _ in
            self.drain(fd)
        } released: {
            close(fd)
        }
        // The handler may have seen end-of-file before the watch was stored.
        let ended = state.withLock { state -> Bool in
            if !state.outputEnded { state.output = output }
            return state.outputEnded
        }
        if ended { output.cancel() }

        let pidfd = vigil_pidfd_open(pid)
        if pidfd >= 0 {
            _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
            do {
                try watchExit(pidfd)
            } catch {
                // The exit still shows as end-of-file on the output pipe.
                close(pidfd)
            }
        }
        // Without pidfd (Linux < 5.3) the exit shows as end-of-file on the
        // output pipe, which the daemon holds until it exits.
    }

    private func watchExit(_ pidfd: Int32) throws(EventLoopError) {
        let exit = try EventLoop.watch(pidfd, for: .readable) { _ in
            self.reap()
        } released: {
            close(pidfd)
        }
        // The handler may have reaped the daemon before the watch was stored.
        let exited = state.withLock { state -> Bool in
            if state.exitStatus == nil { state.exit = exit }
            return state.exitStatus != nil
        }
        if exited { exit.cancel() }
    }

    /// On the loop: reads what the daemon printed (bounded) and logs its lines.
    private func drain(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 4096)
        var lines: [String] = []
        var ended = false
        var drained = 0
        while drained < Self.drainLimit {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                drained += n
                state.withLock { state in
                    state.pending.append(contentsOf: buffer[0..<n])
                    while let nl = state.pending.firstIndex(of: 0x0A) {
                        let line = String(decoding: state.pending[0..<nl], as: UTF8.self)
                        state.pending.removeSubrange(0...nl)
                        if !line.isEmpty { lines.append(line) }
                    }
                }
                continue
            }
            if n < 0 && (errno == EINTR) { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
            // End of file: the daemon (and anything it spawned) closed it.
            ended = true
            break
        }
        for line in lines { log.info("dbus-daemon: \(Self.shortLine(line))") }
        guard ended else { return }
        let (output, watchesExit) = state.withLock { state in
            defer {
                state.output = nil
                state.outputEnded = true
            }
            return (state.output, state.exit != nil)
        }
        output?.cancel()
        if !watchesExit { reap() }
    }

    /// A line of the daemon's output for vigild's log: without the
    /// daemon's own `dbus-daemon[PID]: [session uid=N pid=N] ` prefix
    /// (vigild's line names the daemon), and at most 160 characters, so
    /// that it fits a terminal line with vigild's fields.
    public static func shortLine(_ line: String) -> String {
        var rest = Substring(line)
        if rest.hasPrefix("dbus-daemon["), let end = rest.range(of: "]: ") { rest = rest[end.upperBound...] }
        if rest.hasPrefix("[session "), let end = rest.firstIndex(of: "]") {
            rest = rest[rest.index(after: end)...].drop { $0 == " " }
        }
        return ClientText.excerpt(String(rest), limit: 160)
    }

    /// On the loop, when the daemon exited (its pidfd is readable, or
    /// without a pidfd its output ended).
    private func reap() {
        let (done, retry) = state.withLock { state -> ((status: Int32, exit: EventLoop.Watch?, timer: EventLoop.Timer?, waiters: [CheckedContinuation<Void, Never>], stopping: Bool)?, Bool) in
            guard state.exitStatus == nil else { return (nil, false) }
            var status: Int32 = 0
            if isChild {
                // WNOHANG: the loop must not wait. A readable pidfd means
                // the daemon has exited; an ended output pipe (no pidfd)
                // that it is about to, so that case tries again shortly.
                var got: pid_t
                repeat { got = waitpid(pid, &status, WNOHANG) } while got < 0 && errno == EINTR
                if got == 0 { return (nil, state.exit == nil) }
                guard got == pid else { return (nil, false) }
            }
            // An adopted daemon's pidfd became readable: it exited; its status
            // belongs to its parent.
            state.exitStatus = status
            defer {
                state.exit = nil
                state.exitTimer = nil
                state.exitWaiters.removeAll()
            }
            return ((status, state.exit, state.exitTimer, state.exitWaiters, state.stopping), false)
        }
        if retry {
            _ = try? EventLoop.Timer.after(.milliseconds(100)) { self.reap() }
            return
        }
        guard let done else { return }
        done.exit?.cancel()
        done.timer?.cancel()
        if !done.stopping {
            let status = done.status
            let how = !isChild ? "exited" : vigil_wifsignaled(status) != 0 ? "was killed by signal \(vigil_wtermsig(status))" : "exited with status \(vigil_wexitstatus(status))"
            log.error("the private dbus-daemon (pid \(pid)) \(how); clients cannot reach this host until vigild has started a new one and reconnected")
        }
        for waiter in done.waiters { waiter.resume() }
    }

    // MARK: - Helpers

    /// Reads lines from `fd` until one is a bus address, end-of-file, or
    /// `timeout`. Returns the address and the other lines (warnings the
    /// daemon printed on stderr, which shares the pipe).
    private static func readAddress(from fd: Int32, timeout: Duration) -> (String?, [String]) {
        var others: [String] = []
        var pending = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = ContinuousClock.now + timeout
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return (nil, others) }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ms = Int32(clamping: remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1)
            let ready = poll(&pfd, 1, ms)
            if ready < 0 {
                if errno == EINTR { continue }
                return (nil, others + ["poll: \(errnoText())"])
            }
            if ready == 0 { continue }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                return (nil, others + ["read: \(errnoText())"])
            }
            if n == 0 {
                if !pending.isEmpty { others.append(String(decoding: pending, as: UTF8.self)) }
                return (nil, others)
            }
            pending.append(contentsOf: buffer[0..<n])
            while let nl = pending.firstIndex(of: 0x0A) {
                let line = String(decoding: pending[0..<nl], as: UTF8.self).trimmingCharacters(in: .whitespaces)
                pending.removeSubrange(0...nl)
                if line.hasPrefix("unix:"), BusSelection.isValidAddress(line) { return (line, others) }
                if !line.isEmpty { others.append(line) }
            }
        }
    }

    /// Creates `path` (and parents) if missing; a directory we create is 0700.
    static func makePrivateDirectory(_ path: String) throws {
        var info = stat()
        if stat(path, &info) == 0 {
            guard (info.st_mode & S_IFMT) == S_IFDIR else { throw StartError(description: "\(path) exists and is not a directory") }
            return
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw StartError(description: "cannot create \(path): \(error.localizedDescription)")
        }
    }

    /// Writes the address atomically (temporary file, then rename), mode 0600.
    static func writeAddressFile(_ path: String, address: String) throws {
        let temporary = path + ".\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StartError(description: "cannot write the bus address file \(temporary): \(errnoText())") }
        let bytes = Array((address + "\n").utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        fchmod(fd, 0o600)
        close(fd)
        guard written == bytes.count, rename(temporary, path) == 0 else {
            let reason = errnoText()
            unlink(temporary)
            throw StartError(description: "cannot write the bus address file \(path): \(reason)")
        }
    }

    /// The first `name` found in `$PATH`, `/usr/bin` or `/bin` that is executable.
    static func findExecutable(_ name: String, environment: [String: String]) -> String? {
        let path = (environment["PATH"] ?? "").split(separator: ":").map(String.init) + ["/usr/bin", "/bin"]
        for dir in path where dir.hasPrefix("/") {
            let candidate = dir + "/" + name
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

private func errnoText() -> String { String(cString: strerror(errno)) }

/// Calls `body` with a NULL-terminated C array of copies of `strings`.
private func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for p in pointers { free(p) } }
    // Invariant: the array holds at least the terminating nil, so it has a base address.
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
