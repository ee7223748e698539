import CVoipSocket
import Glibc
import Synchronization
import VigilKit

/// Why a link stopped or an operation on it failed, in words for people.
struct LinkError: Error, CustomStringConvertible, Equatable {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Socket options applied before connecting.
struct LinkOptions: Sendable, Hashable {
    /// TCP_KEEPIDLE, TCP_KEEPINTVL (whole seconds) and TCP_KEEPCNT; nil: off.
    var keepalive: (idle: Int32, interval: Int32, count: Int32)?
    /// TCP_USER_TIMEOUT in milliseconds; 0 leaves the kernel default.
    var userTimeoutMilliseconds: UInt32
    /// The pong bytes to look for after a ping; empty: no pong expected.
    var expect: [UInt8]
    /// Keep incoming bytes for `nextData()` (an `on_data` hook is configured).
    var collectsData: Bool

    static func == (a: Self, b: Self) -> Bool {
        a.keepalive?.idle == b.keepalive?.idle && a.keepalive?.interval == b.keepalive?.interval
            && a.keepalive?.count == b.keepalive?.count && a.userTimeoutMilliseconds == b.userTimeoutMilliseconds
            && a.expect == b.expect && a.collectsData == b.collectsData
    }

    func hash(into h: inout Hasher) {
        h.combine(keepalive?.idle); h.combine(keepalive?.interval); h.combine(keepalive?.count)
        h.combine(userTimeoutMilliseconds); h.combine(expect); h.combine(collectsData)
    }
}

/// One TCP connection on the plugin's ``SocketEventLoop``.
///
/// The event thread reads whatever arrives and, under the link's lock,
/// notes the time, matches the pong, queues data for the `on_data` hook and
/// resumes whoever waits. Async callers connect, send, await a pong, await
/// data and await the end of the connection; each wait is cancellable, so the
/// strategy can race it against a deadline on the host's clock.
final class TCPLink: Sendable {
    private enum Phase { case connecting, open, ended }

    private struct State {
        var fd: Int32
        var token: UInt64 = 0
        var phase = Phase.connecting
        var connectOutcome: Int32?
        var connectWaiter: CheckedContinuation<Void, any Error>?
        var outEdges: UInt64 = 0
        var writeWaiter: CheckedContinuation<Void, any Error>?
        var endReason: String?
        var endWaiter: CheckedContinuation<String, Never>?
        var lastReceived: VigilInstant?
        var bytesReceived: UInt64 = 0
        var awaitingPong = false
        var pongScan: [UInt8] = []
        var pongAt: VigilInstant?
        var pongWaiter: CheckedContinuation<VigilInstant, any Error>?
        var data: [UInt8] = []
        var droppedData = 0
        var dataWaiter: CheckedContinuation<[UInt8], any Error>?
        /// The running ping handler's deadline passed: its waits fail.
        var handlerExpired = false
    }

    /// The ping handler's deadline passed while it waited on this link.
    private struct HandlerDeadlinePassed: Error {}

    /// Most bytes kept for the `on_data` hook while it runs; beyond that the
    /// oldest are dropped (and counted).
    static let dataCap = 1 << 20

    let clock: any VigilClock
    let options: LinkOptions
    private let loop: SocketEventLoop
    private let state: Mutex<State>

    private init(fd: Int32, clock: any VigilClock, options: LinkOptions, loop: SocketEventLoop) {
        self.clock = clock
        self.options = options
        self.loop = loop
        self.state = Mutex(State(fd: fd))
    }

