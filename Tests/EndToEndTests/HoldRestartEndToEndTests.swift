import Foundation
import Glibc
import Testing
import VigilTestSupport

/// `vigilctl hold -- sleep 20` while vigild is restarted under it, once
/// with SIGTERM and once with kill -9: hold begins a new lease on each new
/// host and exits non-zero because the command ran part of the time
/// without one.
extension EndToEnd {
    @Suite struct HoldRestartEndToEndTests {
        @Test func holdBeginsANewLeaseAfterEachRestart() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-hold-restart")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "1s", extra: "bus = \"\(bus.address)\""))
            func listLeases() throws -> String {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListLeases"]).stdout
            }

            var host = try Daemon(arguments: ["--config", config])
            try await host.waitForLine(containing: "serving org.vigil.Vigil1")
            // The command says "started" once hold holds its first lease.
            let hold = try Daemon(arguments: [], executable: [
                Build.vigilctl, "hold", "--bus", bus.address, "--budget", "4s", "--why", "restart test",
                "--", "sh", "-c", "echo started >&2; exec sleep 20",
            ])
            try await hold.waitForLine(containing: "started")
            #expect(try listLeases().contains("\"restart test\""))

            // SIGTERM: the host ends the lease on its way out.
            host.signal(SIGTERM)
            #expect(await host.waitForExit() == 0)
            try await hold.waitForLine(containing: "ended by vigild (it stopped or restarted)")
            host = try Daemon(arguments: ["--config", config])
            try await host.waitForLine(containing: "serving org.vigil.Vigil1")
            let first = try await hold.waitForLine(containing: "new lease ")
            #expect(first.contains("without one"), "\(first)")
            #expect(try listLeases().contains("\"restart test\""))

            // kill -9: the kernel closes the host's end of the lease pipe.
            host.signal(SIGKILL)
            _ = await host.waitForExit()
            try await hold.waitForLine(containing: "ended by vigild", after: 1)
            host = try Daemon(arguments: ["--config", config])
            try await host.waitForLine(containing: "serving org.vigil.Vigil1")
            try await hold.waitForLine(containing: "new lease ", after: 1)
            #expect(try listLeases().contains("\"restart test\""))

            // sleep 20 exits 0, but the command was not covered throughout.
            let status = await hold.waitForExit()
            #expect(status == 75, "\(hold.output)")
            let summary = hold.output.last ?? ""
            #expect(summary.contains("sh ran ") && summary.contains("without a lease (2 gaps)"), "\(summary)")
            #expect(!(try listLeases().contains("\"restart test\"")), "hold ended its last lease")

            // The survival log shows the restarts: one stopped, one killed run.
            let report = try ProcessRunner.run(Build.vigilctl, ["survival", "--state-dir", dir.file("state"), "--json"])
            #expect(report.stdout.contains("\"endReason\" : \"killed\""), "\(report.stdout)")
            #expect(report.stdout.contains("\"endReason\" : \"stopped\""), "\(report.stdout)")
            host.signal(SIGTERM)
            #expect(await host.waitForExit() == 0)
        }
    }
}
