/// A command to run on an event: an argv array (no shell unless the user
/// writes `["sh", "-c", "..."]`), run in its own process group with a clean
/// environment plus `VIGIL_*` variables.
public struct HookCommand: Sendable, Hashable {
    public var argv: [String]
    /// The whole process group is killed (SIGTERM, then SIGKILL) when it overruns.
    public var timeout: Duration
    /// Extra environment, added to `PATH`, `HOME`, `LANG` and the `VIGIL_*` variables.
    public var environment: [String: String]
    /// Written to the command's stdin, which is then closed. Nil: /dev/null.
    public var stdin: [UInt8]?
    /// Working directory; nil keeps the host's.
    public var workingDirectory: String?

    public init(argv: [String], timeout: Duration = .seconds(30), environment: [String: String] = [:], stdin: [UInt8]? = nil, workingDirectory: String? = nil) {
        self.argv = argv
        self.timeout = timeout
        self.environment = environment
        self.stdin = stdin
        self.workingDirectory = workingDirectory
    }
}

/// How a hook ended.
public enum HookExit: Sendable, Hashable, CustomStringConvertible {
    case exited(Int32)
    case signaled(Int32)
    /// Overran its timeout; its process group was killed.
    case timedOut
    /// Could not be started (no such file, not executable, ...).
    case failedToStart(String)

    public var succeeded: Bool { self == .exited(0) }

    public var description: String {
        switch self {
        case .exited(let code): "exited with status \(code)"
        case .signaled(let sig): "killed by signal \(sig)"
        case .timedOut: "timed out"
        case .failedToStart(let why): "failed to start: \(why)"
        }
    }
}

public struct HookResult: Sendable, Hashable {
    public var exit: HookExit
    /// Combined stdout and stderr, capped in size (the cap is noted in the text).
    public var output: String
    public var duration: Duration
    /// User plus system CPU time of the process and the children it waited
    /// for, from its rusage (`wait4`); zero when it did not start.
    public var cpuTime: Duration

    public init(exit: HookExit, output: String, duration: Duration, cpuTime: Duration = .zero) {
        self.exit = exit
        self.output = output
        self.duration = duration
        self.cpuTime = cpuTime
    }
}

public protocol HookRunning: Sendable {
    /// Runs `command` for `event` and waits for it. Sets `VIGIL_STRATEGY`,
    /// `VIGIL_EVENT` and, for each entry of `variables`, `VIGIL_<KEY>`.
    /// Cancelling the calling task kills the command's process group.
    func run(_ command: HookCommand, event: String, variables: [String: String]) async -> HookResult
}
