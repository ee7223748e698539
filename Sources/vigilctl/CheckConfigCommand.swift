import ArgumentParser
import Foundation
import VigilHost

struct CheckConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Validate a config file without starting anything.",
        discussion: """
        Parses the TOML, checks [host], loads the plugin of every kind the config names \
        (and no other), and lets each strategy validate its table. Every problem is printed \
        as file:line:column: key.path: message, with did-you-mean suggestions for misspelled \
        keys and kinds.

        Exit status: 0 when the config is valid, 1 when it has problems.
        """
    )

    @Argument(help: ArgumentHelp("The TOML config file to check.", valueName: "file"))
    var file: String

    @Flag(name: .shortAndLong, help: "Print nothing when the config is valid.")
    var quiet = false

    func run() throws {
        do {
            let (config, plugins) = try ConfigLoader.loadWithPlugins(path: file)
            guard !quiet else { return }
            print("\(file): OK")
            print("  state_dir \(config.host.stateDir), survival_interval \(config.host.survivalInterval.vigilDescription)")
            let files = plugins.registeredKinds
            for s in config.strategies {
                print("  strategy \"\(s.name)\": \(s.kind) — \(s.strategyKind.summary) [\(files[s.kind] ?? "built in")]")
                if let conditions = s.conditions {
                    print("    runs only while: \(TerminalText.escaped(conditions.written))")
                }
            }
            for note in config.notes { print("note: \(note)") }
        } catch {
            FileHandle.standardError.write(Data("\(error)\n".utf8))
            throw ExitCode(1)
        }
    }
}
