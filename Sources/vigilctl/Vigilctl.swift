import ArgumentParser
import VigilHost

@main
struct Vigilctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vigilctl",
        abstract: "Inspect and control the Vigil keep-alive host.",
        discussion: """
        check-config and survival work without a running host: they read the config \
        file and the survival log directly.
        """,
        version: VigilVersion.string,
        subcommands: [CheckConfigCommand.self, SurvivalCommand.self]
    )
}
