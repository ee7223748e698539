// vigil-bench smoke [NAME...] [--timeout SECONDS]: every benchmark (or the
// NAMEs) in its brief form (`Benchmark.Smoke` in main.swift: small counts,
// short windows, one round), one after another, each as a child process of
// its own against the host of hostBuildDirectory(). It checks that each
// runs to its end and prints its figures, never what the figures are (a
// debug build's differ): a benchmark passes when it exits 0 having printed
// something on stdout. Prints each one's name, status and seconds, and a
// summary; exits 1 when any failed. So a CI step keeps every benchmark
// running: `Scripts/bench --debug smoke` (Benchmarks/README.md).
import Foundation
import Glibc
import VigilHost
import VigilKit
import VigilTestSupport

/// One benchmark's outcome in a smoke run.
private struct SmokeOutcome {
    var name: String
    var status: String
    var passed: Bool
    var skipped = false
    var seconds: Double = 0
}

func runSmoke(_ args: [String], forms: [String: Benchmark.Smoke]) async -> Int32 {
    let usage = "usage: vigil-bench smoke [NAME...] [--timeout SECONDS]   (default: every benchmark, 120 s each at most)"
    var names: [String] = []
    var timeout = 120.0
    var rest = args[...]
    while let argument = rest.popFirst() {
        switch argument {
        case "--help":
            say(usage)
            return 0
        case "--timeout":
            guard let value = rest.popFirst().flatMap(Double.init), value > 0 else {
                say("--timeout needs a number of seconds\n\(usage)")
                return 2
            }
            timeout = value
        case _ where forms[argument] != nil:
            names.append(argument)
        default:
            say("unknown benchmark or option: \(argument)\n\(usage)\nbenchmarks: \(forms.keys.sorted().joined(separator: ", "))")
            return 2
        }
    }
    if names.isEmpty { names = forms.keys.sorted() }
    let host: String
    do {
        host = try hostBuildDirectory().path
    } catch {
        say("vigil-bench smoke: \(error)")
        return 1
    }
    guard let me = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") else {
        say("vigil-bench smoke: cannot read /proc/self/exe")
        return 1
    }
    #if DEBUG
    let build = "debug"
    #else
    let build = "release"
    #endif
    say("smoke: \(names.count) benchmarks in their brief forms, each at most \(Int(timeout)) s; host \(host); \(build) vigil-bench")
    say("(figures are printed, not checked: a benchmark passes when it runs to its end, exits 0 and prints them)")
    var environment = ProcessInfo.processInfo.environment
    environment["VIGIL_BENCH_HOST"] = host
    var outcomes: [SmokeOutcome] = []
    let start = ContinuousClock.now
    for (index, name) in names.enumerated() {
        let form = forms[name] ?? .skipped("unknown")
        switch form {
        case .skipped(let reason):
            say("\n== smoke \(index + 1)/\(names.count): \(name): skipped (\(reason))")
            outcomes.append(SmokeOutcome(name: name, status: "skipped: \(reason)", passed: true, skipped: true))
        case .runs(let make):
            let runs = make(host)
            for arguments in runs {
                // A second form is named by what it adds to the first.
                let label = ([name] + arguments.filter { !(runs.first ?? []).contains($0) }).joined(separator: " ")
                say("\n== smoke \(index + 1)/\(names.count): vigil-bench \(([name] + arguments).joined(separator: " "))")
                var outcome = runSmokeChild(me, [name] + arguments, environment: environment, timeout: timeout)
                outcome.name = label
                say("== \(label): \(outcome.status) in \(String(format: "%.1f", outcome.seconds)) s")
                outcomes.append(outcome)
            }
        }
    }
    let total = (ContinuousClock.now - start).seconds
    let failed = outcomes.filter { !$0.passed }
    say("\nsmoke summary (host \(host), \(build) vigil-bench):")
    for outcome in outcomes {
        let seconds = outcome.skipped ? "" : String(format: "%6.1f s", outcome.seconds)
        say("  " + outcome.name.padding(toLength: 18, withPad: " ", startingAt: 0) + seconds.padding(toLength: 10, withPad: " ", startingAt: 0) + outcome.status)
    }
    say(String(format: "smoke: %d ok, %d failed, %d skipped, %.1f s in all", outcomes.filter { $0.passed && !$0.skipped }.count,
               failed.count, outcomes.filter(\.skipped).count, total))
    if !failed.isEmpty { say("failed: \(failed.map(\.name).joined(separator: ", "))") }
    return failed.isEmpty ? 0 : 1
}

