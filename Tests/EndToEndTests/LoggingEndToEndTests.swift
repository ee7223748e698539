import Foundation
import Testing
import VigilHost
import VigilTestSupport

/// vigild's log: priority prefixes only when stderr is the journal, and a
/// stderr that is full or whose reader went away never stops the host.
extension EndToEnd {
    @Suite(.serialized) struct LoggingEndToEndTests {
        /// Runs vigild with stderr redirected by bash (`redirect`), which
        /// then execs vigild, so the Daemon's pid is vigild's.
        func redirected(_ redirect: String, config: String) throws -> Daemon {
            try Daemon(arguments: ["--config", config],
                       executable: ["/bin/bash", "-c", "exec \"$0\" \"$@\" \(redirect)", Build.vigild])
        }

        @Test func stderrOnDevFullKeepsTheHostRunning() async throws {
            let dir = try TempDir()
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let store = dir.file("state/survival.sqlite")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: "bus = \"\(bus.address)\""))
            // Every heartbeat logs a debug line, and every one fails (ENOSPC).
            let daemon = try redirected("2>/dev/full", config: config)
            try await waitForHeartbeats(store, atLeast: 5, daemon: daemon)
            // The lost lines are counted where someone can see them.
            let status = try ProcessRunner.run(Build.vigilctl, ["status", "--bus", bus.address, "--json"])
            let json = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any], "\(status.stderr)")
            #expect((json["droppedLogLines"] as? Int ?? 0) >= 5, "\(status.stdout)")
            let text = try ProcessRunner.run(Build.vigilctl, ["status", "--bus", bus.address])
            #expect(text.stdout.contains("lines dropped (stderr full or closed)"), "\(text.stdout)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let runs = try SurvivalReport.load(path: store, runs: nil, sinceWallMicros: nil)
            #expect(runs.count == 1)
            #expect(runs.first?.endReason == .stopped)
            // The survival log keeps the count of the lines that were lost.
            let counted = try ProcessRunner.run("/usr/bin/sqlite3", [store, "SELECT fields FROM event WHERE name = 'log-lines-dropped'"])
            let count = counted.stdout.split(separator: "\"").dropFirst(3).first.flatMap { Int($0) } ?? 0
            #expect(count >= 5, "\(counted.stdout)\(counted.stderr)")
        }

        @Test func stderrPipeWhoseReaderExitedKeepsTheHostRunning() async throws {
            let dir = try TempDir()
            let store = dir.file("state/survival.sqlite")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            // The reader takes one byte and exits: every later write gets
            // EPIPE (and SIGPIPE, were it not ignored).
            let daemon = try redirected("2> >(head -c 1 >/dev/null)", config: config)
            try await waitForHeartbeats(store, atLeast: 5, daemon: daemon)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let runs = try SurvivalReport.load(path: store, runs: nil, sinceWallMicros: nil)
            #expect(runs.first?.endReason == .stopped)
        }

        /// A plugin's lines (background-task, dlopen'ed) carry swift-log
        /// metadata: the strategy, the lease they are about, and the run.
        @Test func strategyLinesCarryStrategyLeaseAndRun() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")) + """

                [[strategy]]
                name = "nightly job"
                kind = "background-task"
                budget = "1h"
                command = ["/bin/true"]
                """)
            let daemon = try Daemon(arguments: ["--config", config])
            defer { daemon.signal(SIGKILL) }
            let started = try await daemon.waitForLine(containing: "vigild: run ")
            let runId = try #require(started.split(separator: " ").drop { $0 != "run" }.dropFirst().first.map(String.init), "\(started)")
            #expect(started.hasSuffix(" run=\(runId)"), "\(started)")
            let done = try await daemon.waitForLine(containing: "nightly job: command ")
            #expect(done.hasPrefix("info nightly job: command exited with status 0 "), "\(done)")
            // Sorted fields; the name has a space, so it is quoted.
            #expect(done.range(of: #" lease=[0-9]+ run=\#(runId) strategy="nightly job"$"#, options: .regularExpression) != nil, "\(done)")
            // The host's own lines carry the run, not a strategy.
            let heartbeat = try await daemon.waitForLine(containing: "vigild: heartbeat ")
            #expect(heartbeat.hasSuffix(" run=\(runId)"), "\(heartbeat)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func journalPrefixesOnlyWhenStderrIsTheJournal() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))

            // Plain stderr, even with a JOURNAL_STREAM naming another stream
            // (as a child of a service whose stderr was redirected sees it).
            let plain = try Daemon(arguments: ["--config", config], environment: ["JOURNAL_STREAM": "1:1"])
            try await plain.waitForLine(containing: "heartbeat 1 written")
            #expect(plain.output.allSatisfy { !$0.hasPrefix("<") }, "\(plain.output)")
            #expect(plain.output.contains { $0.hasPrefix("debug vigild: heartbeat") })
            // Killed, so the next start warns about a run with no clean end.
            plain.signal(SIGKILL)
            _ = await plain.waitForExit()

            // JOURNAL_STREAM set to stderr's own device:inode, as systemd does.
            let journal = ["/bin/bash", "-c", "JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec \"$0\" \"$@\"", Build.vigild]
            let first = try Daemon(arguments: ["--config", config], executable: journal)
            let warning = try await first.waitForLine(containing: "had no clean end")
            #expect(warning.hasPrefix("<4>vigild: previous run"), "\(warning)")
            // Logged by the new run, so it carries the new run's id.
            #expect(warning.range(of: #" run=[0-9a-f-]+$"#, options: .regularExpression) != nil, "\(warning)")
            let debug = try await first.waitForLine(containing: "heartbeat 1 written")
            #expect(debug.hasPrefix("<7>"), "\(debug)")
            // The run's metadata follows the message under the journal too.
            #expect(debug.range(of: #" run=[0-9a-f-]+$"#, options: .regularExpression) != nil, "\(debug)")
            #expect(first.output.filter { $0.contains("vigild: ") }.allSatisfy { $0.range(of: #"^<[3-7]>vigild: "#, options: .regularExpression) != nil }, "\(first.output)")

            // A second host on the same state dir is refused with an error line.
            let second = try Daemon(arguments: ["--config", config], executable: journal)
            #expect(await second.waitForExit() == 1)
            let error = second.output.first { $0.contains("another vigild") }
            #expect(error?.hasPrefix("<3>vigild: ") == true, "\(second.output)")

            first.signal(SIGTERM)
            #expect(await first.waitForExit() == 0)
            #expect(first.output.contains { $0.hasPrefix("<5>vigild: received SIGTERM") }, "\(first.output)")
        }

        /// No LoggingSystem-less logging path in the sources: one
        /// LoggingSystem.bootstrap, in vigild; no library or plugin writing
        /// to stderr itself; swift-log a dependency of the SDK only.
        @Test func oneLoggingPathInTheSources() throws {
            let root = Build.packageRoot.path
            let check = try ProcessRunner.run(Build.packageRoot.appendingPathComponent("Scripts/check-single-logging").path,
                                              ["--sources", root])
            #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
            #expect(check.stdout.contains("one logging path"), "\(check.stdout)")
        }

        /// swift-log's Logging is linked into libVigilKit.so only: vigild,
        /// vigilctl and every plugin get it from there (one Logger type, one
        /// LoggingSystem), as Scripts/check-single-logging checks.
        @Test func loggingIsLinkedIntoTheSDKOnly() throws {
            let bin = Build.binDir.path
            let plugins = try FileManager.default.contentsOfDirectory(atPath: bin)
                .filter { $0.hasPrefix("libvigil-") && $0.hasSuffix(".so") }.sorted().map { "\(bin)/\($0)" }
            #expect(plugins.count >= 5, "\(plugins)")
            let check = try ProcessRunner.run(Build.packageRoot.appendingPathComponent("Scripts/check-single-logging").path,
                                       ["\(bin)/libVigilKit.so", Build.vigild, Build.vigilctl] + plugins)
            #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
            #expect(check.stdout.contains("vigild: 0 Logging symbols"), "\(check.stdout)")
            #expect(check.stdout.range(of: #"libVigilKit.so: [1-9][0-9]* Logging symbols"#, options: .regularExpression) != nil, "\(check.stdout)")
        }
    }
}

/// Waits until the survival store holds `atLeast` heartbeats of the current
/// run. The store is the only witness when stderr goes nowhere, so this polls
/// it (bounded); fails early if vigild exits.
func waitForHeartbeats(_ store: String, atLeast count: Int, daemon: Daemon, timeout: Duration = .seconds(60)) async throws {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    var seen = 0
    while clock.now < deadline {
        if !daemon.process.isRunning {
            let status = await daemon.waitForExit()
            Issue.record("vigild exited (status \(status)) after \(seen) heartbeats")
            return
        }
        if FileManager.default.fileExists(atPath: store) {
            seen = try heartbeatWallTimes(store).count
            if seen >= count { return }
        }
        try await Task.sleep(for: .milliseconds(200))
    }
    Issue.record("only \(seen) heartbeats in \(store) after \(timeout)")
}
