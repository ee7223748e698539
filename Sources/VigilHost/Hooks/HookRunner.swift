import CTimer
import Glibc
import VigilKit

/// Runs strategies' hook commands as real processes.
///
/// Each command is an argv array (no shell unless the user writes
/// `["sh", "-c", "..."]`), spawned with `posix_spawn` in its own process
/// group, with an empty signal mask, default signal dispositions, only
/// stdin/stdout/stderr open and a clean environment (see
/// ``environment(for:event:variables:)``). Its combined stdout and stderr are
/// captured up to `outputCap` bytes and logged line by line; when it overruns
/// its timeout the whole process group gets SIGTERM, then SIGKILL after a
/// grace period, and the result is `.timedOut`. Cancelling the calling task
/// kills the group with SIGKILL at once.
///
/// Creating a runner sets the host's SIGPIPE disposition to ignore (once per
/// process): writing a hook's stdin to a child that has exited must fail with
/// EPIPE, not kill the host. Children get SIGPIPE back at its default.
///
/// Safe to use from many tasks at once: every call owns its own process,
/// pipes and dispatch queue.
public final class HookRunner: HookRunning {
    /// The strategy instance name, passed as `VIGIL_STRATEGY`.
    public let strategy: String
    public let log: Logger
    /// Most bytes of combined output kept per run; the rest is read and dropped.
    public let outputCap: Int
    /// `PATH` for hooks (unless a command's own environment sets one); bare
    /// program names are looked up on it.
    public let basePath: String
    /// Longest wait between SIGTERM and SIGKILL after a timeout (never more
    /// than half the command's timeout).
    public let killGrace: Duration
    private let home: String
    private let lang: String
    /// Where each command's CPU time goes (its strategy's ChildCPUUsec).
    private let costs: StrategyCosts?

    private static let sigpipeIgnored: Bool = {
        _ = signal(SIGPIPE, SIG_IGN)
        return true
    }()

    public init(
        strategy: String,
        log: Logger,
        outputCap: Int = 64 * 1024,
        basePath: String = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        killGrace: Duration = .seconds(2),
        costs: StrategyCosts? = nil
    ) {
        _ = HookRunner.sigpipeIgnored
        self.costs = costs
        self.strategy = strategy
        self.log = log
        self.outputCap = outputCap
        self.basePath = basePath
        self.killGrace = killGrace
        self.home = HookRunner.hostVariable("HOME") ?? HookRunner.passwdHome() ?? "/"
        self.lang = HookRunner.hostVariable("LANG") ?? "C.UTF-8"
    }

    // MARK: - Environment

    /// The complete environment `command` runs with for `event`: `PATH`
    /// (``basePath``), `HOME` and `LANG` (the host's, else the user's home
    /// directory and `C.UTF-8`), then `command.environment` (which may
    /// override those three), then `VIGIL_STRATEGY`, `VIGIL_EVENT` and one
    /// `VIGIL_<KEY>` per entry of `variables`, which the command cannot
    /// override. Keys are upper-cased and every character outside `A-Z0-9_`
    /// becomes `_`. Nothing else of the host's environment is passed on.
    public func environment(for command: HookCommand, event: String, variables: [String: String]) -> [String: String] {
        var environment = ["PATH": basePath, "HOME": home, "LANG": lang]
        for (key, value) in command.environment where HookRunner.isValidVariableName(key) {
            environment[key] = value
        }
        for (key, value) in variables {
            let name = HookRunner.vigilVariableName(key)
            if name != "VIGIL_" { environment[name] = value }
        }
        environment["VIGIL_STRATEGY"] = strategy
        environment["VIGIL_EVENT"] = event
        return environment
    }

    /// `VIGIL_` plus `key` upper-cased with every character outside
    /// `A-Z0-9_` replaced by `_` (`"next-wake"` becomes `VIGIL_NEXT_WAKE`).
    public static func vigilVariableName(_ key: String) -> String {
        let sanitized = key.uppercased().unicodeScalars.map { scalar -> Character in
            switch scalar {
            case "A"..."Z", "0"..."9", "_": Character(scalar)
            default: "_"
            }
        }
        return "VIGIL_" + String(sanitized)
    }

    private static func isValidVariableName(_ key: String) -> Bool {
        !key.isEmpty && !key.contains("=") && !key.utf8.contains(0)
    }

    // MARK: - Running

    public func run(_ command: HookCommand, event: String, variables: [String: String]) async -> HookResult {
        let started = ContinuousClock.now
        let name = command.argv.first.map(HookRunner.baseName) ?? "hook"
        let result: HookResult
        switch launch(command, event: event, variables: variables, started: started) {
        case .failure(let failure):
            result = HookResult(exit: .failedToStart(failure.reason), output: "", duration: ContinuousClock.now - started)
        case .success(let process):
            result = await process.result()
            costs?.childCPU(result.cpuTime, of: strategy)
        }
        record(result, name: name, event: event)
        return result
    }

    struct LaunchFailure: Error {
        var reason: String
    }

