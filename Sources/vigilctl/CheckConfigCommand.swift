import ArgumentParser
import Foundation
import VigilCommon

struct CheckConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check-config",
        abstract: "Validate a config file without starting anything.",
        discussion: """
        Parses the TOML, checks [host], loads the plugin of every kind the config names \
        (and no other), and lets each strategy validate its table. Every problem is printed \
        as file:line:column: key.path: message, with did-you-mean suggestions for misspelled \
        keys and kinds.

        The check is vigild's own (`vigild --check --config FILE`): vigilctl runs the vigild \
        beside it, else the one on PATH.

        Exit status: 0 when the config is valid, 1 when it has problems.
        """
    )

    @Argument(help: ArgumentHelp("The TOML config file to check.", valueName: "file"))
    var file: String

    @Flag(name: .shortAndLong, help: "Print nothing when the config is valid.")
    var quiet = false

    func run() throws {
        let status: Int32
        do {
            status = try VigildTool.run(["--check", "--config", file], quiet: quiet)
        } catch {
            FileHandle.standardError.write(Data("vigilctl check-config: \(TerminalText.escaped("\(error)"))\n".utf8))
            throw ExitCode(1)
        }
        switch status {
        case 0: return
        case VigildTool.configProblems: throw ExitCode(1)
        default:
            FileHandle.standardError.write(Data("vigilctl check-config: vigild --check ended with status \(status)\n".utf8))
            throw ExitCode(1)
        }
    }
}
