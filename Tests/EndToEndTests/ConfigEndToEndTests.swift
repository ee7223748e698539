import Foundation
import Testing
import VigilTestSupport

/// The bad-config fixtures through the real binaries and the real
/// periodic-wake plugin: each gives its specific error, a non-zero exit, and
/// starts nothing.
extension EndToEnd {
    @Suite struct ConfigEndToEndTests {
        static let fixtures = Build.packageRoot.appendingPathComponent("Tests/Fixtures/configs")

        static func badFixtures() -> [String] {
            let dir = fixtures.appendingPathComponent("bad").path
            return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [])
                .filter { $0.hasSuffix(".toml") }.sorted()
        }

        /// The `# expect: ...` line at the top of a fixture.
        static func expectation(_ path: String) throws -> String {
            let text = try String(contentsOfFile: path, encoding: .utf8)
            let first = text.split(separator: "\n").first.map(String.init) ?? ""
            guard first.hasPrefix("# expect: ") else { throw DaemonError("\(path) has no `# expect:` line") }
            return String(first.dropFirst("# expect: ".count))
        }

        @Test func thereAreBadFixtures() {
            #expect(Self.badFixtures().count >= 10)
        }

        @Test(arguments: badFixtures())
        func checkConfigReportsTheProblem(_ name: String) throws {
            let path = Self.fixtures.appendingPathComponent("bad/\(name)").path
            let expected = try Self.expectation(path)
            let result = try ProcessRunner.run(Build.vigilctl, ["check-config", path])
            #expect(result.status == 1, "\(name): exit status")
            #expect(result.stderr.contains(expected), "\(name): expected \"\(expected)\" in:\n\(result.stderr)")
            // Every problem line names the file, and a count closes the report.
            #expect(result.stderr.contains(path))
            #expect(result.stderr.contains(" in \(path)"))
        }

        @Test(arguments: badFixtures())
        func vigildRefusesToStart(_ name: String) throws {
            let path = Self.fixtures.appendingPathComponent("bad/\(name)").path
            let state = try TempDir()
            let stateDir = state.file("state")
            let result = try ProcessRunner.run(Build.vigild, ["--config", path, "--state-dir", stateDir])
            #expect(result.status == 78, "\(name): vigild must exit with EX_CONFIG")
            #expect(result.stderr.contains(try Self.expectation(path)))
            #expect(!FileManager.default.fileExists(atPath: stateDir), "\(name): vigild must start nothing")
        }

        @Test func goodConfigsPass() throws {
            let dir = Self.fixtures.appendingPathComponent("good").path
            for name in try FileManager.default.contentsOfDirectory(atPath: dir) where name.hasSuffix(".toml") {
                let result = try ProcessRunner.run(Build.vigilctl, ["check-config", "\(dir)/\(name)"])
                #expect(result.status == 0, "\(name): \(result.stderr)")
            }
        }

        @Test func shippedConfigsPass() throws {
            let configs = Build.packageRoot.appendingPathComponent("Configs")
            var files = ["\(configs.path)/default.toml"]
            files += try FileManager.default.contentsOfDirectory(atPath: configs.appendingPathComponent("examples").path)
                .filter { $0.hasSuffix(".toml") }.map { "\(configs.path)/examples/\($0)" }
            for file in files {
                let result = try ProcessRunner.run(Build.vigilctl, ["check-config", file])
                #expect(result.status == 0, "\(file): \(result.stderr)")
                #expect(result.stdout.contains("OK"))
            }
        }
    }
}

