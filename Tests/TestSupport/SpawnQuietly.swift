import Foundation
import Glibc

/// Starts `program` with posix_spawn: stdin from /dev/null, stdout and stderr
/// to the given files (default /dev/null), no blocked signals and default
/// dispositions for SIGINT, SIGTERM, SIGPIPE and SIGCHLD, exactly
/// `environment`. Not Foundation's `Process`: pulseaudio closes its inherited
/// descriptors at start, which `Process` takes for an exit (and then blocks
/// in waitpid), and `Process` children inherit the caller's blocked signals.
/// Returns the pid; the caller kills and reaps it.
public func spawnQuietly(_ program: String, _ arguments: [String], environment: [String: String],
                         stdout: String = "/dev/null", stderr: String = "/dev/null") throws -> pid_t {
    try spawnQuietly(program, arguments, environment: environment) { actions in
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    }
}

/// The same, with the child's output set up by `outputs` (descriptors 1 and
/// 2; those it leaves alone are inherited), and with `newProcessGroup` in a
/// process group of its own (its pid), which `kill(-pid, ...)` ends whole.
public func spawnQuietly(_ program: String, _ arguments: [String], environment: [String: String], newProcessGroup: Bool = false,
                         outputs: (inout posix_spawn_file_actions_t) -> Void) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    outputs(&actions)
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for sig in [SIGINT, SIGTERM, SIGPIPE, SIGCHLD] { sigaddset(&defaults, sig) }
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    var flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
    if newProcessGroup {
        posix_spawnattr_setpgroup(&attributes, 0)
        flags |= POSIX_SPAWN_SETPGROUP
    }
    posix_spawnattr_setflags(&attributes, Int16(flags))
    let argv = ([program] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for p in argv + envp { free(p) } }
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, program, &actions, &attributes, argv, envp)
    guard rc == 0 else {
        throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "cannot start \(program): \(String(cString: strerror(rc)))"])
    }
    return pid
}
