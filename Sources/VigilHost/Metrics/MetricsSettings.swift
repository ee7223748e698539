import Foundation
import VigilKit

/// The validated `[metrics]` table: how the host's Prometheus metrics leave
/// the host (docs/metrics.md). Both ways are off unless configured.
public struct MetricsSettings: Sendable, Equatable {
    /// A node_exporter textfile-collector file written at each heartbeat
    /// (`textfile`), e.g. `/var/lib/prometheus/node-exporter/vigil.prom`.
    public var textfile: String?
    /// Where the HTTP `/metrics` listener binds (`listen`).
    public var listen: MetricsListenAddress?

    public init(textfile: String? = nil, listen: MetricsListenAddress? = nil) {
        self.textfile = textfile
        self.listen = listen
    }

    /// True when at least one way out is configured.
    public var isEnabled: Bool { textfile != nil || listen != nil }

    static let keyNames = ["textfile", "listen"]

    /// Reads `[metrics]` through `reader`, which records every problem.
    static func read(_ reader: ConfigReader, configDirectory: String) -> MetricsSettings {
        var settings = MetricsSettings()
        if let text = reader.string("textfile") {
            if text.trimmingCharacters(in: .whitespaces).isEmpty {
                reader.problem("textfile", "expected a file path such as \"/var/lib/prometheus/node-exporter/vigil.prom\", found an empty string")
            } else if !text.hasSuffix(".prom") {
                reader.problem("textfile", "expected a file name ending in \".prom\" (node_exporter's textfile collector reads only those), found \"\(text)\"")
            } else {
                settings.textfile = resolvePath(text, relativeTo: configDirectory)
            }
        }
        if let text = reader.string("listen") {
            switch MetricsListenAddress.parse(text) {
            case .success(let address): settings.listen = address
            case .failure(let message): reader.problem("listen", message.description)
            }
        }
        return settings
    }
}
