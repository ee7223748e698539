import ArgumentParser
import Foundation
import VigilCommon
import VigilSurvival

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

            --html FILE writes the same runs as one self-contained HTML page (an \
            inline SVG picture and the totals table; no scripts, readable offline): \
            one lane per run on a shared time axis, each wake as a mark coloured by \
            its cause, how each run ended, and a lane per strategy showing when it \
            held leases. --svg FILE writes the picture alone. Up to eight days it \
            is drawn as it happened; longer spans in columns (a year: one a day). \
            FILE - writes to standard output.
            """
    )

    @OptionGroup var storeOptions: StoreOptions

    @Flag(help: "Print the runs as a JSON array instead of text.")
    var json = false

    @Option(help: ArgumentHelp("How many of the newest runs to show (0 for all).", valueName: "n"))
    var runs: Int = 10

    @Option(help: ArgumentHelp("Line width for the timeline (default: the terminal's, else 80).", valueName: "columns"))
    var width: Int?

    @Option(help: ArgumentHelp(
        "Only runs alive since then: a duration back from now (7d, 36h) or a local date (2026-11-21, \"2026-11-21 09:00\"); the picture's axis starts there.",
        valueName: "when"))
    var since: String?

    @Option(help: ArgumentHelp("Write the runs as a self-contained HTML page (picture and totals) to this file ('-': standard output).", valueName: "file"))
    var html: String?

    @Option(help: ArgumentHelp("Write the picture alone as an SVG file ('-': standard output).", valueName: "file"))
    var svg: String?

    func validate() throws {
        guard runs >= 0 else { throw ValidationError("--runs must be 0 or more, got \(runs)") }
        if let width, width < 40 { throw ValidationError("--width must be at least 40, got \(width)") }
        if let since {
            do {
                _ = try SurvivalSince.wallMicros(since, nowWall: 0, timeZone: TimeZone(secondsFromGMT: 0) ?? .current)
            } catch {
                throw ValidationError("--since: \(error)")
            }
        }
        if html == "-" && svg == "-" { throw ValidationError("--html and --svg cannot both write to standard output") }
    }

    func run() throws {
        let path = storeOptions.path
        let display = DisplayTimeZone.resolve()
        let nowWall = Int64(Date().timeIntervalSince1970 * 1_000_000)
        let picture = try storeOptions.read(for: "survival") { path -> SurvivalPicture in
            let sinceWall = try since.map { try SurvivalSince.wallMicros($0, nowWall: nowWall, timeZone: display.zone) }
            let limit = runs == 0 ? nil : runs
            return html != nil || svg != nil
                ? try SurvivalPicture.load(path: path, runs: limit, sinceWallMicros: sinceWall)
                : SurvivalPicture(runs: try SurvivalReport.load(path: path, runs: limit, sinceWallMicros: sinceWall).map {
                    SurvivalPicture.Run(summary: $0, strategies: [])
                })
        }
        for warning in SurvivalReport.warnings(path: path) {
            FileHandle.standardError.write(Data("vigilctl survival: warning: \(warning)\n".utf8))
        }
        let summaries = picture.runs.map(\.summary)
        if let html {
            try write(SurvivalPictureFormat.html(picture, timeZone: display.zone, nowWall: nowWall, note: display.note), to: html, what: "page")
        }
        if let svg {
            try write(SurvivalPictureFormat.svg(picture, timeZone: display.zone, nowWall: nowWall), to: svg, what: "picture")
        }
        if html != nil || svg != nil, !json { return }
        if json {
            print(SurvivalReportFormat.json(summaries), terminator: "")
        } else {
            print(SurvivalReportFormat.text(summaries, width: width ?? Self.terminalWidth()), terminator: "")
        }
    }

    /// Writes `text` to `file` ('-': standard output) and says so on stderr.
    private func write(_ text: String, to file: String, what: String) throws {
        if file == "-" {
            print(text, terminator: "")
            return
        }
        do {
            var info = stat()
            if stat(file, &info) == 0, info.st_mode & S_IFMT != S_IFREG {
                // A FIFO, a terminal or /dev/stdout is written in place, as a
                // shell redirection would: an atomic write renames a new file
                // over it (run as root, `--html /dev/null` replaced the device).
                guard let handle = FileHandle(forWritingAtPath: file) else {
                    throw CocoaError(.fileWriteNoPermission)
                }
                defer { try? handle.close() }
                try handle.write(contentsOf: Data(text.utf8))
            } else {
                // A regular file is replaced whole: a reader never sees half a page.
                try Data(text.utf8).write(to: URL(fileURLWithPath: file), options: .atomic)
            }
        } catch {
            FileHandle.standardError.write(Data("vigilctl survival: cannot write \(file): \(error.localizedDescription)\n".utf8))
            throw ExitCode(1)
        }
        FileHandle.standardError.write(Data("vigilctl survival: wrote the \(what) to \(file) (\(text.utf8.count / 1024) KiB)\n".utf8))
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
