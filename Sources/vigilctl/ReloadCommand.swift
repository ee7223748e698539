import ArgumentParser
import Foundation
import VigilCommon

/// `vigilctl reload`: asks vigild to re-read its config.
struct ReloadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reload",
        abstract: "Make vigild re-read and apply its config file.",
        discussion: """
            Calls Reload on org.vigil.Vigil1.Host. vigild validates the whole file first: when it \
            has problems nothing changes and each problem is printed on stderr as \
            file:line:column: key: message. When it is valid, added strategies start, removed \
            ones stop, changed ones restart and unchanged ones keep running with their leases; \
            what changed is printed. Changes to [host] need a restart of vigild and are reported, \
            not applied.

            Only root and the user vigild runs as may reload (others get AccessDenied).

            Exit status: 0 when the config was applied, 1 when it was not (invalid config, \
            access denied, or no vigild running).
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Flag(help: "Print {\"applied\": BOOL, \"messages\": [...]} on stdout instead of text.")
    var json = false

    struct Outcome: Codable {
        var applied: Bool
        var messages: [String]
    }

    func run() async throws {
        try await runReporting("reload") {
            let reply = try await VigilBusClient.with(busOptions) { try await $0.reload() }
            let (applied, messages) = (reply.applied, reply.messages)
            if json {
                printLine(try jsonText(Outcome(applied: applied, messages: messages)))
            } else if applied {
                printLine(messages.isEmpty ? "Config reloaded: nothing changed." : "Config reloaded:")
                for message in messages { printLine("  \(message)") }
            } else {
                FileHandle.standardError.write(Data("vigilctl reload: the config was not applied; vigild keeps running with the previous one:\n".utf8))
                for message in messages { FileHandle.standardError.write(Data("\(TerminalText.escaped(message))\n".utf8)) }
            }
            if !applied { throw ExitCode(1) }
        }
    }
}