/// Writes a line to stdout at once (unbuffered, so it stays in order with
/// the children's output).
private func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Runs `program arguments` in a process group of its own, its stdout
/// copied to ours (counted), its stderr ours; stops the group after
/// `timeout` seconds. What is left of the group once the benchmark exited
/// (a child it did not stop) is named and killed.
private func runSmokeChild(_ program: String, _ arguments: [String], environment: [String: String], timeout: Double) -> SmokeOutcome {
    var outcome = SmokeOutcome(name: "", status: "", passed: false)
    var fds: [Int32] = [-1, -1]
    guard pipe(&fds) == 0, fcntl(fds[0], F_SETFD, FD_CLOEXEC) == 0, fcntl(fds[1], F_SETFD, FD_CLOEXEC) == 0 else {
        outcome.status = "failed: pipe: \(String(cString: strerror(errno)))"
        return outcome
    }
    let (readEnd, writeEnd) = (fds[0], fds[1])
    defer { close(readEnd) }
    let started = ContinuousClock.now
    let spawned = Result {
        try spawnQuietly(program, arguments, environment: environment, newProcessGroup: true) { actions in
            posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        }
    }
    close(writeEnd)
    let pid: pid_t
    switch spawned {
    case let .success(child): pid = child
    case let .failure(error):
        outcome.status = "failed: \(error.localizedDescription)"
        return outcome
    }

    var printed = 0
    var buffer = [UInt8](repeating: 0, count: 65_536)
    /// Copies what the pipe holds now (waiting up to `milliseconds`); false at EOF.
    func copyOutput(waiting milliseconds: Int32) -> Bool {
        var descriptor = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, milliseconds) > 0 else { return true }
        let count = buffer.withUnsafeMutableBytes { read(readEnd, $0.baseAddress, $0.count) }
        guard count > 0 else { return count < 0 && errno == EINTR }
        printed += count
        buffer.withUnsafeBytes { FileHandle.standardOutput.write(Data($0.prefix(count))) }
        return true
    }
    var status: Int32 = 0
    var timedOut = false
    var open = true
    let deadline = started + .milliseconds(Int64(timeout * 1000))
    while waitpid(pid, &status, WNOHANG) == 0 {
        if open { open = copyOutput(waiting: 200) } else { usleep(100_000) }
        if !timedOut, ContinuousClock.now > deadline {
            timedOut = true
            say("== smoke: \(arguments.first ?? "") still running after \(Int(timeout)) s: SIGTERM to its process group")
            kill(-pid, SIGTERM)
            // SIGKILL if it does not stop within 5 s.
            let grace = ContinuousClock.now + .seconds(5)
            while waitpid(pid, &status, WNOHANG) == 0 {
                if ContinuousClock.now > grace { kill(-pid, SIGKILL); waitpid(pid, &status, 0); break }
                if open { open = copyOutput(waiting: 100) } else { usleep(100_000) }
            }
            break
        }
    }
    outcome.seconds = (ContinuousClock.now - started).seconds
    // Whatever is still in the pipe (a leftover child may hold it open: do not wait for EOF).
    while open, copyOutput(waiting: 0) {
        var descriptor = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
        if poll(&descriptor, 1, 0) <= 0 { break }
    }
    let left = leftoverProcesses(group: pid)
    if !left.isEmpty {
        say("== smoke: \(arguments.first ?? "") left \(left.count) process(es) running: \(left.joined(separator: ", ")); killed")
        kill(-pid, SIGKILL)
    }

    let signal = status & 0x7f, code = (status >> 8) & 0xff
    if timedOut {
        outcome.status = "FAILED: timed out after \(Int(timeout)) s"
    } else if signal != 0 {
        outcome.status = "FAILED: killed by signal \(signal)"
    } else if code != 0 {
        outcome.status = "FAILED: exit \(code)"
    } else if printed == 0 {
        outcome.status = "FAILED: exit 0 but no figures on stdout"
    } else {
        outcome.status = "ok (exit 0)"
        outcome.passed = true
    }
    return outcome
}

/// The live (not zombie) processes of process group `group`, as "pid (comm)",
/// after up to a second for the ones already stopping to go.
private func leftoverProcesses(group: pid_t) -> [String] {
    var left: [String] = []
    for attempt in 0..<10 {
        left = []
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry),
                  let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                  let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")")
            else { continue }
            // After "(comm)": state, ppid, pgrp.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 2, fields[0] != "Z", Int32(fields[2]) == group else { continue }
            left.append("\(pid) (\(stat[stat.index(after: open)..<close]))")
        }
        if left.isEmpty || attempt == 9 { break }
        usleep(100_000)
    }
    return left
}