    /// Opens a socket to `address` with `options` and waits until it is
    /// connected. Cancelling the caller (a connect timeout) closes the socket.
    static func connect(to address: SocketAddress, options: LinkOptions, clock: any VigilClock, loop: SocketEventLoop = .shared) async throws -> TCPLink {
        let fd = vigil_tcp_socket(address.family)
        guard fd >= 0 else { throw LinkError("cannot create a socket for \(address): \(String(cString: strerror(errno)))") }
        if let k = options.keepalive {
            let rc = vigil_set_tcp_keepalive(fd, k.idle, k.interval, k.count)
            if rc != 0 { Glibc.close(fd); throw LinkError("cannot set TCP keepalive on the socket: \(String(cString: strerror(rc)))") }
        }
        if options.userTimeoutMilliseconds > 0 {
            let rc = vigil_set_user_timeout(fd, options.userTimeoutMilliseconds)
            if rc != 0 { Glibc.close(fd); throw LinkError("cannot set TCP_USER_TIMEOUT on the socket: \(String(cString: strerror(rc)))") }
        }
        // Connect first, then watch: a socket not yet connecting polls as
        // writable and hung up, which would read as a finished connect.
        // Adding it to epoll afterwards reports whatever state it reached.
        let rc = address.storage.withUnsafeBytes { raw in
            vigil_connect(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))  // storage is never empty: it came from getaddrinfo
        }
        guard rc == 0 || rc == EINPROGRESS else {
            Glibc.close(fd)
            throw LinkError("connect to \(address) failed: \(String(cString: strerror(rc)))")
        }
        let link = TCPLink(fd: fd, clock: clock, options: options, loop: loop)
        do {
            let token = try loop.register(link, fd: fd)
            link.state.withLock { $0.token = token }
        } catch {
            link.close()
            throw error
        }
        if rc == 0 {
            link.state.withLock { if $0.phase == .connecting { $0.phase = .open } }
            return link
        }
        do {
            try await link.awaitConnected()
        } catch is CancellationError {
            link.close()
            throw CancellationError()
        } catch {
            link.close()
            throw LinkError("connect to \(address) failed: \(error)")
        }
        return link
    }

    // MARK: - Event thread

    /// Called by the event thread with the readiness bits of this socket.
    func handle(events: UInt32, buffer: UnsafeMutableRawBufferPointer) {
        var resumes: [() -> Void] = []
        state.withLock { s in
            guard s.fd >= 0 else { return }
            if s.phase == .connecting {
                guard events & (vigil_EV_OUT | vigil_EV_ERR | vigil_EV_HUP) != 0 else { return }
                let error = vigil_socket_error(s.fd)
                s.connectOutcome = error
                if error == 0 { s.phase = .open }
                if let w = s.connectWaiter {
                    s.connectWaiter = nil
                    resumes.append(error == 0 ? { w.resume() } : { w.resume(throwing: LinkError(String(cString: strerror(error)))) })
                }
                if error != 0 { return }
            }
            if events & vigil_EV_OUT != 0 {
                s.outEdges &+= 1
                if let w = s.writeWaiter {
                    s.writeWaiter = nil
                    resumes.append { w.resume() }
                }
            }
            if events & (vigil_EV_IN | vigil_EV_RDHUP | vigil_EV_HUP | vigil_EV_ERR) != 0, s.phase == .open {
                drain(&s, buffer: buffer, resumes: &resumes)
            }
        }
        for resume in resumes { resume() }
    }

