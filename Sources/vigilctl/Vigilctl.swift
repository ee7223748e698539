import ArgumentParser
import VigilCommon

@main
struct Vigilctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vigilctl",
        abstract: "Inspect and control the Vigil keep-alive host.",
        discussion: """
        check-config and survival work without a running host: they read the config \
        file and the survival log directly. status, leases, strategies and reload talk to \
        the running vigild over D-Bus (org.vigil.Vigil1; see --bus). hold runs a command under a \
        background-task lease.
        """,
        version: VigilVersion.string,
        subcommands: [
            StatusCommand.self, LeasesCommand.self, StrategiesCommand.self, ReloadCommand.self,
            HoldCommand.self, CheckConfigCommand.self, SurvivalCommand.self, DownloadsCommand.self,
            MetricsCommand.self, InhibitorsCommand.self, CostCommand.self,
        ]
    )
}
