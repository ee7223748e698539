import ArgumentParser
import Foundation
import VigilHost

/// `vigilctl survival`: how long the host stayed alive and why each run ended,
/// read straight from the survival log (no running host needed).
struct SurvivalCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "survival",
        abstract: "Show how long each host run stayed alive, and how it ended.",
        discussion: """
            Reads the survival log (SQLite, opened read-only) that vigild writes \
            every heartbeat interval, so it works whether or not vigild is running.

            For each run, newest first: start and end, how it ended (stopped, \
            killed, rebooted, failed, or still running), alive time (start to last \
            heartbeat), awake time (CLOCK_MONOTONIC: without suspend), suspended \
            time, frozen/stalled gaps (count and longest), and a timeline bar: \
            '=' awake, 'z' suspended, '!' frozen or stalled.

            A gap is suspended when CLOCK_BOOTTIME grew more than CLOCK_MONOTONIC \
            between heartbeats, and frozen/stalled when the system was awake but \
            the next heartbeat came later than interval + max(interval/2, 2 s). \
            See docs/survival.md.
            """
    )

    @OptionGroup var storeOptions: StoreOptions

    @Flag(help: "Print the runs as a JSON array instead of text.")
    var json = false

    @Option(help: ArgumentHelp("How many of the newest runs to show (0 for all).", valueName: "n"))
    var runs: Int = 10

    @Option(help: ArgumentHelp("Line width for the timeline (default: the terminal's, else 80).", valueName: "columns"))
    var width: Int?

    func validate() throws {
        guard runs >= 0 else { throw ValidationError("--runs must be 0 or more, got \(runs)") }
        if let width, width < 40 { throw ValidationError("--width must be at least 40, got \(width)") }
    }

    func run() throws {
        let path = storeOptions.path
        let summaries = try storeOptions.read(for: "survival") { path in
            try SurvivalReport.load(path: path, runs: runs == 0 ? nil : runs, sinceWallMicros: nil)
        }
        for warning in SurvivalReport.warnings(path: path) {
            FileHandle.standardError.write(Data("vigilctl survival: warning: \(warning)\n".utf8))
        }
        if json {
            print(SurvivalReportFormat.json(summaries), terminator: "")
        } else {
            print(SurvivalReportFormat.text(summaries, width: width ?? Self.terminalWidth()), terminator: "")
        }
    }

    /// Columns of the terminal on stdout, else $COLUMNS, else 80.
    static func terminalWidth() -> Int {
        var size = winsize()
        if isatty(STDOUT_FILENO) == 1, ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col >= 40 {
            return Int(size.ws_col)
        }
        if let columns = ProcessInfo.processInfo.environment["COLUMNS"].flatMap(Int.init), columns >= 40 {
            return columns
        }
        return 80
    }
}
