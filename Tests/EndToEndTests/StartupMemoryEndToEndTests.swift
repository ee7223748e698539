import Foundation
import Testing
import VigilTestSupport

/// `[host] release_startup_pages`: once it serves the bus, vigild drops the
/// code pages only start-up touched, its RSS falls, and it keeps working.
extension EndToEnd {
    @Suite struct StartupMemoryEndToEndTests {
        /// Resident file-backed KiB of a process (RssFile in /proc/PID/status).
        static func residentFileKiB(_ pid: Int32) throws -> Int {
            let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
            let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("RssFile:") })
            return try #require(Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]))
        }

        @Test func releasedStartupPagesLeaveTheRSSAndTheHostKeepsWorking() async throws {
            let dir = try TempDir()
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let store = dir.file("released/survival.sqlite")
            let released = try Daemon(arguments: ["--config", try dir.write("released.toml", hostConfig(
                stateDir: dir.file("released"), extra: "bus = \"\(bus.address)\"\npower = \"none\""))])
            let line = try await released.waitForLine(containing: "released start-up pages")
            #expect(line.contains("0 failed"), "\(line)")
            // Heartbeats and bus calls after the release run on code that
            // faults back in.
            try await waitForHeartbeats(store, atLeast: 3, daemon: released)
            let status = try runCommand(Build.vigilctl, ["status", "--bus", bus.address])
            #expect(status.status == 0, "\(status.stderr)")
            let releasedKiB = try Self.residentFileKiB(released.pid)

            let otherBus = try BusTestDaemon()
            defer { otherBus.stop() }
            let kept = try Daemon(arguments: ["--config", try dir.write("kept.toml", hostConfig(
                stateDir: dir.file("kept"), extra: "bus = \"\(otherBus.address)\"\npower = \"none\"\nrelease_startup_pages = false"))])
            _ = try await kept.waitForLine(containing: "serving org.vigil.Vigil1")
            try await waitForHeartbeats(dir.file("kept/survival.sqlite"), atLeast: 3, daemon: kept)
            #expect(!kept.output.contains { $0.contains("released start-up pages") })
            let keptKiB = try Self.residentFileKiB(kept.pid)
            // Most of what start-up touched stays out (the idle work faults
            // back only its own pages): at least a quarter less.
            #expect(releasedKiB * 4 < keptKiB * 3, "resident file pages: \(releasedKiB) KiB released, \(keptKiB) KiB kept")

            for daemon in [released, kept] {
                daemon.signal(SIGTERM)
                #expect(await daemon.waitForExit() == 0)
            }
        }
    }
}
