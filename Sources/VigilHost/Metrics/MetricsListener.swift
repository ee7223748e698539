import CTimer
import Foundation
import VigilKit

/// The HTTP `/metrics` endpoint: a minimal, exposition-only HTTP/1.1 server.
///
/// Why not an HTTP library: the ones that would fit (Hummingbird, Vapor,
/// anything on SwiftNIO) add minutes to every clean build and CI run for one
/// GET route, and run event-loop threads of their own. This answers exactly
/// what Prometheus asks (`GET /metrics`), one connection at a time, on the
/// host's ``EventLoop``: the non-blocking listening socket is watched for
/// readability, so while nobody scrapes nothing wakes, and the connection
/// is read and written as it is ready (the loop never waits for a client).
///
/// Bounds: a request head is at most ``maxRequestBytes`` and must arrive
/// within ``readTimeout``; the answer must be taken within ``writeTimeout``.
/// Anything else gets 400, 404, 405 or 431 and the connection is closed.
public final class MetricsListener: Sendable {
    // `fd` is set in init; once started it is closed only when the loop
    // releases the listening watch (after `stop`), else by deinit.
    // `state` holds the rest; the handlers run on the loop.
    private struct State {
        var started = false
        var stopping = false
        var watch: EventLoop.Watch?
        /// A connection is being answered: the listening watch waits for nothing meanwhile.
        var serving = false
        var backoff: EventLoop.Timer?
    }
    private let fd: Int32
    private let state = Lock(State())
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
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
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
        if state.withLock({ $0.watch == nil }) { close(fd) }
    }

    /// Starts accepting; `exposition` is called once per scrape.
    public func start(_ exposition: @escaping @Sendable () async -> [UInt8]) {
        guard state.withLock({ s in defer { s.started = true }; return !s.started && !s.stopping }) else { return }
        let fd = self.fd
        // The handler holds `self` until `stop` cancels the watch.
        guard let watch = try? EventLoop.watch(fd, for: .readable, handler: { _ in
            self.acceptOne(exposition)
        }, released: {
            close(fd)
        }) else {
            // Out of memory: nothing is accepted (scrapes wait in the
            // backlog and time out); the socket is closed by deinit.
            return
        }
        let stopped = state.withLock { s -> Bool in
            if !s.stopping { s.watch = watch }
            return s.stopping
        }
        if stopped { watch.cancel() }
    }

    /// Stops accepting; a scrape being answered finishes first.
    public func stop() {
        let (watch, backoff) = state.withLock { s in
            s.stopping = true
            defer { s.backoff = nil }
            return (s.watch, s.backoff)
        }
        backoff?.cancel()
        watch?.cancel()
    }

    /// On the loop: the listening socket is readable.
    private func acceptOne(_ exposition: @escaping @Sendable () async -> [UInt8]) {
        // accept4 is not in Glibc's Swift module; on Linux the accepted
        // socket inherits neither flag, so both are set here.
        let client = accept(fd, nil, nil)
        if client < 0 {
            let code = errno
            if code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM {
                // Out of descriptors or memory: let the host recover rather
                // than spin on the same failure; accept again in 100 ms.
                pause()
                let timer = try? EventLoop.Timer.after(.milliseconds(100)) { [self] in resume() }
                state.withLock { s in if !s.stopping { s.backoff = timer } }
            }
            return  // EAGAIN (another took it), ECONNABORTED: wait for the next
        }
        _ = fcntl(client, F_SETFD, FD_CLOEXEC)
        _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
        // One connection at a time: the listener waits for nothing until it is answered.
        pause()
        Connection(fd: client, exposition: exposition) { [self] in resume() }.start()
    }

    private func pause() {
        let watch = state.withLock { s in
            s.serving = true
            return s.watch
        }
        watch?.change(to: [])
    }

    private func resume() {
        let watch = state.withLock { s in
            s.serving = false
            s.backoff = nil
            return s.stopping ? nil : s.watch
        }
        watch?.change(to: .readable)
    }

    /// One client, read and answered as it is ready.
    // Invariant: touched only on the loop (its watch's handler, its timers,
    // and the post that hands it the exposition), one call at a time.
    private final class Connection: @unchecked Sendable {
        let fd: Int32
        let exposition: @Sendable () async -> [UInt8]
        let done: @Sendable () -> Void
        var watch: EventLoop.Watch?
        var timer: EventLoop.Timer?
        var head: [UInt8] = []
        var out: [UInt8] = []
        var sent = 0
        var writing = false
        var closed = false

        init(fd: Int32, exposition: @escaping @Sendable () async -> [UInt8], done: @escaping @Sendable () -> Void) {
            self.fd = fd
            self.exposition = exposition
            self.done = done
        }

        func start() {
            let fd = self.fd
            // The handler holds the connection until `finish` cancels it.
            guard let watch = try? EventLoop.watch(fd, for: .readable, handler: { _ in self.ready() }, released: { close(fd) }) else {
                close(fd)
                closed = true
                done()
                return
            }
            self.watch = watch
            timer = try? EventLoop.Timer.after(MetricsListener.readTimeout) { self.timedOut() }
        }

        func ready() {
            guard !closed else { return }
            if writing { flush(); return }
            var chunk = [UInt8](repeating: 0, count: 1_024)
            while head.count < MetricsListener.maxRequestBytes {
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, min($0.count, MetricsListener.maxRequestBytes - head.count), 0) }
                if n < 0 && errno == EINTR { continue }
                if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
                guard n > 0 else { return tooLarge() }  // closed or failed before the head ended
                head += chunk[..<n]
                if MetricsListener.headEnds(head) { return route() }
            }
            tooLarge()
        }

        func timedOut() {
            timer = nil
            guard !closed else { return }
            // Reading: the head did not come in time; writing: the answer was not taken.
            if writing { finish() } else { tooLarge() }
        }

        func tooLarge() {
            respond(status: "431 Request Header Fields Too Large", body: Array("request head larger than \(MetricsListener.maxRequestBytes) bytes or not finished in time\n".utf8))
        }

        func route() {
            timer?.cancel()
            timer = nil
            switch MetricsListener.route(head) {
            case .metrics(let withBody):
                // Nothing to wait for on the socket while the exposition is built.
                watch?.change(to: [])
                let exposition = self.exposition
                // Unstructured task: not cancelled: one scrape's body; the
                // answer is written on the loop.
                Task {
                    let body = await exposition()
                    EventLoop.post {
                        self.respond(status: "200 OK", contentType: "text/plain; version=0.0.4; charset=utf-8", body: body, sendBody: withBody)
                    }
                }
            case .error(let status, let message):
                respond(status: status, body: Array((message + "\n").utf8))
            }
        }

        func respond(status: String, contentType: String = "text/plain; charset=utf-8", body: [UInt8], sendBody: Bool = true) {
            guard !closed else { return }
            timer?.cancel()
            out = Array("HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8)
            if sendBody { out += body }
            writing = true
            timer = try? EventLoop.Timer.after(MetricsListener.writeTimeout) { self.timedOut() }
            flush()
        }

        func flush() {
            while sent < out.count {
                let n = out.withUnsafeBytes { bytes -> Int in
                    guard let base = bytes.baseAddress else { return 0 }
                    return send(fd, base + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
                }
                if n < 0 && errno == EINTR { continue }
                if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                    watch?.change(to: .writable)
                    return
                }
                guard n > 0 else { break }
                sent += n
            }
            finish()
        }

        func finish() {
            guard !closed else { return }
            closed = true
            timer?.cancel()
            timer = nil
            watch?.cancel()  // its `released` closes the socket
            watch = nil
            done()
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

    static func headEnds(_ bytes: [UInt8]) -> Bool {
        let crlf: [UInt8] = [13, 10, 13, 10], lf: [UInt8] = [10, 10]
        return bytes.indices.contains { i in bytes[i...].starts(with: crlf) || bytes[i...].starts(with: lf) }
    }

}

/// The listener could not be set up.
public struct MetricsListenerError: Error, Sendable, CustomStringConvertible {
    public var description: String

    init(_ address: MetricsListenAddress, _ call: String, _ code: Int32) {
        description = "[metrics] listen = \"\(address)\": \(call): \(String(cString: strerror(code)))"
    }
}