    private func launch(
        _ command: HookCommand, event: String, variables: [String: String], started: ContinuousClock.Instant
    ) -> Result<HookProcess, LaunchFailure> {
        guard let program = command.argv.first, !program.isEmpty else {
            return .failure(LaunchFailure(reason: "empty command: argv has no program"))
        }
        if Task.isCancelled {
            return .failure(LaunchFailure(reason: "cancelled before it started"))
        }
        let environment = environment(for: command, event: event, variables: variables)
        let path: String
        switch HookRunner.resolve(program, searchPath: environment["PATH"] ?? "") {
        case .success(let found): path = found
        case .failure(let failure): return .failure(failure)
        }
        if let directory = command.workingDirectory {
            var info = stat()
            if stat(directory, &info) != 0 {
                return .failure(LaunchFailure(reason: "working directory \(directory): \(HookRunner.errorText(errno))"))
            }
            if info.st_mode & S_IFMT != S_IFDIR {
                return .failure(LaunchFailure(reason: "working directory \(directory): not a directory"))
            }
        }

        // Every descriptor is close-on-exec so that hooks started at the same
        // time by other tasks never inherit one another's pipe ends.
        var outputPipe: [Int32] = [-1, -1]
        guard vigil_pipe_cloexec(&outputPipe) == 0 else {
            return .failure(LaunchFailure(reason: "cannot create output pipe: \(HookRunner.errorText(errno))"))
        }
        var stdinRead: Int32 = -1
        var stdinWrite: Int32 = -1
        if command.stdin != nil {
            var stdinPipe: [Int32] = [-1, -1]
            guard vigil_pipe_cloexec(&stdinPipe) == 0 else {
                let error = errno
                close(outputPipe[0]); close(outputPipe[1])
                return .failure(LaunchFailure(reason: "cannot create stdin pipe: \(HookRunner.errorText(error))"))
            }
            stdinRead = stdinPipe[0]
            stdinWrite = stdinPipe[1]
        }
        // Without stdin the child opens /dev/null itself (stdinRead -1): a
        // descriptor of ours could be closed and its number reused by another
        // thread between open and spawn (seen once in CI: `wc -c` counted
        // 142 bytes of someone else's pipe).

        let argv = command.argv
        let envp = environment.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        var pid: pid_t = 0
        let error = withCStringArray(argv) { argvPointer in
            withCStringArray(envp) { envpPointer in
                if let directory = command.workingDirectory {
                    return vigil_spawn(path, argvPointer, envpPointer, stdinRead, outputPipe[1], directory, &pid)
                }
                return vigil_spawn(path, argvPointer, envpPointer, stdinRead, outputPipe[1], nil, &pid)
            }
        }
        // The child has its own copies now (or never started).
        if stdinRead >= 0 { close(stdinRead) }
        close(outputPipe[1])
        guard error == 0 else {
            close(outputPipe[0])
            if stdinWrite >= 0 { close(stdinWrite) }
            return .failure(LaunchFailure(reason: "\(path): \(HookRunner.errorText(error))"))
        }
        return .success(HookProcess(
            pid: pid, outputFD: outputPipe[0], stdinFD: stdinWrite, stdin: command.stdin ?? [],
            outputCap: outputCap, timeout: command.timeout, killGrace: killGrace, started: started
        ))
    }

    private func record(_ result: HookResult, name: String, event: String) {
        var lines = result.output.split(separator: "\n", omittingEmptySubsequences: false)
        if lines.last?.isEmpty == true { lines.removeLast() }
        for line in lines {
            log.info("\(name): \(line)")
        }
        let milliseconds = result.duration.components.seconds * 1000
            + result.duration.components.attoseconds / 1_000_000_000_000_000
        let summary = "hook \(name) for \(event) \(result.exit) after \(milliseconds) ms"
        if result.exit.succeeded {
            log.info("\(summary)")
        } else {
            log.warning("\(summary)")
        }
    }

    // MARK: - Program lookup

    /// Where `program` is: itself when it contains a `/` (relative to the
    /// working directory), else the first executable regular file named
    /// `program` in the absolute directories of `searchPath` (relative
    /// entries are skipped: they would depend on the host's directory).
    static func resolve(_ program: String, searchPath: String) -> Result<String, LaunchFailure> {
        if program.contains("/") { return .success(program) }
        var sawNotExecutable: String?
        for directory in searchPath.split(separator: ":") where directory.hasPrefix("/") {
            let candidate = directory.hasSuffix("/") ? "\(directory)\(program)" : "\(directory)/\(program)"
            var info = stat()
            guard stat(candidate, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            if access(candidate, X_OK) == 0 { return .success(candidate) }
            if sawNotExecutable == nil { sawNotExecutable = candidate }
        }
        if let candidate = sawNotExecutable {
            return .failure(LaunchFailure(reason: "\(candidate): \(errorText(EACCES))"))
        }
        return .failure(LaunchFailure(reason: "\(program): command not found on PATH \(searchPath)"))
    }

    // MARK: - Helpers

    static func baseName(_ path: String) -> String {
        path.split(separator: "/").last.map(String.init) ?? path
    }

    static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }

    private static func hostVariable(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let text = String(cString: value)
        return text.isEmpty ? nil : text
    }

    private static func passwdHome() -> String? {
        guard let entry = getpwuid(getuid()), let directory = entry.pointee.pw_dir else { return nil }
        return String(cString: directory)
    }
}

/// Calls `body` with a NULL-terminated array of C strings copied from `strings`.
private func withCStringArray<R>(
    _ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R
) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for pointer in pointers { free(pointer) } }
    return pointers.withUnsafeBufferPointer { buffer in
        // Invariant: the array is never empty (the NULL terminator), so it
        // has a base address.
        body(buffer.baseAddress!)
    }
}
