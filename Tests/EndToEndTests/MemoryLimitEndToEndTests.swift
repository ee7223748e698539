import Foundation
import Glibc
import Testing
import VigilTestSupport

/// vigild under an address-space limit (`prlimit --as`): below what it needs
/// it exits at once with status 71 and a message naming the limit; above
/// it, it serves and SIGTERM stops it. Before issue 35 it crashed without a
/// word or hung, ignoring SIGTERM, while libdispatch retried a thread stack
/// it could not map.
extension EndToEnd {
    @Suite struct MemoryLimitEndToEndTests {
        static func underLimit(_ mebibytes: Int, _ bus: BusTestDaemon, _ dir: TempDir) throws -> Daemon {
            let config = try dir.write("vigil-\(mebibytes).toml", hostConfig(
                stateDir: dir.file("state-\(mebibytes)"), interval: "60s", extra: "bus = \"\(bus.address)\"\npower = \"none\""))
            return try Daemon(arguments: ["--config", config], executable: ["/usr/bin/prlimit", "--as=\(mebibytes << 20)", Build.vigild])
        }

        /// The exit status, or nil if `daemon` is still running after `limit`.
        static func exitStatus(_ daemon: Daemon, within limit: Duration) async -> Int32? {
            await first(within: limit) { await daemon.waitForExit() }
        }

        @Test func aLimitVigildCannotMeetEndsItAtOnceWithAClearMessage() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-e2e-memory")
            let daemon = try Self.underLimit(200, bus, dir)
            defer { daemon.signal(SIGKILL) }
            let status = await Self.exitStatus(daemon, within: .seconds(5))
            #expect(status == 71, "\(daemon.output)")
            // A log line, through the handler vigild bootstraps first thing.
            #expect(daemon.output.contains { $0.hasPrefix("critical vigild: the address-space limit (RLIMIT_AS) is 200 MiB; vigild needs at least 256 MiB") },
                    "\(daemon.output)")
        }

        @Test(arguments: [260, 300, 400])
        func underALimitItMeetsVigildServesAndSIGTERMStopsIt(mebibytes: Int) async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-e2e-memory")
            let daemon = try Self.underLimit(mebibytes, bus, dir)
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitForLine(containing: "the address space is limited to \(mebibytes) MiB (RLIMIT_AS)")
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 as ")
            let listed = try ProcessRunner.run(Build.vigilctl, ["leases", "--bus", bus.address])
            #expect(listed.status == 0, "\(listed.stderr)")
            daemon.signal(SIGTERM)
            let status = await Self.exitStatus(daemon, within: .seconds(5))
            #expect(status == 0, "\(daemon.output.suffix(20))")
        }
    }
}
