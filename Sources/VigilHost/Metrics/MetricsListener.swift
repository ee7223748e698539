import CTimer
import Foundation
import VigilKit

/// The HTTP `/metrics` endpoint: a minimal, exposition-only HTTP/1.1 server.
///
/// Why not an HTTP library: the ones that would fit (Hummingbird, Vapor,
/// anything on SwiftNIO) add minutes to every clean build and CI run for one
/// GET route, and run event-loop threads of their own. This answers exactly
/// what Prometheus asks (`GET /metrics`), one connection at a time, on one
/// thread blocked in `accept(2)`: while nobody scrapes, it never wakes.
///
/// Bounds: a request head is at most ``maxRequestBytes`` and must arrive
/// within ``readTimeout``; the answer must be taken within ``writeTimeout``.
/// Anything else gets 400, 404, 405 or 431 and the connection is closed.
public final class MetricsListener: Sendable {
    // `fd` is set in init and closed only by the accept thread after `stop`
    // shut it down (or by deinit when never started).
    private let fd: Int32
    private let state = Lock((started: false, stopping: false))
    public let address: MetricsListenAddress
    /// The port bound (the configured one, or the kernel's choice for 0).
    public let port: UInt16

    public static let maxRequestBytes = 8_192
    public static let readTimeout: Duration = .seconds(5)
    public static let writeTimeout: Duration = .seconds(10)

    /// Binds and listens; nothing is accepted before ``start(_:)``.
    public init(address: MetricsListenAddress) throws(MetricsListenerError) {
        self.address = address
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw MetricsListenerError(address, "socket", errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if address.isIPv6 {
            setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
        }
        let bound = address.withSocketAddress { bind(fd, $0, $1) }
        if bound != 0 || listen(fd, 16) != 0 {
            let code = errno
            close(fd)
            throw MetricsListenerError(address, bound != 0 ? "bind" : "listen", code)
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        let port = withUnsafePointer(to: &storage) { p -> UInt16 in
            address.isIPv6
                ? p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
                : p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
        self.fd = fd
        self.port = port
    }

    deinit {
        if !state.withLock({ $0.started }) { close(fd) }
    }

    /// Starts the accept thread; `exposition` is called once per scrape.
    public func start(_ exposition: @escaping @Sendable () async -> [UInt8]) {
        guard state.withLock({ s in defer { s.started = true }; return !s.started }) else { return }
        let thread = Thread { [self] in acceptLoop(exposition) }
        thread.name = "vigil-metrics"
        thread.start()
    }

    /// Stops accepting; a scrape being answered finishes first.
    public func stop() {
        let started = state.withLock { s in
            s.stopping = true
            return s.started
        }
        // Wakes the thread out of accept(2) (EINVAL); it closes the socket.
        if started { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    private func acceptLoop(_ exposition: @escaping @Sendable () async -> [UInt8]) {
        while true {
            let client = accept(fd, nil, nil)
            if client < 0 {
                let code = errno
                if state.withLock({ $0.stopping }) { break }
                if code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM {
                    // Out of descriptors or memory: let the host recover
                    // rather than spin on the same failure.
                    usleep(100_000)
                }
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            serve(client, exposition)
            close(client)
        }
        close(fd)
    }

    private func serve(_ client: Int32, _ exposition: @escaping @Sendable () async -> [UInt8]) {
        setTimeout(client, SO_RCVTIMEO, Self.readTimeout)
        setTimeout(client, SO_SNDTIMEO, Self.writeTimeout)
        guard let head = readHead(client) else {
            respond(client, status: "431 Request Header Fields Too Large", body: Array("request head larger than \(Self.maxRequestBytes) bytes or not finished in time\n".utf8))
            return
        }
        switch Self.route(head) {
        case .metrics(let withBody):
            let body = Self.run(exposition)
            respond(client, status: "200 OK", contentType: "text/plain; version=0.0.4; charset=utf-8", body: body, sendBody: withBody)
        case .error(let status, let message):
            respond(client, status: status, body: Array((message + "\n").utf8))
        }
    }

    enum Route: Equatable {
        case metrics(body: Bool)
        case error(String, String)
    }

    /// What to answer to a request head (its bytes up to the blank line).
    static func route(_ head: [UInt8]) -> Route {
        guard let end = head.firstIndex(of: UInt8(ascii: "\r")) ?? head.firstIndex(of: UInt8(ascii: "\n")) else {
            return .error("400 Bad Request", "no request line")
        }
        let parts = head[..<end].split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
        guard parts.count == 3, parts[2].starts(with: Array("HTTP/1.".utf8)) else {
            return .error("400 Bad Request", "expected a request line such as \"GET /metrics HTTP/1.1\"")
        }
        let method = String(decoding: parts[0], as: UTF8.self)
        let target = parts[1].split(separator: UInt8(ascii: "?"), maxSplits: 1, omittingEmptySubsequences: false).first ?? []
        guard target.elementsEqual("/metrics".utf8) else {
            return .error("404 Not Found", "vigild serves only /metrics here")
        }
        switch method {
        case "GET": return .metrics(body: true)
        case "HEAD": return .metrics(body: false)
        default: return .error("405 Method Not Allowed", "only GET and HEAD")
        }
    }

    /// Reads until the blank line ending the head; nil past the size bound,
    /// on timeout or when the peer closes first.
    private func readHead(_ client: Int32) -> [UInt8]? {
        var head: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1_024)
        while head.count < Self.maxRequestBytes {
            let n = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, min($0.count, Self.maxRequestBytes - head.count), 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return nil }
            head += chunk[..<n]
            if Self.headEnds(head) { return head }
        }
        return nil
    }

    static func headEnds(_ bytes: [UInt8]) -> Bool {
        let crlf: [UInt8] = [13, 10, 13, 10], lf: [UInt8] = [10, 10]
        return bytes.indices.contains { i in bytes[i...].starts(with: crlf) || bytes[i...].starts(with: lf) }
    }

    private func respond(_ client: Int32, status: String, contentType: String = "text/plain; charset=utf-8", body: [UInt8], sendBody: Bool = true) {
        var out = Array("HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8)
        if sendBody { out += body }
        var sent = 0
        while sent < out.count {
            let n = out.withUnsafeBytes { bytes -> Int in
                guard let base = bytes.baseAddress else { return 0 }
                return send(client, base + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
            }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            sent += n
        }
    }

    private func setTimeout(_ client: Int32, _ option: Int32, _ duration: Duration) {
        var tv = timeval(tv_sec: Int(duration.components.seconds), tv_usec: 0)
        setsockopt(client, SOL_SOCKET, option, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Runs `body` on the concurrency pool and blocks this (dedicated)
    /// thread until it returns.
    private static func run(_ body: @escaping @Sendable () async -> [UInt8]) -> [UInt8] {
        let done = DispatchSemaphore(value: 0)
        let slot = ResultSlot()
        // Unstructured task: not cancelled: the listener's thread waits for it (a scrape's body),
        // as a synchronous caller of async work.
        Task {
            let bytes = await body()
            slot.value.withLock { $0 = bytes }
            done.signal()
        }
        done.wait()
        return slot.value.withLock { $0 }
    }
}

/// Hands the exposition from the task that computed it to the listener thread.
private final class ResultSlot: Sendable {
    let value = Lock<[UInt8]>([])
}

/// The listener could not be set up.
public struct MetricsListenerError: Error, Sendable, CustomStringConvertible {
    public var description: String

    init(_ address: MetricsListenAddress, _ call: String, _ code: Int32) {
        description = "[metrics] listen = \"\(address)\": \(call): \(String(cString: strerror(code)))"
    }
}
