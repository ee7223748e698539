import Foundation
import Testing
import VigilHost
import VigilTestSupport

/// The host with real time and a 1 s heartbeat: what `vigilctl survival`
/// reports after a clean stop, a `kill -9` and a `kill -STOP`.
extension EndToEnd {
    @Suite(.serialized) struct SurvivalEndToEndTests {
        @Test func heartbeatsAtTheIntervalAndSigtermReadsAsStopped() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "heartbeat 4 written")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)

            let runs = try SurvivalReport.load(path: dir.file("state/survival.sqlite"), runs: nil, sinceWallMicros: nil)
            try #require(runs.count == 1)
            #expect(runs[0].endReason == .stopped)
            #expect(runs[0].stalls == 0)
            // Start, four beats, and the final one written at shutdown.
            #expect(runs[0].heartbeats >= 5)
            let beats = try heartbeatWallTimes(dir.file("state/survival.sqlite"))
            // Beats 1...4 sit on a 1 s grid from the start of the run: each no
            // earlier than 0.9 s after the previous slot, and lateness never
            // accumulates (beat 4 is about 3 s after beat 1).
            let grid = Array(beats.dropFirst().prefix(4))
            try #require(grid.count == 4)
            for (a, b) in zip(grid, grid.dropFirst()) {
                #expect(Double(b - a) / 1e6 > 0.8, "heartbeats \(a) and \(b) too close")
            }
            let span = Double(grid[3] - grid[0]) / 1e6
            #expect(span > 2.7 && span < 3.8, "beats 1 to 4 span \(span) s, expected about 3 s")
            let text = try ProcessRunner.run(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite")])
            #expect(text.status == 0)
            #expect(text.stdout.contains("stopped"))
        }

        @Test func killedRunIsReportedByTheNextStart() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            let first = try Daemon(arguments: ["--config", config])
            try await first.waitForLine(containing: "heartbeat 2 written")
            first.signal(SIGKILL)
            _ = await first.waitForExit()

            let second = try Daemon(arguments: ["--config", config])
            let warning = try await second.waitForLine(containing: "had no clean end")
            #expect(warning.contains("killed"))
            try await second.waitForLine(containing: "heartbeat 1 written")
            second.signal(SIGTERM)
            #expect(await second.waitForExit() == 0)

            let runs = try SurvivalReport.load(path: dir.file("state/survival.sqlite"), runs: nil, sinceWallMicros: nil)
            let reasons = Set(runs.map(\.endReason))
            #expect(runs.count == 2)
            #expect(reasons == [.killed, .stopped])
            let killed = try #require(runs.first { $0.endReason == .killed })
            // Alive until its last heartbeat: about two intervals.
            #expect(killed.alive >= .milliseconds(1_700) && killed.alive < .seconds(4))

            let json = try ProcessRunner.run(Build.vigilctl, ["survival", "--json", "--store", dir.file("state/survival.sqlite")])
            #expect(json.status == 0)
            #expect(json.stdout.contains("\"killed\""))
        }

        @Test func stoppedProcessShowsOneFrozenGap() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "heartbeat 2 written")
            daemon.signal(SIGSTOP)
            let written = daemon.output.filter { $0.contains("written") }.count
            // The stimulus under test: the host frozen for several intervals.
            try await Task.sleep(for: .seconds(5))
            daemon.signal(SIGCONT)
            try await daemon.waitForLine(containing: "written", after: written)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)

            let runs = try SurvivalReport.load(path: dir.file("state/survival.sqlite"), runs: nil, sinceWallMicros: nil)
            try #require(runs.count == 1)
            #expect(runs[0].stalls == 1)
            let longest = runs[0].longestStall
            #expect(longest > .milliseconds(4_500) && longest < .milliseconds(6_800), "longest stall \(longest)")
            #expect(runs[0].suspended < .milliseconds(100), "no suspend happened")
            #expect(runs[0].endReason == .stopped)
            let text = try ProcessRunner.run(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite")])
            #expect(text.stdout.lowercased().contains("stall") || text.stdout.lowercased().contains("frozen"))

            // The same run drawn: the frozen gap as a red segment with its
            // length, how it ended, and the page with its totals.
            let svg = try ProcessRunner.run(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite"), "--since", "1h", "--svg", "-"])
            #expect(svg.status == 0, "\(svg.stderr)")
            #expect(svg.stdout.hasPrefix("<?xml") && svg.stdout.contains(#"class="st"><title>frozen or stalled "#), "\(svg.stdout.prefix(3_000))")
            #expect(svg.stdout.contains("<title>stopped "))
            let page = dir.file("survival.html")
            let html = try ProcessRunner.run(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite"), "--html", page])
            #expect(html.status == 0 && html.stdout.isEmpty && html.stderr.contains("wrote the page to \(page)"), "\(html)")
            #expect(try String(contentsOfFile: page, encoding: .utf8).contains("<td>total: 1 run</td>"))
            // A FIFO (like /dev/stdout or a device) is written in place, not
            // replaced by a new file.
            let fifo = dir.file("page.fifo")
            #expect(mkfifo(fifo, 0o600) == 0)
            // Both ends block in open until the other comes: the reader off
            // the cooperative pool, vigilctl off the test's thread.
            async let pagePiped = readAll(fromFIFO: fifo)
            let piped = try await ProcessRunner.runDetached(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite"), "--html", fifo])
            #expect(piped.status == 0, "\(piped.stderr)")
            #expect(await pagePiped.contains("<td>total: 1 run</td>"))
            var info = stat()
            #expect(stat(fifo, &info) == 0 && info.st_mode & S_IFMT == S_IFIFO, "the FIFO was replaced")
            let badSince = try ProcessRunner.run(Build.vigilctl, ["survival", "--store", dir.file("state/survival.sqlite"), "--since", "yesterday"])
            #expect(badSince.status != 0 && badSince.stderr.contains("--since"), "\(badSince.stderr)")
        }

        @Test func secondHostOnTheSameStateDirIsRefused() async throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            let first = try Daemon(arguments: ["--config", config])
            try await first.waitForLine(containing: "started")
            let second = try Daemon(arguments: ["--config", config])
            // Its output arrives through a pipe reader: await the line, not the exit.
            let refusal = try await second.waitForLine(containing: "another vigild")
            #expect(refusal.contains("another vigild (pid \(first.pid))"))
            #expect(await second.waitForExit() == 1)
            first.signal(SIGTERM)
            #expect(await first.waitForExit() == 0)
        }
    }
}


/// Wall times of every heartbeat in the store, in order.
func heartbeatWallTimes(_ store: String) throws -> [Int64] {
    let out = try ProcessRunner.run("/usr/bin/sqlite3", [store, "SELECT wall FROM heartbeat ORDER BY seq"])
    return out.stdout.split(separator: "\n").compactMap { Int64($0) }
}
