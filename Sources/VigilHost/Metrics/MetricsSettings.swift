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

/// An IPv4 or IPv6 address and a TCP port (`"127.0.0.1:9469"`, `"[::1]:9469"`).
public struct MetricsListenAddress: Sendable, Hashable, CustomStringConvertible {
    /// The numeric host, without brackets.
    public var host: String
    public var port: UInt16
    public var isIPv6: Bool { host.contains(":") }

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// Calls `body` with this address as a socket address (for bind, connect).
    func withSocketAddress<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        if isIPv6 {
            var sa = sockaddr_in6()
            sa.sin6_family = sa_family_t(AF_INET6)
            sa.sin6_port = port.bigEndian
            _ = host.withCString { inet_pton(AF_INET6, $0, &sa.sin6_addr) }
            return withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in6>.size)) } }
        }
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = port.bigEndian
        _ = host.withCString { inet_pton(AF_INET, $0, &sa.sin_addr) }
        return withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    }

    /// Parses `host:port` with a numeric host; names are refused so that
    /// binding never depends on a resolver.
    public static func parse(_ text: String) -> Result<MetricsListenAddress, MetricsAddressError> {
        let example = "expected a numeric address and port such as \"127.0.0.1:9469\" or \"[::1]:9469\""
        let host: Substring, port: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                return .failure(MetricsAddressError("\(example), found \"\(text)\""))
            }
            host = text[text.index(after: text.startIndex)..<close]
            port = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":"), !text[..<colon].contains(":") else {
                return .failure(MetricsAddressError("\(example), found \"\(text)\""))
            }
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        }
        guard let number = UInt16(port) else {
            return .failure(MetricsAddressError("\(example): the port must be 0 to 65535 (0: any free port, logged at start), found \"\(port)\""))
        }
        var v4 = in_addr(), v6 = in6_addr()
        let numeric = String(host).withCString { inet_pton(AF_INET, $0, &v4) == 1 || inet_pton(AF_INET6, $0, &v6) == 1 }
        guard numeric else {
            return .failure(MetricsAddressError("\(example): \"\(host)\" is not a numeric IPv4 or IPv6 address"))
        }
        return .success(MetricsListenAddress(host: String(host), port: number))
    }
}

/// Why a `listen` value is not an address to bind.
public struct MetricsAddressError: Error, Sendable, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}
