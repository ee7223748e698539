import CVoipSocket
import CVoipTLS
import Glibc
import VigilKit

/// Why a link stopped or an operation on it failed, in words for people.
struct LinkError: Error, CustomStringConvertible, Equatable {
    var description: String
    /// Trying again at once will not help (a certificate that does not
    /// verify, credentials the server refused): the strategy waits the
    /// longest backoff before the next attempt.
    var permanent = false
    init(_ description: String, permanent: Bool = false) {
        self.description = description
        self.permanent = permanent
    }
}

/// Socket options applied before connecting.
struct LinkOptions: Sendable, Hashable {
    /// TCP_KEEPIDLE, TCP_KEEPINTVL (whole seconds) and TCP_KEEPCNT; nil: off.
    var keepalive: (idle: Int32, interval: Int32, count: Int32)?
    /// TCP_USER_TIMEOUT in milliseconds; 0 leaves the kernel default.
    var userTimeoutMilliseconds: UInt32
    /// How incoming bytes are framed, and what the pong is.
    var framing: FramingOptions
    /// Keep incoming bytes for `nextData()` (an `on_data` hook is configured).
    var collectsData: Bool

    static func == (a: Self, b: Self) -> Bool {
        a.keepalive?.idle == b.keepalive?.idle && a.keepalive?.interval == b.keepalive?.interval
            && a.keepalive?.count == b.keepalive?.count && a.userTimeoutMilliseconds == b.userTimeoutMilliseconds
            && a.framing == b.framing && a.collectsData == b.collectsData
    }

    func hash(into h: inout Hasher) {
        h.combine(keepalive?.idle); h.combine(keepalive?.interval); h.combine(keepalive?.count)
        h.combine(userTimeoutMilliseconds); h.combine(framing); h.combine(collectsData)
    }
}

/// Who waits for a pong: a keep-alive round (its keeper and handler
/// generation). A value, not a closure: a closure's context is an
/// allocation, once per ping of every connection.
struct PongWaiter: Sendable {
    let keeper: PingKeeper
    let handler: UInt64

    func settle(_ result: Result<VigilInstant, any Error>) { keeper.settle(result, handler: handler) }
}

/// What to resume once a link's lock is released, in order, the pong's
/// waiter first. The pong's waiter is kept apart: a pong comes once per ping
/// of every connection, and this way costs no closure and no array.
struct Resumes {
    private var pongWaiter: PongWaiter?
    private var pongAt = VigilInstant(nanoseconds: 0)
    private var others: [() -> Void] = []

    mutating func append(_ resume: @escaping () -> Void) { others.append(resume) }

    /// The pong arrived at `at`: `waiter` hears it first.
    mutating func pong(_ waiter: PongWaiter, at: VigilInstant) {
        pongWaiter = waiter
        pongAt = at
    }

