import Foundation
import Testing
import VigilTestSupport

/// What a newcomer sees after `Scripts/run`: vigild with the shipped
/// Configs/default.toml, on a private bus it starts itself.
extension EndToEnd {
    @Suite struct FirstMinuteEndToEndTests {
        /// The default config's periodic-wake runs once at start
        /// (`run_at_start`), not on its next 5-minute slot; and every line
        /// vigild prints at the default level fits a terminal (at most 200
        /// characters), the first saying what runs and where to look.
        @Test func theDefaultConfigShowsAStrategyAtWorkWithinSeconds() async throws {
            let dir = try TempDir("vigil-first-minute")
            let config = Build.packageRoot.appendingPathComponent("Configs/default.toml").path
            // No session bus: vigild starts its own, as on a fresh machine.
            let daemon = try Daemon(arguments: ["--config", config, "--state-dir", dir.file("state")],
                                    environment: ["DBUS_SESSION_BUS_ADDRESS": "", "XDG_RUNTIME_DIR": dir.path])
            defer {
                // A vigild stopped by SIGKILL (a failed run) leaves its
                // private dbus-daemon behind, by design: stop it here.
                daemon.signal(SIGKILL)
                let line = daemon.output.first { $0.contains("started a private dbus-daemon (pid ") } ?? ""
                if let pid = line.components(separatedBy: "(pid ").dropFirst().first?.prefix(while: \.isNumber), let bus = Int32(pid) {
                    kill(bus, SIGTERM)
                }
            }
            let first = try await daemon.waitForLine(containing: "vigild: run ")
            let started = ContinuousClock.now
            #expect(first.contains("started with 1 strategy (hello-wake)") && first.contains("see vigilctl status"), "\(first)")
            // A bound far below the 5-minute slot the strategy would
            // otherwise wait for (the acceptance's 10 s).
            let ran = try await daemon.waitForLine(containing: "periodic wake #1,", timeout: .seconds(10))
            #expect(ContinuousClock.now - started < .seconds(10), "\(ran)")
            try await daemon.waitForLine(containing: "look at it with: vigilctl status")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let long = daemon.output.filter { $0.count > 200 }
            #expect(long.isEmpty, "lines over 200 characters: \(long)")
            #expect(!daemon.output.contains { $0.hasPrefix("debug ") }, "\(daemon.output)")
        }
    }
}
