import Foundation
import Glibc
import Testing
import VigilTestSupport

/// The survival store on a small filesystem the test makes: a 2 MiB tmpfs
/// mounted in a private mount namespace (`unshare -m`) that only vigild
/// sees; the test reaches it through /proc/PID/root.
extension EndToEnd {
    @Suite struct SurvivalFullDiskEndToEndTests {
        // In the whole suite it used to report one unwritable gap a second:
        // events that failed between two written heartbeats (a WAL
        // checkpoint gave the heartbeats room) each made a gap. Only failed
        // heartbeats make one now (SurvivalStoreFullDiskTests).
        @Test
        func walStaysBoundedAndHeartbeatsResumeAfterTheDiskWasFull() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-fulldisk")
            let state = dir.file("state")
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            // Ten 1 s strategies and a 1 s heartbeat: each wake takes and
            // releases a lease, and each lease change is an event row.
            let strategies = (0..<10).map { i in
                """
                [[strategy]]
                name = "tick\(i)"
                kind = "periodic-wake"
                every = "1s"
                tolerance = "0s"
                run = ["/bin/true"]
                """
            }.joined(separator: "\n")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: state, interval: "1s", extra: "bus = \"\(bus.address)\"") + "\n" + strategies)
            let daemon = try Daemon(arguments: ["--config", config], executable: [
                "/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs -o size=2m vigil-test \"$0\" && exec \"$@\"", state, Build.vigild,
            ])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            let seen = "/proc/\(daemon.pid)/root" + state
            let store = seen + "/survival.sqlite"
            #expect(FileManager.default.fileExists(atPath: store))

            // The WAL stays bounded under the traffic (it used to grow about
            // 300 KB/s and fill the 2 MiB in 6 s).
            var largestWAL: Int64 = 0
            for k in 0..<10 {
                try await daemon.waitForLine(containing: "heartbeat \(k + 3) written")
                largestWAL = max(largestWAL, Self.size(store + "-wal"))
            }
            #expect(largestWAL < 768 * 1024, "WAL reached \(largestWAL) bytes")

            // A reader holds a snapshot that includes WAL frames (an operator
            // reading the store during the outage), so no checkpoint can
            // reset or truncate the WAL: every commit must grow it. Without
            // it a checkpoint could give back the WAL's space, and the
            // heartbeat right after it took that space before the filler
            // below did (1 run in 3).
            let reader = try Daemon(arguments: [], executable: [
                "/usr/bin/nsenter", "-t", "\(daemon.pid)", "-m", "/usr/bin/python3", "-c", Self.pinWAL, state + "/survival.sqlite",
            ])
            defer { if reader.process.isRunning { reader.signal(SIGKILL) } }
            try await reader.waitForLine(containing: "pinned")

            // Fill the filesystem and keep it full: whatever space there is
            // is taken at once (a real full disk has other writers), so
            // heartbeats fail and none slips through.
            let filler = seen + "/filler"
            #expect(try fillFilesystem(filler) > 0)
            func keepFull(until done: () -> Bool, timeout: Duration) async throws {
                let end = ContinuousClock.now + timeout
                while !done(), ContinuousClock.now < end {
                    _ = try fillFilesystem(filler, append: true)
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            let failed = "heartbeats resume when it is writable again"
            try await keepFull(until: { daemon.output.contains { $0.contains(failed) } }, timeout: .seconds(60))
            let full = try await daemon.waitForLine(containing: failed, timeout: .seconds(1))
            #expect(full.contains("error") && full.contains("is full; free some space there"), "\(full)")
            let failuresBefore = daemon.output.filter { $0.contains(failed) }.count
            // The outage the report must show: about four heartbeats long.
            try await keepFull(until: { false }, timeout: .seconds(4))
            #expect(unlink(filler) == 0)
            // SIGKILL: the test runner's children start with SIGTERM blocked.
            reader.signal(SIGKILL)
            _ = await reader.waitForExit()
            let back = try await daemon.waitForLine(containing: "survival store writable again after")
            #expect(back.contains("the gap is recorded as store-unwritable"), "\(back)")
            let lines = daemon.output
            let written = lines.filter { $0.contains(" written (") }.count
            try await daemon.waitForLine(containing: " written (", after: written)
            // One error line for the outage, not one per failed write.
            #expect(lines.filter { $0.contains(failed) }.count == failuresBefore)

            // SQLite resolves the /proc/PID/root link, so read the store
            // from inside vigild's mount namespace.
            let inside = ["-t", "\(daemon.pid)", "-m", Build.vigilctl, "survival", "--store", state + "/survival.sqlite", "--runs", "1"]
            let report = try ProcessRunner.run("/usr/bin/nsenter", inside + ["--json"])
            #expect(report.status == 0, "\(report.stderr)")
            let runs = try #require(try JSONSerialization.jsonObject(with: Data(report.stdout.utf8)) as? [[String: Any]])
            let run = try #require(runs.first)
            #expect(run["unwritableGaps"] as? Int == 1, "\(report.stdout)")
            let unwritable = (run["unwritableMicros"] as? Int ?? 0)
            #expect(unwritable >= 4_000_000 && unwritable < 15_000_000, "unwritable \(unwritable) µs")
            #expect(run["stalls"] as? Int == 0, "the outage is not a stall: \(report.stdout)")
            let text = try ProcessRunner.run("/usr/bin/nsenter", inside + ["--width", "80"])
            #expect(text.stdout.contains("store unwritable"), "\(text.stdout)")
            #expect(text.stdout.contains("#"), "\(text.stdout)")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// Begins a read transaction on the store while its WAL holds
        /// frames: the WAL header (its salts change whenever the WAL is
        /// reset) is the same, and not empty, just before and just after
        /// the snapshot is taken. Prints "pinned" and holds it until killed.
        static let pinWAL = """
            import sqlite3, sys, signal, time
            path = sys.argv[1]
            def header():
                try:
                    with open(path + "-wal", "rb") as f:
                        return f.read(32)
                except FileNotFoundError:
                    return b""
            db = sqlite3.connect(path, isolation_level=None)
            while True:
                before = header()
                db.execute("BEGIN")
                db.execute("SELECT count(*) FROM sqlite_master").fetchall()
                if len(before) == 32 and header() == before:
                    break
                db.execute("COMMIT")
                time.sleep(0.05)
            print("pinned", file=sys.stderr, flush=True)
            signal.pause()
            """

        static func size(_ path: String) -> Int64 {
            var info = stat()
            return stat(path, &info) == 0 ? Int64(info.st_size) : 0
        }
    }
}