    func run() {
        pongWaiter?.settle(.success(pongAt))
        for resume in others { resume() }
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
    private enum Phase { case connecting, handshaking, open, ended }

    private struct State {
        var fd: Int32
        var token: UInt64 = 0
        var phase = Phase.connecting
        /// The TLS session, with `tls = true`.
        var tls: TLSSession?
        /// Set once the connection (and its TLS handshake) succeeded or failed.
        var connectResult: Result<Void, LinkError>?
        var connectWaiter: CheckedContinuation<Void, any Error>?
        var outEdges: UInt64 = 0
        var writeWaiter: CheckedContinuation<Void, any Error>?
        var endReason: String?
        var endWaiter: CheckedContinuation<String, Never>?
        var lastReceived: VigilInstant?
        var bytesReceived: UInt64 = 0
        /// When the strategy last sent something other than a ping.
        var lastSent: VigilInstant?
        var framer: Framer
        var awaitingPong = false
        var pongAt: VigilInstant?
        /// The keep-alive round waiting for the pong (``PingKeeper``),
        /// settled on the thread that learns the outcome.
        var pongWaiter: PongWaiter?
        var control: [[UInt8]] = []
        var controlWaiter: CheckedContinuation<[UInt8], any Error>?
        var data: [DataFrame] = []
        var dataBytes = 0
        var droppedData = 0
        var dataWaiter: CheckedContinuation<DataFrame, any Error>?
        /// The running ping handler's deadline passed: its waits fail.
        var handlerExpired = false
        /// Counts handler starts and ends: a deadline of a handler that
        /// already ended finds a newer number and does nothing.
        var handlerGeneration: UInt64 = 0
    }

    /// The ping handler's deadline passed while it waited on this link.
    struct HandlerDeadlinePassed: Error {}

    /// Most bytes kept for the `on_data` hook while it runs; beyond that the
    /// oldest are dropped (and counted).
    static let dataCap = 1 << 20

    let clock: any VigilClock
    /// Which clock, for ``HandlerDeadlines``: worked out once, since telling
    /// clocks apart takes a dynamic cast, too dear for every ping.
    let clockIdentity: ObjectIdentifier
    let options: LinkOptions
    private let loop: SocketEventLoop
    private let state: Lock<State>

    /// Where the bytes the link moves are counted (its strategy's
    /// BytesSent and BytesReceived): as they pass, with no timer.
    private let cost: any CostRecording

    private init(fd: Int32, tls: TLSSession?, clock: any VigilClock, options: LinkOptions, loop: SocketEventLoop, cost: any CostRecording) {
        self.cost = cost
        self.clock = clock
        self.clockIdentity = instanceIdentity(of: clock)
        self.options = options
        self.loop = loop
        self.state = Lock(State(fd: fd, tls: tls, framer: options.framing.makeFramer()))
    }

    /// Opens a socket to `address` with `options` and waits until it is
    /// connected. Cancelling the caller (a connect timeout) closes the socket.
    /// With `tls`, the TLS handshake is part of connecting.
    static func connect(
        to address: SocketAddress, options: LinkOptions, tls: TLSSettings? = nil, clock: any VigilClock, loop: SocketEventLoop = .shared,
        cost: any CostRecording = UncountedCost()
    ) async throws -> TCPLink {
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
        var session: TLSSession?
        if let tls {
            switch TLSSession.make(tls, fd: fd) {
            case .success(let made): session = made
            case .failure(let error): Glibc.close(fd); throw error
            }
        }
        let link = TCPLink(fd: fd, tls: session, clock: clock, options: options, loop: loop, cost: cost)
        do {
            let token = try loop.register(link, fd: fd)
            link.state.withLock { $0.token = token }
        } catch {
            link.close()
            throw error
        }
        if rc == 0 {
            var resumes = Resumes()
            link.state.withLock { s in if s.phase == .connecting { link.connected(&s, resumes: &resumes) } }
            resumes.run()
        }
        do {
            try await link.awaitConnected()
        } catch is CancellationError {
            link.close()
            throw CancellationError()
        } catch let error as LinkError {
            link.close()
            throw LinkError("connect to \(address) failed: \(error)", permanent: error.permanent)
        } catch {
            link.close()
            throw LinkError("connect to \(address) failed: \(error)")
        }
        return link
    }

    // MARK: - Event thread

    /// Called by the event thread with the readiness bits of this socket.
    func handle(events: UInt32, buffer: UnsafeMutableRawBufferPointer) {
        var resumes = Resumes()
        state.withLock { s in
            guard s.fd >= 0 else { return }
            if s.phase == .connecting {
                guard events & (vigil_EV_OUT | vigil_EV_ERR | vigil_EV_HUP) != 0 else { return }
                let error = vigil_socket_error(s.fd)
                if error != 0 {
                    finishConnect(&s, .failure(LinkError(String(cString: strerror(error)))), resumes: &resumes)
                    return
                }
                connected(&s, resumes: &resumes)
            } else if s.phase == .handshaking {
                stepHandshake(&s, resumes: &resumes)
            }
            guard s.phase == .open else { return }
            // TLS: a write may wait for input (and a read for output), so
            // any event may let a waiting sender go on.
            if events & vigil_EV_OUT != 0 || s.tls != nil {
                s.outEdges &+= 1
                if let w = s.writeWaiter {
                    s.writeWaiter = nil
                    resumes.append { w.resume() }
                }
            }
            if events & (vigil_EV_IN | vigil_EV_RDHUP | vigil_EV_HUP | vigil_EV_ERR) != 0 || s.tls != nil {
                drain(&s, buffer: buffer, hangup: events & (vigil_EV_RDHUP | vigil_EV_HUP | vigil_EV_ERR) != 0, resumes: &resumes)
            }
        }
        resumes.run()
    }

    /// The TCP connection is up: open, or on to the TLS handshake.
    private func connected(_ s: inout State, resumes: inout Resumes) {
        if s.tls == nil {
            s.phase = .open
            finishConnect(&s, .success(()), resumes: &resumes)
        } else {
            s.phase = .handshaking
            stepHandshake(&s, resumes: &resumes)
        }
    }

    /// Drives the non-blocking TLS handshake as far as the socket allows.
    private func stepHandshake(_ s: inout State, resumes: inout Resumes) {
        guard let tls = s.tls else { return }
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 512) { error in
            error[0] = 0
            let rc = vigil_tls_handshake(tls.pointer, error.baseAddress, 512)
            switch rc {
            case vigil_TLS_OK:
                s.phase = .open
                finishConnect(&s, .success(()), resumes: &resumes)
            case vigil_TLS_WANT_READ, vigil_TLS_WANT_WRITE:
                return
            default:
                let message = String(cString: error.baseAddress!)  // a capacity-512 allocation, NUL-terminated by the shim
                finishConnect(&s, .failure(LinkError(message, permanent: rc == vigil_TLS_VERIFY_FAILED)), resumes: &resumes)
            }
        }
    }

