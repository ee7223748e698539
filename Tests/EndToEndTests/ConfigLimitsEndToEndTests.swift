import Foundation
import Glibc
import Testing
import VigilTestSupport

/// Configs past the documented limits, through the built vigild and
/// vigilctl: a clear error at start, on reload of a running host and in
/// check-config, and never a crash (these inputs used to end in SIGSEGV).
extension EndToEnd {
    @Suite struct ConfigLimitsEndToEndTests {
        static func dotted(_ parts: Int) -> String {
            (0..<parts).map { "k\($0)" }.joined(separator: ".")
        }

        static let deepInputs: [(String, String)] = [1_000, 100_000].flatMap { parts in
            [("\(dotted(parts)) = 1\n", "key"), ("[\(dotted(parts))]\nx = 1\n", "table header")]
        }

        @Test func checkConfigAndStartRefuseDeepKeys() throws {
            let dir = try TempDir("vigil-limits")
            for (text, what) in Self.deepInputs {
                let config = try dir.write("deep.toml", hostConfig(stateDir: dir.file("state")) + "\n" + text)
                let checked = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
                #expect(checked.status == 1, "\(what): \(checked.stderr)")
                #expect(checked.stderr.contains("\(config):6:1: \(what) nests more than 64 levels deep"), "\(checked.stderr)")

                let started = try ProcessRunner.run(Build.vigild, ["--config", config])
                #expect(started.status == 78, "\(what): \(started.stderr)")
                #expect(started.stderr.contains("\(what) nests more than 64 levels deep"), "\(started.stderr)")
            }
        }

        @Test func reloadOfDeepKeysKeepsTheHostUp() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-limits-reload")
            let host = hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"")
            let strategy = """
                [[strategy]]
                name = "hourly"
                kind = "periodic-wake"
                every = "1h"
                run = ["/bin/true"]
                """
            let config = try dir.write("vigil.toml", host + "\n" + strategy)
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            func call(_ method: String) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)", "call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", method])
            }
            for (text, what) in Self.deepInputs {
                try dir.write("vigil.toml", host + "\n" + strategy + "\n" + text)
                let reloaded = try call("Reload")
                #expect(reloaded.status == 0, "\(reloaded.stderr)")
                #expect(reloaded.stdout.hasPrefix("bas false 1 \"\(config):11:1: \(what) nests more than 64 levels deep"), "\(reloaded.stdout)")
                #expect(try call("ListStrategies").stdout.contains("\"hourly\" \"periodic-wake\" \"running\""))
            }
            // The vigilctl reload command shows the same problem.
            let viaCtl = try ProcessRunner.run(Build.vigilctl, ["reload", "--bus", bus.address])
            #expect(viaCtl.status != 0)
            #expect((viaCtl.stdout + viaCtl.stderr).contains("nests more than 64 levels deep"), "\(viaCtl.stdout) \(viaCtl.stderr)")

            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
