import Foundation
import Testing
import VigilKitTesting

/// vigilctl without the host: it links neither VigilHost nor TOMLKit or
/// Prometheus (the store's reader brings GRDB, the one SQLite layer of
/// writer and reader), and what needs the config asks vigild beside it.
extension EndToEnd {
    @Suite struct VigilctlWithoutHostTests {
        /// The modules SwiftPM links into vigilctl (its link file list names
        /// each module's object directory, `<Module>.build/`).
        @Test func vigilctlLinksNoHostModules() throws {
            let list = try String(contentsOfFile: Build.binDir.appendingPathComponent("vigilctl.product/Objects.LinkFileList").path, encoding: .utf8)
            #expect(list.contains("/vigilctl.build/"), "\(list.prefix(400))")
            #expect(list.contains("/VigilSurvival.build/") && list.contains("/GRDB.build/"))
            for module in ["VigilHost", "TOMLKit", "Prometheus"] {
                #expect(!list.contains("/\(module).build/"), "vigilctl links \(module)")
            }
        }

        @Test func vigildPrintsTheMetricsSettingsItReads() throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                listen = "[::1]:9469"
                textfile = "out/vigil.prom"
                """))
            let printed = try ProcessRunner.run(Build.vigild, ["--print-metrics-settings", "--config", config])
            #expect(printed.status == 0, "\(printed.stderr)")
            // A relative textfile is resolved against the config's directory.
            #expect(printed.stdout == #"{"listen":"[::1]:9469","textfile":"\#(dir.path)/out/vigil.prom"}"# + "\n", "\(printed.stdout)")
            #expect(!FileManager.default.fileExists(atPath: dir.file("state")), "it starts nothing")

            let none = try dir.write("none.toml", hostConfig(stateDir: dir.file("state")))
            #expect(try ProcessRunner.run(Build.vigild, ["--print-metrics-settings", "--config", none]).stdout == "{}\n")
        }

        @Test func metricsOfABadConfigSaysWhatIsWrong() throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), extra: """

                [metrics]
                listen = "localhost:9469"
                """))
            let result = try ProcessRunner.run(Build.vigilctl, ["metrics", "--config", config])
            #expect(result.status == 1)
            #expect(result.stderr.hasPrefix("vigilctl metrics: \(config):"), "\(result.stderr)")
            #expect(result.stderr.contains("metrics.listen") && result.stderr.contains("\"localhost\" is not a numeric IPv4 or IPv6 address"), "\(result.stderr)")
        }

        @Test func checkConfigIsVigildsCheck() throws {
            let dir = try TempDir()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "30s") + """

                [[strategy]]
                name = "tick"
                kind = "periodic-wake"
                every = "1m"
                run = ["/usr/bin/true"]
                """)
            let check = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
            let vigild = try ProcessRunner.run(Build.vigild, ["--check", "--config", config])
            #expect(check.status == 0 && vigild.status == 0, "\(check.stderr)\(vigild.stderr)")
            #expect(check.stdout == vigild.stdout)
            #expect(check.stdout.hasPrefix("\(config): OK\n  state_dir \(dir.file("state")), survival_interval 30s\n  strategy \"tick\": periodic-wake"), "\(check.stdout)")
            #expect(check.stdout.contains("libvigil-periodic-wake.so"), "\(check.stdout)")
            let quiet = try ProcessRunner.run(Build.vigilctl, ["check-config", "-q", config])
            #expect(quiet.status == 0 && quiet.stdout.isEmpty && quiet.stderr.isEmpty, "\(quiet.stdout)\(quiet.stderr)")
        }

        /// Without a vigild beside it or on PATH, check-config says so.
        @Test func checkConfigWithoutVigildSaysSo() throws {
            let dir = try TempDir()
            // A link keeps vigilctl's own directory (/proc/self/exe names the
            // target), so a copy of the whole directory without vigild.
            let bin = dir.file("bin")
            try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: false)
            for name in ["vigilctl", "libVigilKit.so"] {
                try FileManager.default.copyItem(atPath: Build.binDir.appendingPathComponent(name).path, toPath: "\(bin)/\(name)")
            }
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")))
            let result = try ProcessRunner.run("\(bin)/vigilctl", ["check-config", config], environment: ["PATH": "/nonexistent"])
            #expect(result.status == 1)
            #expect(result.stderr.contains("vigilctl check-config: cannot find vigild (looked beside vigilctl in \(bin) and on PATH)"), "\(result.stderr)")
        }
    }
}