    private func finishConnect(_ s: inout State, _ result: Result<Void, LinkError>, resumes: inout Resumes) {
        s.connectResult = result
        if case .failure = result { s.phase = .ended }
        if let w = s.connectWaiter {
            s.connectWaiter = nil
            resumes.append { w.resume(with: result.mapError { $0 as any Error }) }
        }
    }

    /// Reads until the socket has nothing more (edge-triggered epoll).
    /// `hangup`: the event said the peer closed or the socket failed, which
    /// raises no new edge: read until the end is seen.
    private func drain(_ s: inout State, buffer: UnsafeMutableRawBufferPointer, hangup: Bool, resumes: inout Resumes) {
        if let tls = s.tls {
            drainTLS(&s, tls, buffer: buffer, resumes: &resumes)
            return
        }
        while true {
            let n = vigil_recv(s.fd, buffer.baseAddress, UInt(buffer.count))
            if n > 0 {
                deliver(&s, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), resumes: &resumes)
                // A short read emptied the socket: bytes, a close or an
                // error arriving after it raise a new edge, so another recv
                // only to hear EAGAIN is not needed (one syscall of the
                // three a pong took). A close already reported is read now.
                if (n < buffer.count && !hangup) || s.phase != .open { return }
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

    private func drainTLS(_ s: inout State, _ tls: TLSSession, buffer: UnsafeMutableRawBufferPointer, resumes: inout Resumes) {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 512) { error in
            while s.phase == .open {
                var status: Int32 = 0
                error[0] = 0
                let n = vigil_tls_read(tls.pointer, buffer.baseAddress, UInt(buffer.count), &status, error.baseAddress, 512)
                if n > 0 {
                    deliver(&s, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), resumes: &resumes)
                    continue
                }
                if status == vigil_TLS_WANT_READ || status == vigil_TLS_WANT_WRITE { return }
                end(&s, String(cString: error.baseAddress!), resumes: &resumes)  // NUL-terminated by the shim
                return
            }
        }
    }

