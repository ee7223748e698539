import CTimer
import Dispatch
import Foundation
import Glibc
import Testing
import VigilKit
import VigilKitTesting
@testable import VigilHost
import VigilTestSupport

/// Real processes through the real runner; timeouts are short so the suite
/// stays fast, and the time limit turns a runner that hangs into a failure.
@Suite(.timeLimit(.minutes(1))) struct HookRunnerTests {
    private func makeRunner(outputCap: Int = 64 * 1024, killGrace: Duration = .seconds(2)) -> (HookRunner, WaitableLog<LogLine>) {
        let sink = WaitableLog<LogLine>()
        let runner = HookRunner(
            strategy: "nightly-sync", log: sink.logger("nightly-sync"),
            outputCap: outputCap, killGrace: killGrace
        )
        return (runner, sink)
    }

    private func run(_ runner: HookRunner, _ argv: [String], timeout: Duration = .seconds(10), stdin: [UInt8]? = nil,
                     environment: [String: String] = [:], workingDirectory: String? = nil,
                     event: String = "wake", variables: [String: String] = [:]) async -> HookResult {
        await runner.run(
            HookCommand(argv: argv, timeout: timeout, environment: environment, stdin: stdin, workingDirectory: workingDirectory),
            event: event, variables: variables
        )
    }

    @Test func recordsExitStatus() async {
        let (runner, _) = makeRunner()
        #expect(await run(runner, ["/bin/sh", "-c", "exit 0"]).exit == .exited(0))
        let failing = await run(runner, ["/bin/sh", "-c", "echo failing; exit 7"])
        #expect(failing.exit == .exited(7))
        #expect(failing.output == "failing\n")
        #expect(!failing.exit.succeeded)
    }

    @Test func recordsTerminatingSignal() async {
        let (runner, _) = makeRunner()
        let result = await run(runner, ["/bin/sh", "-c", "kill -USR1 $$"])
        #expect(result.exit == .signaled(SIGUSR1))
    }

    @Test func timeoutKillsTheWholeProcessGroup() async throws {
        let (runner, sink) = makeRunner()
        let result = await run(runner, ["/bin/sh", "-c", "sleep 100 & echo $!; sleep 100"], timeout: .milliseconds(300))
        #expect(result.exit == .timedOut)
        #expect(result.duration < .seconds(3))
        let grandchild = try #require(pid_t(result.output.trimmingCharacters(in: .whitespacesAndNewlines)))
        // The output pipe reached EOF, so the grandchild (which held it) has
        // exited; it may linger as a zombie of the container's init.
        #expect(processIsGone(grandchild))
        #expect(sink.entries.contains { $0.hasPrefix("warning nightly-sync: hook sh for wake timed out") })
    }

    @Test func backgroundChildHoldingOutputIsKilledAtTimeout() async throws {
        let (runner, _) = makeRunner()
        // The leader exits at once, but its background child keeps stdout open:
        // the hook is not over until the timeout kills the group.
        let result = await run(runner, ["/bin/sh", "-c", "sleep 100 & echo $!"], timeout: .milliseconds(300))
        #expect(result.exit == .timedOut)
        let grandchild = try #require(pid_t(result.output.trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(processIsGone(grandchild))
    }

    @Test func sigkillFollowsWhenSigtermIsIgnored() async {
        let (runner, _) = makeRunner(killGrace: .milliseconds(100))
        let result = await run(runner, ["/bin/sh", "-c", "trap '' TERM; sleep 100 & wait"], timeout: .milliseconds(200))
        #expect(result.exit == .timedOut)
        #expect(result.duration < .seconds(2))
    }

    @Test func environmentIsCleanPlusVigilVariables() async throws {
        setenv("VIGIL_HOOK_TEST_LEAK", "must-not-appear", 1)
        setenv("HOOK_TEST_SECRET", "must-not-appear", 1)
        defer {
            unsetenv("VIGIL_HOOK_TEST_LEAK")
            unsetenv("HOOK_TEST_SECRET")
        }
        let (runner, _) = makeRunner()
        let result = await run(
            runner, ["/usr/bin/env"], environment: ["EXTRA_SETTING": "on"],
            event: "expiry", variables: ["lease-id": "42", "reason": "budget ran out"]
        )
        #expect(result.exit == .exited(0))
        var seen: [String: String] = [:]
        for line in result.output.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            seen[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
        }
        #expect(Set(seen.keys) == [
            "PATH", "HOME", "LANG", "EXTRA_SETTING",
            "VIGIL_STRATEGY", "VIGIL_EVENT", "VIGIL_LEASE_ID", "VIGIL_REASON",
        ])
        #expect(seen["PATH"] == runner.basePath)
        #expect(seen["VIGIL_STRATEGY"] == "nightly-sync")
        #expect(seen["VIGIL_EVENT"] == "expiry")
        #expect(seen["VIGIL_LEASE_ID"] == "42")
        #expect(seen["VIGIL_REASON"] == "budget ran out")
        #expect(seen["EXTRA_SETTING"] == "on")
    }

    @Test func commandCannotOverrideHostVigilVariables() {
        let (runner, _) = makeRunner()
        let environment = runner.environment(
            for: HookCommand(argv: ["true"], environment: ["VIGIL_EVENT": "forged", "PATH": "/opt/bin"]),
            event: "wake", variables: ["Next Wake!": "5"]
        )
        #expect(environment["VIGIL_EVENT"] == "wake")
        #expect(environment["PATH"] == "/opt/bin")
        #expect(environment["VIGIL_NEXT_WAKE_"] == "5")
    }

    @Test func childStartsWithDefaultSignalsAndOnlyStdio() async {
        let (runner, _) = makeRunner()
        // The runner ignores SIGPIPE in the host; the child must not inherit that.
        let signals = await run(runner, ["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"])
        let masks = Dictionary(uniqueKeysWithValues: signals.output.split(separator: "\n").map { line in
            let parts = line.split(separator: ":").map { $0.trimmingCharacters(in: .whitespaces) }
            return (parts[0], UInt64(parts[1], radix: 16) ?? .max)
        })
        #expect(masks["SigBlk"] == 0)
        let sigpipeBit: UInt64 = 1 << (UInt64(SIGPIPE) - 1)
        #expect(masks["SigIgn"].map { $0 & sigpipeBit } == 0)

        // A descriptor the host opened without close-on-exec must not leak in either.
        let hostFD = open("/dev/null", O_RDONLY)
        defer { close(hostFD) }
        let descriptors = await run(runner, ["/bin/sh", "-c", "ls /proc/$$/fd"])
        #expect(descriptors.output.split(separator: "\n") == ["0", "1", "2"])
    }

    @Test func stdinIsDelivered() async {
        let (runner, _) = makeRunner()
        let result = await run(runner, ["/bin/cat"], stdin: Array("incoming bytes\nsecond line".utf8))
        #expect(result.exit == .exited(0))
        #expect(result.output == "incoming bytes\nsecond line")

        // More than a pipe buffer holds, written as the child reads it.
        let large = [UInt8](repeating: 0x61, count: 1 << 20)
        let counted = await run(runner, ["/usr/bin/wc", "-c"], stdin: large)
        #expect(counted.output.trimmingCharacters(in: .whitespacesAndNewlines) == "1048576")
    }

    @Test func childThatIgnoresStdinDoesNotHurtTheHost() async {
        let (runner, _) = makeRunner()
        let result = await run(runner, ["true"], stdin: [UInt8](repeating: 0x62, count: 1 << 20))
        #expect(result.exit == .exited(0))
    }

    @Test func noStdinReadsEndOfFile() async {
        let (runner, _) = makeRunner()
        let result = await run(runner, ["/usr/bin/wc", "-c"])
        #expect(result.output.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
    }

    @Test func outputIsCappedWithoutBlockingTheChild() async {
        let (runner, sink) = makeRunner(outputCap: 1000)
        let result = await run(
            runner, ["/bin/sh", "-c", "head -c 10000000 /dev/zero | tr '\\000' a; echo done >&2"],
            timeout: .seconds(20)
        )
        #expect(result.exit == .exited(0))
        #expect(result.output == String(repeating: "a", count: 1000) + "\n[output truncated after 1000 bytes]")
        #expect(result.duration < .seconds(10))
        #expect(sink.entries.contains("info nightly-sync: sh: [output truncated after 1000 bytes]"))
    }

    @Test func outputLinesAreLoggedWithProgramName() async {
        let (runner, sink) = makeRunner()
        _ = await run(runner, ["/bin/sh", "-c", "echo first; echo second >&2"])
        let entries = sink.entries
        #expect(entries.contains("info nightly-sync: sh: first"))
        #expect(entries.contains("info nightly-sync: sh: second"))
        #expect(entries.contains { $0.hasPrefix("info nightly-sync: hook sh for wake exited with status 0 after ") })
    }

    @Test func missingOrUnusableProgramFailsToStart() async throws {
        let (runner, sink) = makeRunner()
        let missing = await run(runner, ["/nonexistent/vigil-hook"])
        #expect(missing.exit == .failedToStart("/nonexistent/vigil-hook: No such file or directory"))

        let unknown = await run(runner, ["vigil-no-such-command"])
        #expect(unknown.exit == .failedToStart("vigil-no-such-command: command not found on PATH \(runner.basePath)"))

        let directory = try TemporaryDirectory()
        let script = directory.path + "/not-executable"
        try "#!/bin/sh\necho hi\n".write(toFile: script, atomically: true, encoding: .utf8)
        chmod(script, 0o644)
        let denied = await run(runner, [script])
        #expect(denied.exit == .failedToStart("\(script): Permission denied"))

        let empty = await run(runner, [])
        #expect(empty.exit == .failedToStart("empty command: argv has no program"))
        #expect(sink.entries.contains { $0.contains("failed to start: /nonexistent/vigil-hook: No such file or directory") })
    }

    @Test func bareNameIsResolvedOnTheCleanPath() async throws {
        let (runner, _) = makeRunner()
        #expect(await run(runner, ["true"]).exit == .exited(0))
        #expect(await run(runner, ["false"]).exit == .exited(1))

        // A program only on the command's own PATH is found there, not on the host's.
        let directory = try TemporaryDirectory()
        let script = directory.path + "/vigil-test-hook"
        try "#!/bin/sh\necho from-custom-path\n".write(toFile: script, atomically: true, encoding: .utf8)
        chmod(script, 0o755)
        let custom = await run(runner, ["vigil-test-hook"], environment: ["PATH": directory.path + ":/usr/bin:/bin"])
        #expect(custom.output == "from-custom-path\n")
    }

    @Test func runsInTheWorkingDirectory() async throws {
        let (runner, _) = makeRunner()
        let directory = try TemporaryDirectory()
        let result = await run(runner, ["/bin/pwd"], workingDirectory: directory.path)
        #expect(result.output == directory.path + "\n")
        let missing = await run(runner, ["/bin/pwd"], workingDirectory: directory.path + "/absent")
        #expect(missing.exit == .failedToStart("working directory \(directory.path)/absent: No such file or directory"))
    }

    @Test func cancellationKillsTheProcessGroup() async throws {
        let (runner, _) = makeRunner()
        let directory = try TemporaryDirectory()
        let fifo = directory.path + "/pids"
        #expect(mkfifo(fifo, 0o600) == 0)
        let task = Task {
            await runner.run(
                HookCommand(argv: ["/bin/sh", "-c", "sleep 100 & echo $$ $! > \"$1\"; wait", "sh", fifo], timeout: .seconds(60)),
                event: "wake", variables: [:]
            )
        }
        // Blocks until the hook has written its pids: the hook is running.
        let line = await readAll(fromFIFO: fifo)
        let pids = line.split(separator: " ").compactMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        try #require(pids.count == 2)
        task.cancel()
        let result = await task.value
        #expect(result.exit == .signaled(SIGKILL))
        #expect(result.duration < .seconds(5))
        #expect(processIsGone(pids[0]))
        #expect(processIsGone(pids[1]))
    }

    /// Eight hooks meet at a barrier: each leaves a mark, then waits (up to
    /// 10 s) until all eight marks are there and prints how many it saw.
    /// Run one after another, the first would see only its own.
    @Test func manyHooksRunConcurrently() async throws {
        let (runner, _) = makeRunner()
        let marks = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-hook-barrier-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: marks, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: marks) }
        let script = "touch \"$1/$0\"; i=0; while [ $(ls \"$1\" | wc -l) -lt 8 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; echo $0 $(ls \"$1\" | wc -l)"
        let outputs = await withTaskGroup(of: (Int, HookResult).self) { group in
            for index in 0..<8 {
                group.addTask {
                    (index, await runner.run(
                        HookCommand(argv: ["/bin/sh", "-c", script, "\(index)", marks.path], timeout: .seconds(20)),
                        event: "wake", variables: [:]
                    ))
                }
            }
            var outputs: [Int: String] = [:]
            for await (index, result) in group { outputs[index] = result.output }
            return outputs
        }
        for index in 0..<8 {
            #expect(outputs[index] == "\(index) 8\n")
        }
    }

    @Test func variableNamesAreSanitized() {
        #expect(HookRunner.vigilVariableName("next-wake") == "VIGIL_NEXT_WAKE")
        #expect(HookRunner.vigilVariableName("bytes.in") == "VIGIL_BYTES_IN")
        #expect(HookRunner.vigilVariableName("lease_id2") == "VIGIL_LEASE_ID2")
        #expect(HookRunner.vigilVariableName("größe") == "VIGIL_GR_SSE")
    }
}

/// True when `pid` has exited within `limit`: it has no /proc entry, or its
/// pidfd turns readable (the kernel's exit notification, which also covers a
/// zombie left for an init that does not reap). Not a sleep: poll(2) returns
/// as soon as the process exits.
private func processIsGone(_ pid: pid_t, within limit: Duration = .seconds(3)) -> Bool {
    let pidfd = vigil_pidfd_open(pid)
    if pidfd < 0 { return errno == ESRCH }
    defer { close(pidfd) }
    var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
    let milliseconds = Int32(limit.components.seconds * 1000)
    return poll(&entry, 1, milliseconds) == 1
}

/// A temporary directory removed when the value goes away.
private final class TemporaryDirectory {
    let path: String

    init() throws {
        var base = NSTemporaryDirectory()
        if !base.hasSuffix("/") { base += "/" }
        var template = Array((base + "vigil-hooks-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        path = String(cString: made)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}