    /// Reads until the socket has nothing more (edge-triggered epoll).
    private func drain(_ s: inout State, buffer: UnsafeMutableRawBufferPointer, resumes: inout [() -> Void]) {
        while true {
            let n = vigil_recv(s.fd, buffer.baseAddress, UInt(buffer.count))
            if n > 0 {
                deliver(&s, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), resumes: &resumes)
                continue
            }
            if n == 0 {
                end(&s, "the peer closed the connection", resumes: &resumes)
            } else if errno == ECONNRESET {
                end(&s, "the peer reset the connection", resumes: &resumes)
            } else if errno == ENOTCONN {
                // The socket's error was taken by an earlier call (SO_ERROR
                // after connect, or a failed send, which recorded it).
                end(&s, "connection lost (reset or timed out)", resumes: &resumes)
            } else if errno != EAGAIN && errno != EWOULDBLOCK {
                end(&s, "connection lost: \(String(cString: strerror(errno)))", resumes: &resumes)
            }
            return
        }
    }

    private func deliver(_ s: inout State, _ bytes: UnsafeRawBufferPointer, resumes: inout [() -> Void]) {
        let now = clock.now
        s.lastReceived = now
        s.bytesReceived &+= UInt64(bytes.count)
        var forData: [UInt8] = []
        if s.awaitingPong {
            s.pongScan.append(contentsOf: bytes)
            if let match = s.pongScan.firstRange(of: options.expect) {
                s.awaitingPong = false
                s.pongAt = now
                forData = Array(s.pongScan[..<match.lowerBound]) + s.pongScan[match.upperBound...]
                s.pongScan = []
                if let w = s.pongWaiter {
                    s.pongWaiter = nil
                    resumes.append { w.resume(returning: now) }
                }
            } else if s.pongScan.count > 64 * 1024 {
                // Not a pong: keep only a tail that could still start one.
                let keep = max(0, options.expect.count - 1)
                forData = Array(s.pongScan.dropLast(keep))
                s.pongScan = Array(s.pongScan.suffix(keep))
            }
        } else if options.collectsData {
            forData = Array(bytes)
        }
        guard options.collectsData, !forData.isEmpty else { return }
        s.data.append(contentsOf: forData)
        if s.data.count > Self.dataCap {
            s.droppedData += s.data.count - Self.dataCap
            s.data.removeFirst(s.data.count - Self.dataCap)
        }
        if let w = s.dataWaiter {
            s.dataWaiter = nil
            let data = s.data
            s.data = []
            resumes.append { w.resume(returning: data) }
        }
    }

    /// Marks the link ended and fails every waiter (the fd stays until `close`).
    private func end(_ s: inout State, _ reason: String, resumes: inout [() -> Void]) {
        if s.endReason == nil { s.endReason = reason }
        s.phase = .ended
        let error = LinkError(s.endReason ?? reason)
        if let w = s.endWaiter { s.endWaiter = nil; let r = s.endReason ?? reason; resumes.append { w.resume(returning: r) } }
        if let w = s.pongWaiter { s.pongWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.writeWaiter { s.writeWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.connectWaiter { s.connectWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.dataWaiter {
            s.dataWaiter = nil
            if s.data.isEmpty {
                resumes.append { w.resume(throwing: error) }
            } else {
                let data = s.data
                s.data = []
                resumes.append { w.resume(returning: data) }
            }
        }
    }

    // MARK: - Callers

    private func awaitConnected() async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let now: Result<Void, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if let outcome = s.connectOutcome {
                        return outcome == 0 ? .success(()) : .failure(LinkError(String(cString: strerror(outcome))))
                    }
                    if let reason = s.endReason { return .failure(LinkError(reason)) }
                    s.connectWaiter = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.connectWaiter = nil }; return s.connectWaiter }
            w?.resume(throwing: CancellationError())
        }
    }

    /// The local and remote addresses, "1.2.3.4:5" or "[::1]:5".
    var addresses: (local: String, remote: String) {
        state.withLock { s in
            var local = [CChar](repeating: 0, count: 80), remote = [CChar](repeating: 0, count: 80)
            let l = vigil_socket_address(s.fd, 0, &local, 80) == 0 ? text(local) : "?"
            let r = vigil_socket_address(s.fd, 1, &remote, 80) == 0 ? text(remote) : "?"
            return (l, r)
        }
    }

    /// When bytes last arrived, if ever.
    var lastReceived: VigilInstant? { state.withLock { $0.lastReceived } }

    /// Bytes received since the connection opened.
    var bytesReceived: UInt64 { state.withLock { $0.bytesReceived } }

    /// Bytes the `on_data` queue dropped because the hook fell behind.
    var droppedData: Int { state.withLock { $0.droppedData } }

    /// Sends all of `bytes`, waiting for room when the socket buffer is full.
    func send(_ bytes: [UInt8]) async throws {
        var offset = 0
        var pendingResumes: [() -> Void] = []
        defer { for resume in pendingResumes { resume() } }
        while offset < bytes.count {
            let (count, error, edges): (Int, Int32, UInt64) = try state.withLock { s in
                if let reason = s.endReason { throw LinkError(reason) }
                guard s.fd >= 0 else { throw LinkError("the connection is closed") }
                let n = bytes.withUnsafeBytes { raw in vigil_send(s.fd, raw.baseAddress! + offset, UInt(raw.count - offset)) }  // non-empty: offset < count
                let error = n < 0 ? errno : 0
                if n < 0, error != EAGAIN, error != EWOULDBLOCK {
                    // This took the socket's error: record it as the end, or
                    // the event thread would only see ENOTCONN.
                    var resumes: [() -> Void] = []
                    end(&s, "connection lost: \(String(cString: strerror(error)))", resumes: &resumes)
                    pendingResumes = resumes
                }
                return (n, error, s.outEdges)
            }
            if count > 0 { offset += count; continue }
            if error == EAGAIN || error == EWOULDBLOCK {
                try await awaitWritable(after: edges)
                continue
            }
            throw LinkError("send failed: \(String(cString: strerror(error)))")
        }
    }

    private func awaitWritable(after edges: UInt64) async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let now: Result<Void, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if let reason = s.endReason { return .failure(LinkError(reason)) }
                    if s.handlerExpired { return .failure(HandlerDeadlinePassed()) }
                    if s.outEdges != edges { return .success(()) }  // room appeared since the failed send
                    s.writeWaiter = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.writeWaiter = nil }; return s.writeWaiter }
            w?.resume(throwing: CancellationError())
        }
    }

    /// Starts looking for the pong in what arrives from now on; call before
    /// sending the ping so a fast pong is not missed.
    func expectPong() {
        state.withLock { s in
            s.awaitingPong = true
            s.pongScan = []
            s.pongAt = nil
        }
    }

    /// Waits for the pong `expectPong` started looking for; returns when it
    /// arrived (read on the event thread, for the round-trip time).
    func awaitPong() async throws -> VigilInstant {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<VigilInstant, any Error>) in
                let now: Result<VigilInstant, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if let at = s.pongAt { return .success(at) }
                    if let reason = s.endReason { return .failure(LinkError(reason)) }
                    if s.handlerExpired { return .failure(HandlerDeadlinePassed()) }
                    s.pongWaiter = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.pongWaiter = nil }; return s.pongWaiter }
            w?.resume(throwing: CancellationError())
        }
    }

    /// Runs the ping handler `body`, which waits on this link only (``send``,
    /// ``awaitPong``), until it finishes or `deadline` passes on the link's
    /// clock, whichever comes first; nil when the deadline won.
    ///
    /// `body` runs in the caller's task; one child task sleeps until the
    /// deadline and then fails the handler's waits on this link. That is one
    /// task per handler instead of two (body and timer racing in a group),
    /// which matters when 10,000 handlers run in the same batch.
    func withHandlerDeadline<T: Sendable>(
        _ deadline: VigilInstant, _ body: () async throws -> T
    ) async throws -> T? {
        state.withLock { $0.handlerExpired = false }
        defer { state.withLock { $0.handlerExpired = false } }
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                do { try await clock.sleep(until: deadline) } catch { return }
                expireHandler()
            }
            defer { group.cancelAll() }
            do {
                return try await body()
            } catch is HandlerDeadlinePassed {
                return nil
            }
        }
    }

    /// Fails the handler's current and future waits (its deadline passed).
    private func expireHandler() {
        var resumes: [() -> Void] = []
        state.withLock { s in
            s.handlerExpired = true
            if let w = s.pongWaiter { s.pongWaiter = nil; resumes.append { w.resume(throwing: HandlerDeadlinePassed()) } }
            if let w = s.writeWaiter { s.writeWaiter = nil; resumes.append { w.resume(throwing: HandlerDeadlinePassed()) } }
        }
        for resume in resumes { resume() }
    }

    /// Stops looking for a pong (the handler overran).
    func abandonPong() {
        state.withLock { s in
            s.awaitingPong = false
            s.pongScan = []
        }
    }

    /// Waits for incoming bytes (not pongs) and takes all that are queued.
    /// Throws when the link ended and nothing is left.
    func nextData() async throws -> [UInt8] {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<[UInt8], any Error>) in
                let now: Result<[UInt8], any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if !s.data.isEmpty {
                        defer { s.data = [] }
                        return .success(s.data)
                    }
                    if let reason = s.endReason { return .failure(LinkError(reason)) }
                    s.dataWaiter = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.dataWaiter = nil }; return s.dataWaiter }
            w?.resume(throwing: CancellationError())
        }
    }

    /// Waits until the connection ends (peer closed, error, reset); returns
    /// why. Cancelling returns "cancelled".
    func awaitEnd() async -> String {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<String, Never>) in
                let now: String? = state.withLock { s in
                    if let reason = s.endReason { return reason }
                    if Task.isCancelled { return "cancelled" }
                    s.endWaiter = c
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.endWaiter = nil }; return s.endWaiter }
            w?.resume(returning: "cancelled")
        }
    }

    /// Closes the socket and fails every waiter. Safe to call more than once.
    func close(reason: String = "closed by the strategy") {
        var resumes: [() -> Void] = []
        state.withLock { s in
            guard s.fd >= 0 else { return }
            loop.unregister(token: s.token, fd: s.fd)
            Glibc.close(s.fd)
            s.fd = -1
            end(&s, reason, resumes: &resumes)
        }
        for resume in resumes { resume() }
    }

    deinit {
        // A link is closed by its owner; this only guards against a leak.
        state.withLock { s in
            if s.fd >= 0 {
                loop.unregister(token: s.token, fd: s.fd)
                Glibc.close(s.fd)
                s.fd = -1
            }
        }
    }
}
