import CVoipSocket
import Glibc
import VigilKit

/// The `connect` target: a host name or address literal and a port.
struct Endpoint: Sendable, Hashable, CustomStringConvertible {
    var host: String
    var port: UInt16

    /// Parses `host:port`, `1.2.3.4:port` or `[v6 address]:port`.
    static func parse(_ text: String) -> Result<Endpoint, ByteEscapes.Problem> {
        let example = "expected host:port such as \"sip.example.org:5060\", \"192.0.2.7:5060\" or \"[2001:db8::7]:5060\", found \"\(text)\""
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return .failure(.init(message: "missing \"]\" after the IPv6 address: \(example)")) }
            host = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { return .failure(.init(message: "missing \":port\" after \"]\": \(example)")) }
            portText = rest.dropFirst()
        } else {
            guard let colon = text.lastIndex(of: ":") else { return .failure(.init(message: "missing \":port\": \(example)")) }
            host = text[..<colon]
            if host.contains(":") {
                return .failure(.init(message: "an IPv6 address needs brackets: \(example)"))
            }
            portText = text[text.index(after: colon)...]
        }
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace }) else { return .failure(.init(message: "empty or blank host: \(example)")) }
        guard let port = UInt16(portText), port > 0 else {
            return .failure(.init(message: "port \"\(portText)\" is not a number in 1...65535: \(example)"))
        }
        return .success(Endpoint(host: String(host), port: port))
    }

    var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// One resolved address, ready for connect(2).
struct SocketAddress: Sendable, CustomStringConvertible {
    var family: Int32
    var storage: [UInt8]

    var description: String {
        storage.withUnsafeBytes { raw -> String in
            guard let base = raw.baseAddress else { return "?" }
            var buffer = [CChar](repeating: 0, count: 80)
            let rc = vigil_format_address(base.assumingMemoryBound(to: sockaddr.self), &buffer, Int32(buffer.count))
            return rc == 0 ? text(buffer) : "?"
        }
    }
}

/// Why an address could not be used.
struct ResolveError: Error, CustomStringConvertible {
    var description: String
}

enum AddressResolver {
    /// Resolves `endpoint` to TCP addresses (IPv6 and IPv4, in the order the
    /// system's resolver prefers). Numeric addresses are converted inline;
    /// names go through getaddrinfo(3) on a thread of their own, because it
    /// blocks (a DNS round trip, or its timeouts) and must not hold a Swift
    /// executor thread or the socket event thread.
    static func resolve(_ endpoint: Endpoint) async throws -> [SocketAddress] {
        if let numeric = try? lookup(endpoint, numericOnly: true), !numeric.isEmpty { return numeric }
        let box = ResolutionBox()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[SocketAddress], any Error>) in
                box.start(endpoint, continuation)
            }
        } onCancel: {
            // getaddrinfo cannot be interrupted: the caller goes on, and the
            // thread's late answer is dropped.
            box.finish(.failure(CancellationError()))
        }
    }

    static func lookup(_ endpoint: Endpoint, numericOnly: Bool) throws -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_protocol = Int32(IPPROTO_TCP)
        hints.ai_flags = numericOnly ? (AI_NUMERICHOST | AI_NUMERICSERV) : (AI_ADDRCONFIG | AI_NUMERICSERV)
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &result)
        guard rc == 0 else {
            let reason = rc == EAI_SYSTEM ? String(cString: strerror(errno)) : String(cString: gai_strerror(rc))
            throw ResolveError(description: "cannot resolve \"\(endpoint.host)\": \(reason)")
        }
        defer { freeaddrinfo(result) }
        var out: [SocketAddress] = []
        var cursor = result
        while let info = cursor {
            let entry = info.pointee
            if let address = entry.ai_addr, entry.ai_family == AF_INET || entry.ai_family == AF_INET6 {
                let bytes = Array(UnsafeRawBufferPointer(start: address, count: Int(entry.ai_addrlen)))
                out.append(SocketAddress(family: entry.ai_family, storage: bytes))
            }
            cursor = entry.ai_next
        }
        if out.isEmpty { throw ResolveError(description: "cannot resolve \"\(endpoint.host)\": no IPv4 or IPv6 address") }
        return out
    }

    /// Hands the blocking lookup to a detached thread and its answer back,
    /// once: to the first of the thread and cancellation.
    private final class ResolutionBox: Sendable {
        private struct State {
            var continuation: CheckedContinuation<[SocketAddress], any Error>?
            var early: Result<[SocketAddress], any Error>?
        }
        private let state = Lock(State())

        func finish(_ result: Result<[SocketAddress], any Error>) {
            let c = state.withLock { s -> CheckedContinuation<[SocketAddress], any Error>? in
                guard let c = s.continuation else {
                    if s.early == nil { s.early = result }
                    return nil
                }
                s.continuation = nil
                return c
            }
            c?.resume(with: result)
        }

        func start(_ endpoint: Endpoint, _ continuation: CheckedContinuation<[SocketAddress], any Error>) {
            let early = state.withLock { s -> Result<[SocketAddress], any Error>? in
                if let early = s.early { return early }
                s.continuation = continuation
                return nil
            }
            if let early { continuation.resume(with: early); return }
            let request = Unmanaged.passRetained(BoxedRequest(box: self, endpoint: endpoint)).toOpaque()
            var thread = pthread_t()
            let rc = pthread_create(&thread, nil, { raw in
                guard let raw else { return nil }
                let request = Unmanaged<BoxedRequest>.fromOpaque(raw).takeRetainedValue()
                request.box.finish(Result { try AddressResolver.lookup(request.endpoint, numericOnly: false) })
                return nil
            }, request)
            if rc == 0 {
                pthread_detach(thread)
            } else {
                Unmanaged<BoxedRequest>.fromOpaque(request).release()
                finish(.failure(ResolveError(description: "cannot resolve \"\(endpoint.host)\": no thread for the lookup (\(String(cString: strerror(rc))))")))
            }
        }
    }

    private final class BoxedRequest: Sendable {
        let box: ResolutionBox
        let endpoint: Endpoint
        init(box: ResolutionBox, endpoint: Endpoint) {
            self.box = box
            self.endpoint = endpoint
        }
    }
}

/// A NUL-terminated C buffer as a String.
func text(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
