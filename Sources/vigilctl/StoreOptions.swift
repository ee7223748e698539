import ArgumentParser
import Foundation
import VigilCommon
import VigilSurvival

/// Where the survival log is, for the commands that read it without a host
/// (`vigilctl survival`, `vigilctl cost`).
struct StoreOptions: ParsableArguments {
    @Option(name: .customLong("state-dir"), help: ArgumentHelp(
        "vigild's state directory; the store is survival.sqlite inside it.",
        valueName: "dir"))
    var stateDir: String = HostPaths.defaultStateDir()

    @Option(help: ArgumentHelp("The survival store file (overrides --state-dir).", valueName: "file"))
    var store: String?

    var path: String { store ?? HostPaths.survivalStore(stateDir: stateDir) }

    /// `read` of the store for `vigilctl command`: a missing store gets one
    /// message saying where vigild keeps it, any other error its own line;
    /// both exit 1.
    func read<T>(for command: String, _ read: (_ path: String) throws -> T) throws -> T {
        do {
            return try read(path)
        } catch let error as SurvivalStoreError where error.code == .missing {
            FileHandle.standardError.write(Data("""
                vigilctl \(command): no survival store at \(path).
                vigild creates it on its first run; pass --store FILE or --state-dir DIR if it keeps its state elsewhere.

                """.utf8))
            throw ExitCode(1)
        } catch {
            FileHandle.standardError.write(Data("vigilctl \(command): \(error)\n".utf8))
            throw ExitCode(1)
        }
    }
}
