import Foundation
import Testing
import VigilKit
import VigilTestSupport

/// Third-party plugins built out of tree against the VigilKit product.
extension EndToEnd {
    @Suite(.serialized) struct PluginEndToEndTests {
        /// Builds a package with the same toolchain and returns its bin directory.
        static func build(_ relativePath: String) throws -> String {
            let package = Build.packageRoot.appendingPathComponent(relativePath).path
            let scratch = Build.packageRoot.appendingPathComponent(".build-fixtures/\((relativePath as NSString).lastPathComponent)").path
            let result = try ProcessRunner.run("/usr/bin/env", ["swift", "build", "--package-path", package, "--scratch-path", scratch])
            guard result.status == 0 else {
                throw DaemonError("building \(relativePath) failed:\n\(result.stdout)\n\(result.stderr)")
            }
            let bin = try ProcessRunner.run("/usr/bin/env", ["swift", "build", "--package-path", package, "--scratch-path", scratch, "--show-bin-path"])
            return bin.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        @Test func hostLoadsAndRunsTheExamplePlugin() async throws {
            let pluginDir = try Self.build("docs/examples/hello-strategy")
            #expect(FileManager.default.fileExists(atPath: "\(pluginDir)/libvigil-hello.so"))
            let dir = try TempDir()
            let out = dir.file("greetings.txt")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """
                plugin_path = ["\(pluginDir)"]

                [[strategy]]
                name = "greeter"
                kind = "hello"
                file = "\(out)"
                every = "200ms"
                greeting = "bonjour"
                """))
            let check = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
            #expect(check.status == 0, "\(check.stderr)")
            #expect(check.stdout.contains("libvigil-hello.so"))

            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "wrote greeting #3")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
            let text = try String(contentsOfFile: out, encoding: .utf8)
            #expect(text.hasPrefix("bonjour from greeter #1\nbonjour from greeter #2\nbonjour from greeter #3\n"))
            // Its leases went through the host's registry into the survival log.
            let events = try ProcessRunner.run("/usr/bin/sqlite3", [dir.file("state/survival.sqlite"), "SELECT count(*) FROM event WHERE strategy = 'greeter' AND name = 'lease-acquired'"])
            #expect((Int(events.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) >= 3, "\(events.stdout)\(events.stderr)")
        }

        /// A handler whose argument type is not the contract's does not
        /// compile: the fixture builds with the declared type, and fails at
        /// the handler's line, naming both types, with a String instead.
        @Test func aHandlerOfTheWrongTypeIsACompileError() throws {
            let fixture = "Tests/Fixtures/WrongHandler"
            _ = try Self.build(fixture)
            let package = Build.packageRoot.appendingPathComponent(fixture).path
            let scratch = Build.packageRoot.appendingPathComponent(".build-fixtures/WrongHandler").path
            let wrong = try ProcessRunner.run("/usr/bin/env", [
                "swift", "build", "--package-path", package, "--scratch-path", scratch, "-Xswiftc", "-DWRONG_HANDLER",
            ])
            #expect(wrong.status != 0)
            let output = wrong.stdout + wrong.stderr
            #expect(output.contains("WrongHandler.swift:6:"), "\(output)")
            #expect(output.contains("error: cannot convert value of type '@Sendable (BusCaller, String)"), "\(output)")
            #expect(output.contains("(BusCaller, ObjectPath) async throws -> BusTuple<>"), "\(output)")
        }

        @Test func pluginBuiltForAnotherSDKVersionIsRefused() async throws {
            let pluginDir = try Self.build("Tests/Fixtures/MismatchPlugin")
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """
                plugin_path = ["\(pluginDir)"]

                [[strategy]]
                name = "future"
                kind = "mismatch"
                """))
            let check = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
            #expect(check.status == 1)
            #expect(check.stderr.contains("libvigil-mismatch.so was built against VigilKit SDK version 999, but this host uses version \(VigilSDK.version)"), "\(check.stderr)")
            #expect(check.stderr.hasPrefix("\(config):9:1: strategy[0].kind: cannot load kind \"mismatch\""), "\(check.stderr)")
            let run = try ProcessRunner.run(Build.vigild, ["--config", config])
            #expect(run.status == 78)
            #expect(!FileManager.default.fileExists(atPath: dir.file("state")))
        }

        @Test func missingPluginListsTheAvailableKinds() throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", """
                [[strategy]]
                name = "x"
                kind = "silent-audi"
                """)
            let check = try ProcessRunner.run(Build.vigilctl, ["check-config", config], environment: ["VIGIL_PLUGIN_PATH": dir.path, "PATH": "/usr/bin:/bin"])
            #expect(check.status == 1)
            // The built-in plugins next to vigilctl are found; the misspelt kind is not.
            #expect(check.stderr.contains("unknown kind \"silent-audi\" (did you mean \"silent-audio\"?); available kinds: "), "\(check.stderr)")
            #expect(check.stderr.contains("periodic-wake") && check.stderr.contains("background-task") && check.stderr.contains("silent-audio"), "\(check.stderr)")
        }

        @Test func libraryWithoutTheEntryPointIsNamed() throws {
            let dir = try TempDir()
            // A real shared library that is not a Vigil plugin.
            try FileManager.default.copyItem(atPath: "\(Build.binDir.path)/libVigilKit.so", toPath: dir.file("libvigil-impostor.so"))
            let config = try dir.write("vigil.toml", """
                [host]
                plugin_path = ["\(dir.path)"]

                [[strategy]]
                name = "x"
                kind = "impostor"
                """)
            let check = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
            #expect(check.status == 1)
            #expect(check.stderr.contains("\(dir.path)/libvigil-impostor.so is not a Vigil plugin: it does not export the entry point vigil_plugin_v1"), "\(check.stderr)")
        }
    }
}

