import CTimer
import Dispatch
import Foundation
import Glibc
import VigilKit

/// A `dbus-daemon` that vigild started because there was no session bus,
/// kept as its child until ``stop()``.
///
/// Started with `vigil_spawn` (own process group, clean signal state):
/// `dbus-daemon --session --nofork --print-address=1 --address=unix:dir=DIR`.
/// Its stdout and stderr share one pipe: the address line is read from it
/// synchronously at start (bounded by a timeout); afterwards a read source
/// on a private serial queue forwards anything the daemon prints to the log,
/// and a pidfd source notices when it exits. Nothing polls.
public final class PrivateBus: @unchecked Sendable {
    // Invariant: the `var`s are read and written only on `queue`; the `let`s
    // never change after init. That makes the unchecked Sendable sound.
    private let queue = DispatchQueue(label: "vigil.private-bus")
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
    private var outputSource: (any DispatchSourceRead)?
    private var exitSource: (any DispatchSourceRead)?
    private var pending = [UInt8]()
    private var exitStatus: Int32?
    private var stopping = false
    private var exitWaiters: [CheckedContinuation<Void, Never>] = []

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
        bus.queue.sync { bus.watch(output: readEnd) }
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
        bus.queue.sync { bus.watchExit(pidfd) }
        return bus
    }

    /// Stops the daemon (SIGTERM, SIGKILL after `grace`), reaps it, and
    /// removes the address file if it still names this daemon. Idempotent.
    public func stop(grace: Duration = .seconds(3)) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async {
                self.stopping = true
                if self.exitStatus != nil {
                    continuation.resume()
                    return
                }
                self.exitWaiters.append(continuation)
                kill(self.pid, SIGTERM)
                let timer = DispatchSource.makeTimerSource(queue: self.queue)
                timer.schedule(deadline: .now() + .milliseconds(Int(grace.components.seconds * 1000 + grace.components.attoseconds / 1_000_000_000_000_000)))
                timer.setEventHandler {
                    timer.cancel()
                    if self.exitStatus == nil {
                        self.log.warning("the private dbus-daemon (pid \(self.pid)) ignored SIGTERM; killing it")
                        kill(self.pid, SIGKILL)
                    }
                }
                // The timer keeps itself alive until cancelled; the exit
                // handler cancels it when the daemon went first.
                self.exitTimer = timer
                timer.resume()
            }
        }
        if BusLocator.readAddressFile(addressFile) == address {
            unlink(addressFile)
        }
    }

    private var exitTimer: (any DispatchSourceTimer)?

    /// True while the daemon has not exited.
    public var isRunning: Bool {
        queue.sync { exitStatus == nil }
    }

    // MARK: - On queue

    private func watch(output fd: Int32) {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        // Handlers hold `self` strongly: the bus object lives as long as the
        // daemon can still produce events; both sources are cancelled when it exits.
        source.setEventHandler { self.drain(fd) }
        source.setCancelHandler { close(fd) }
        outputSource = source
        source.resume()

        let pidfd = vigil_pidfd_open(pid)
        if pidfd >= 0 {
            _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
            watchExit(pidfd)
        }
        // Without pidfd (Linux < 5.3) the exit shows as end-of-file on the
        // output pipe, which the daemon holds until it exits.
    }

    private func watchExit(_ pidfd: Int32) {
        let exit = DispatchSource.makeReadSource(fileDescriptor: pidfd, queue: queue)
        exit.setEventHandler { self.reap() }
        exit.setCancelHandler { close(pidfd) }
        exitSource = exit
        exit.resume()
    }

    private func drain(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                pending.append(contentsOf: buffer[0..<n])
                while let nl = pending.firstIndex(of: 0x0A) {
                    let line = String(decoding: pending[0..<nl], as: UTF8.self)
                    pending.removeSubrange(0...nl)
                    if !line.isEmpty { log.info("dbus-daemon: \(Self.shortLine(line))") }
                }
                continue
            }
            if n < 0 && (errno == EINTR) { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            // End of file: the daemon (and anything it spawned) closed it.
            outputSource?.cancel()
            outputSource = nil
            if exitSource == nil { reap() }
            return
        }
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

    private func reap() {
        guard exitStatus == nil else { return }
        var status: Int32 = 0
        if isChild {
            var got: pid_t
            repeat { got = waitpid(pid, &status, exitSource == nil ? 0 : WNOHANG) } while got < 0 && errno == EINTR
            guard got == pid else { return }
        }
        // An adopted daemon's pidfd became readable: it exited; its status
        // belongs to its parent.
        exitStatus = status
        exitSource?.cancel()
        exitSource = nil
        exitTimer?.cancel()
        exitTimer = nil
        if !stopping {
            let how = !isChild ? "exited" : vigil_wifsignaled(status) != 0 ? "was killed by signal \(vigil_wtermsig(status))" : "exited with status \(vigil_wexitstatus(status))"
            log.error("the private dbus-daemon (pid \(pid)) \(how); clients cannot reach this host until vigild has started a new one and reconnected")
        }
        let waiters = exitWaiters
        exitWaiters.removeAll()
        for waiter in waiters { waiter.resume() }
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