    private func deliver(_ s: inout State, _ bytes: UnsafeRawBufferPointer, resumes: inout Resumes) {
        let now = clock.now
        s.lastReceived = now
        s.bytesReceived &+= UInt64(bytes.count)
        cost.networkBytes(sent: 0, received: UInt64(bytes.count))
        if s.awaitingPong, s.framer.takeWholePong(bytes) {
            s.awaitingPong = false
            pongArrived(&s, at: now, resumes: &resumes)
            return
        }
        var frames: [Frame] = []
        do {
            try s.framer.feed(bytes, awaitingPong: &s.awaitingPong, into: &frames)
        } catch {
            end(&s, error.description, resumes: &resumes)
            return
        }
        for frame in frames {
            switch frame {
            case .pong:
                pongArrived(&s, at: now, resumes: &resumes)
            case .control(let message):
                if let w = s.controlWaiter {
                    s.controlWaiter = nil
                    resumes.append { w.resume(returning: message) }
                } else if s.control.count < 64 {
                    s.control.append(message)
                }
            case .data(let frame):
                guard options.collectsData else { continue }
                if frame.mergeable, let last = s.data.last, last.mergeable {
                    s.data[s.data.count - 1].bytes += frame.bytes
                } else {
                    s.data.append(frame)
                }
                s.dataBytes += frame.bytes.count
                // The hook fell behind: drop the oldest whole frames (the
                // newest is kept even if it alone is over the cap).
                while s.dataBytes > Self.dataCap, s.data.count > 1 {
                    let dropped = s.data.removeFirst()
                    s.dataBytes -= dropped.bytes.count
                    s.droppedData += dropped.bytes.count
                }
            }
        }
        if let w = s.dataWaiter, !s.data.isEmpty {
            s.dataWaiter = nil
            let frame = s.data.removeFirst()
            s.dataBytes -= frame.bytes.count
            resumes.append { w.resume(returning: frame) }
        }
    }

    private func pongArrived(_ s: inout State, at now: VigilInstant, resumes: inout Resumes) {
        s.pongAt = now
        if let w = s.pongWaiter {
            s.pongWaiter = nil
            resumes.pong(w, at: now)
        }
    }

