import Foundation

/// A one-shot HTTP GET of a metrics endpoint, for `vigilctl metrics` and the
/// benchmark: numeric address, bounded answer. HTTP/1.0, so servers answer
/// with the body up to the close, never chunked.
public enum MetricsScrape {
    /// The largest answer read (64 MiB).
    public static let maxAnswerBytes = 64 << 20

    /// GETs `path` from `address`; returns the status code and the body.
    public static func get(_ address: MetricsListenAddress, path: String = "/metrics", timeout: Duration = .seconds(10)) throws(MetricsScrapeError) -> (status: Int, body: [UInt8]) {
        let fail = { (what: String, code: Int32) in MetricsScrapeError("http://\(address)\(path): \(what): \(String(cString: strerror(code)))") }
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw fail("socket", errno) }
        defer { close(fd) }
        var tv = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let connected = address.withSocketAddress { connect(fd, $0, $1) }
        guard connected == 0 else { throw fail("connect", errno) }
        let request = Array("GET \(path) HTTP/1.0\r\nHost: \(address)\r\n\r\n".utf8)
        guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else {
            throw fail("send", errno)
        }
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while answer.count < maxAnswerBytes {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw fail("recv", errno) }
            if n == 0 { break }
            answer += chunk[..<n]
        }
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let headEnd = answer.indices.first(where: { answer[$0...].starts(with: separator) }) else {
            throw MetricsScrapeError("http://\(address)\(path): not an HTTP answer")
        }
        let statusLine = String(decoding: answer[..<(answer[..<headEnd].firstIndex(of: 13) ?? headEnd)], as: UTF8.self)
        let fields = statusLine.split(separator: " ")
        guard fields.count >= 2, fields[0].hasPrefix("HTTP/"), let status = Int(fields[1]) else {
            throw MetricsScrapeError("http://\(address)\(path): not an HTTP status line")
        }
        let head = String(decoding: answer[..<headEnd], as: UTF8.self).lowercased()
        guard !head.contains("transfer-encoding: chunked") else {
            throw MetricsScrapeError("http://\(address)\(path): answered with a chunked body to an HTTP/1.0 request")
        }
        return (status, Array(answer[(headEnd + 4)...]))
    }
}

public struct MetricsScrapeError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
