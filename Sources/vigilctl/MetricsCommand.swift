import ArgumentParser
import Foundation
import VigilCommon

struct MetricsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "metrics",
        abstract: "Print the host's Prometheus metrics.",
        discussion: """
        Reads the config's [metrics] table (through `vigild --print-metrics-settings`, the \
        vigild beside vigilctl, else the one on PATH): with listen, fetches \
        http://ADDRESS/metrics from the running vigild; else with textfile, prints the file \
        vigild wrote at its last heartbeat. --listen fetches from an address without reading a \
        config. See docs/metrics.md.

        Exit status: 0 on success, 1 when no metrics can be read.
        """
    )

    @Option(name: [.short, .customLong("config")], help: ArgumentHelp(
        "vigild's TOML config file.",
        discussion: "Default: $VIGIL_CONFIG, else ~/.config/vigil/vigil.toml (or /etc/vigil/vigil.toml for root) if it exists.",
        valueName: "file"))
    var config: String?

    @Option(help: ArgumentHelp("Fetch from this address instead (\"127.0.0.1:9469\").", valueName: "address"))
    var listen: String?

    func run() throws {
        do {
            try FileHandle.standardOutput.write(contentsOf: Self.printable(try exposition()))
        } catch let error as ValidationError {
            throw error
        } catch {
            FileHandle.standardError.write(Data("vigilctl metrics: \(TerminalText.escaped("\(error)"))\n".utf8))
            throw ExitCode(1)
        }
    }

    private func exposition() throws -> Data {
        if let listen {
            switch MetricsListenAddress.parse(listen) {
            case .success(let address): return try fetch(address)
            case .failure(let error): throw ValidationError("--listen: \(error)")
            }
        }
        let path = try configPath()
        let settings = try Self.settings(config: path)
        if let address = settings.listen {
            do {
                return try fetch(address)
            } catch where settings.textfile != nil {
                // vigild is not answering: the last textfile still tells something.
                FileHandle.standardError.write(Data("vigilctl metrics: \(TerminalText.escaped("\(error)")); printing [metrics] textfile instead\n".utf8))
            }
        }
        if let textfile = settings.textfile {
            guard let data = FileManager.default.contents(atPath: textfile) else {
                throw MetricsScrapeError("cannot read \(textfile) ([metrics] textfile in \(path)); vigild writes it at each heartbeat")
            }
            return data
        }
        throw MetricsScrapeError("\(path) has no [metrics] listen or textfile: add one (docs/metrics.md), or pass --listen ADDRESS")
    }

    /// The config's `[metrics]` listen and textfile, as vigild reads them.
    static func settings(config path: String) throws -> (listen: MetricsListenAddress?, textfile: String?) {
        struct Answer: Decodable {
            var listen: String?
            var textfile: String?
        }
        let (status, stdout, stderr) = try VigildTool.output(["--print-metrics-settings", "--config", path])
        guard status == 0 else {
            let problems = stderr.trimmingCharacters(in: .whitespacesAndNewlines)
            throw MetricsScrapeError(problems.isEmpty ? "vigild --print-metrics-settings ended with status \(status)" : problems)
        }
        let answer: Answer
        do {
            answer = try JSONDecoder().decode(Answer.self, from: stdout)
        } catch {
            throw MetricsScrapeError("vigild --print-metrics-settings answered what is not its JSON: \(error)")
        }
        var listen: MetricsListenAddress?
        if let text = answer.listen {
            switch MetricsListenAddress.parse(text) {
            case .success(let address): listen = address
            case .failure(let error): throw MetricsScrapeError("\(path): [metrics] listen: \(error)")
            }
        }
        return (listen, answer.textfile)
    }

    private func fetch(_ address: MetricsListenAddress) throws -> Data {
        let (status, body) = try MetricsScrape.get(address)
        guard status == 200 else {
            throw MetricsScrapeError("http://\(address)/metrics answered \(status): \(String(decoding: Self.printable(Data(body.prefix(200))), as: UTF8.self))")
        }
        return Data(body)
    }

    private func configPath() throws -> String {
        if let config { return config }
        let (found, candidates) = HostPaths.defaultConfig()
        if let found { return found }
        throw ValidationError("no config file: pass --config FILE or --listen ADDRESS (looked for \(candidates.joined(separator: ", ")))")
    }

    /// The exposition never holds control characters besides newlines (label
    /// values are escaped): any other, from whatever answered, becomes `?`
    /// before it reaches a terminal.
    static func printable(_ data: Data) -> Data {
        Data(data.map { $0 < 0x20 && $0 != 0x0A && $0 != 0x09 || $0 == 0x7F ? UInt8(ascii: "?") : $0 })
    }
}