    /// Marks the link ended and fails every waiter (the fd stays until `close`).
    private func end(_ s: inout State, _ reason: String, resumes: inout Resumes) {
        if s.endReason == nil { s.endReason = reason }
        s.phase = .ended
        let error = LinkError(s.endReason ?? reason)
        // The pong waiter first: a keep-alive round notes why it failed
        // before the session waiting for the end goes on.
        if let w = s.pongWaiter { s.pongWaiter = nil; resumes.append { w.settle(.failure(error)) } }
        if let w = s.endWaiter { s.endWaiter = nil; let r = s.endReason ?? reason; resumes.append { w.resume(returning: r) } }
        if let w = s.writeWaiter { s.writeWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.connectWaiter { s.connectWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.controlWaiter { s.controlWaiter = nil; resumes.append { w.resume(throwing: error) } }
        if let w = s.dataWaiter {
            s.dataWaiter = nil
            if s.data.isEmpty {
                resumes.append { w.resume(throwing: error) }
            } else {
                let frame = s.data.removeFirst()
                s.dataBytes -= frame.bytes.count
                resumes.append { w.resume(returning: frame) }
            }
        }
    }

    // MARK: - Callers

    private func awaitConnected() async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                let now: Result<Void, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if let result = s.connectResult { return result.mapError { $0 as any Error } }
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

    /// When the strategy last sent something other than a ping, if ever.
    var lastSent: VigilInstant? { state.withLock { $0.lastSent } }

    /// Sends all of `bytes`, waiting for room when the socket buffer is full.
    /// `isPing`: a keep-alive ping, which does not count as client traffic.
    func send(_ bytes: [UInt8], isPing: Bool = false) async throws {
        defer { if !isPing { let now = clock.now; state.withLock { $0.lastSent = now } } }
        var offset = 0
        while true {
            let edges: UInt64
            switch try sendSome(bytes, from: offset) {
            case .sent: return
            case .wouldBlock(let sent, let e): (offset, edges) = (sent, e)
            }
            try await awaitWritable(after: edges)
        }
    }

    /// How far a send without waiting got.
    enum SendProgress {
        case sent
        /// The socket buffer is full: this much went out; wait for an edge past `edges`.
        case wouldBlock(sent: Int, edges: UInt64)
    }

    /// Sends what the socket takes now of `bytes` from `offset`, without
    /// waiting (the keep-alive round sends its ping from the wake, with no
    /// task of its own; it waits in a task only when this would block).
    func sendSome(_ bytes: [UInt8], from start: Int) throws -> SendProgress {
        var offset = start
        var pendingResumes = Resumes()
        defer { pendingResumes.run() }
        while offset < bytes.count {
            let (count, error, edges): (Int, Int32, UInt64) = try state.withLock { s in
                if let reason = s.endReason { throw LinkError(reason) }
                guard s.fd >= 0 else { throw LinkError("the connection is closed") }
                if let tls = s.tls { return try sendTLS(&s, tls, bytes, offset, &pendingResumes) }
                let n = bytes.withUnsafeBytes { raw in vigil_send(s.fd, raw.baseAddress! + offset, UInt(raw.count - offset)) }  // non-empty: offset < count
                let error = n < 0 ? errno : 0
                if n < 0, error != EAGAIN, error != EWOULDBLOCK {
                    // This took the socket's error: record it as the end, or
                    // the event thread would only see ENOTCONN.
                    var resumes = Resumes()
                    end(&s, "connection lost: \(String(cString: strerror(error)))", resumes: &resumes)
                    pendingResumes = resumes
                }
                return (n, error, s.outEdges)
            }
            if count > 0 {
                cost.networkBytes(sent: UInt64(count), received: 0)
                offset += count
                continue
            }
            if error == EAGAIN || error == EWOULDBLOCK { return .wouldBlock(sent: offset, edges: edges) }
            throw LinkError("send failed: \(String(cString: strerror(error)))")
        }
        return .sent
    }

    /// One SSL_write; (count, EAGAIN when it must wait for an event, edges).
    private func sendTLS(_ s: inout State, _ tls: TLSSession, _ bytes: [UInt8], _ offset: Int, _ pending: inout Resumes) throws -> (Int, Int32, UInt64) {
        try withUnsafeTemporaryAllocation(of: CChar.self, capacity: 512) { error in
            var status: Int32 = 0
            error[0] = 0
            let n = bytes.withUnsafeBytes { raw in
                vigil_tls_write(tls.pointer, raw.baseAddress! + offset, UInt(raw.count - offset), &status, error.baseAddress, 512)  // non-empty: offset < count
            }
            if n > 0 { return (n, 0, s.outEdges) }
            if status == vigil_TLS_WANT_READ || status == vigil_TLS_WANT_WRITE { return (0, EAGAIN, s.outEdges) }
            let reason = String(cString: error.baseAddress!)  // NUL-terminated by the shim
            end(&s, reason, resumes: &pending)
            throw LinkError(reason)
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
            s.framer.pingSent()
            s.pongAt = nil
        }
    }

    /// Settles `waiter` once with the pong `expectPong` started looking for
    /// (when it arrived), or the failure: the link ended, or the handler's
    /// deadline passed. Called at once when that is already known, else on
    /// the thread that learns it (the event thread for a pong).
    func onPong(_ waiter: PongWaiter) {
        let now: Result<VigilInstant, any Error>? = state.withLock { s in
            if let at = s.pongAt { return .success(at) }
            if let reason = s.endReason { return .failure(LinkError(reason)) }
            if s.handlerExpired { return .failure(HandlerDeadlinePassed()) }
            s.pongWaiter = waiter
            return nil
        }
        if let now { waiter.settle(now) }
    }

    /// Starts a ping handler that waits on this link only (``sendSome``,
    /// ``onPong``) and must end by `deadline` on the link's clock; returns its
    /// generation for ``endHandler(generation:)``.
    ///
    /// The deadline goes to ``HandlerDeadlines``, which fails the handler's
    /// waits on this link when it passes. No task and no timer per handler:
    /// 10,000 handlers in one batch share one wake-up.
    func beginHandler(deadline: VigilInstant) -> UInt64 {
        let generation = state.withLock { s in
            s.handlerExpired = false
            s.handlerGeneration &+= 1
            return s.handlerGeneration
        }
        HandlerDeadlines.shared.add(deadline, clock: clock, identity: clockIdentity, link: self, generation: generation)
        return generation
    }

    /// Ends handler `generation`: its deadline no longer applies.
    func endHandler(generation: UInt64) {
        state.withLock { s in
            guard s.handlerGeneration == generation else { return }
            s.handlerExpired = false
            s.handlerGeneration &+= 1
        }
    }

    /// Whether handler `generation` still runs (its deadline still matters).
    func runsHandler(generation: UInt64) -> Bool {
        state.withLock { $0.handlerGeneration == generation }
    }

    /// Fails the current and future waits of handler `generation` (its
    /// deadline passed), if it still runs.
    func expireHandler(generation: UInt64) {
        var resumes = Resumes()
        state.withLock { s in
            guard s.handlerGeneration == generation else { return }
            s.handlerExpired = true
            if let w = s.pongWaiter { s.pongWaiter = nil; resumes.append { w.settle(.failure(HandlerDeadlinePassed())) } }
            if let w = s.writeWaiter { s.writeWaiter = nil; resumes.append { w.resume(throwing: HandlerDeadlinePassed()) } }
        }
        resumes.run()
    }

    /// Stops looking for a pong (the handler overran).
    func abandonPong() {
        state.withLock { s in s.awaitingPong = false }
    }

    /// Waits for the next unit of incoming data (not pongs, not control
    /// messages): a protocol message, or the raw bytes queued so far.
    /// Throws when the link ended and nothing is left.
    func nextData() async throws -> DataFrame {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<DataFrame, any Error>) in
                let now: Result<DataFrame, any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if !s.data.isEmpty {
                        let frame = s.data.removeFirst()
                        s.dataBytes -= frame.bytes.count
                        return .success(frame)
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

    /// Waits for the next control message (CONNACK, SUBACK, a SIP response).
    /// Throws when the link ended.
    func nextControl() async throws -> [UInt8] {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<[UInt8], any Error>) in
                let now: Result<[UInt8], any Error>? = state.withLock { s in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if !s.control.isEmpty { return .success(s.control.removeFirst()) }
                    if let reason = s.endReason { return .failure(LinkError(reason)) }
                    s.controlWaiter = c
                    return nil
                }
                if let now { c.resume(with: now) }
            }
        } onCancel: {
            let w = state.withLock { s in defer { s.controlWaiter = nil }; return s.controlWaiter }
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

    /// The connection ended (the peer closed it, an error, or `close`).
    var hasEnded: Bool { state.withLock { $0.endReason != nil } }

    /// Closes the socket and fails every waiter. Safe to call more than once.
    func close(reason: String = "closed by the strategy") {
        var resumes = Resumes()
        state.withLock { s in
            guard s.fd >= 0 else { return }
            loop.unregister(token: s.token, fd: s.fd)
            s.tls?.free()
            s.tls = nil
            Glibc.close(s.fd)
            s.fd = -1
            end(&s, reason, resumes: &resumes)
        }
        resumes.run()
    }

    deinit {
        // A link is closed by its owner; this only guards against a leak.
        state.withLock { s in
            if s.fd >= 0 {
                loop.unregister(token: s.token, fd: s.fd)
                s.tls?.free()
                s.tls = nil
                Glibc.close(s.fd)
                s.fd = -1
            }
        }
    }
}
