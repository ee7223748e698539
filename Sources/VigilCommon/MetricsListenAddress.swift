import Foundation

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
    package func withSocketAddress<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
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
