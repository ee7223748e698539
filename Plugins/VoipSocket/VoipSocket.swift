import Synchronization
import VigilKit

/// A configured `voip-socket` instance: one logical connection, kept open for
/// as long as the strategy runs.
public struct VoipSocket: KeepAliveStrategy {
    /// Shared by reference with the running connection: the settings are a
    /// few hundred bytes, and 10,000 connections would otherwise hold a copy
    /// each next to the strategy's.
    let shared: SharedSettings
    var settings: VoipSocketSettings { shared.settings }

    init(settings: VoipSocketSettings) { shared = SharedSettings(settings) }

    public func run(in context: StrategyContext) async throws {
        // This frame lives as long as the strategy: keep it to one reference.
        let connection = try await VoipConnection.start(settings: shared, context: context)
        await connection.run()
        await connection.lease.release()
    }
}

/// A strategy's settings, held by reference.
final class SharedSettings: Sendable {
    let settings: VoipSocketSettings
    init(_ settings: VoipSocketSettings) { self.settings = settings }
}

/// The live figures of one connection, published as its lease's status.
struct ConnectionFigures: Sendable {
    var state = "connecting"
    var remote: String
    var local = ""
    var lastRttMicroseconds: Int64 = -1
    var pings: UInt64 = 0
    var skippedPings: UInt64 = 0
    var latePings: UInt64 = 0
    var reconnects: UInt64 = 0
    var overruns: UInt64 = 0
    var registrations: UInt64 = 0
    var lastError = ""
    var wire = "raw"

    var status: [String: StatusValue] {
        [
            "State": .string(state), "Remote": .string(remote), "Local": .string(local),
            "LastRttUsec": .int(lastRttMicroseconds), "Pings": .uint(pings), "SkippedPings": .uint(skippedPings),
            "LatePings": .uint(latePings),
            "Reconnects": .uint(reconnects), "Overruns": .uint(overruns), "LastError": .string(lastError),
            "Protocol": .string(wire), "Registrations": .uint(registrations),
        ]
    }
}

/// Runs one connection: connect, keep alive, notice death, back off, repeat.
final class VoipConnection: Sendable {
    private let shared: SharedSettings
    var settings: VoipSocketSettings { shared.settings }
    let context: StrategyContext
    let lease: any LeaseHandle
    private let figures: Mutex<ConnectionFigures>

    /// Acquires the connection's lease and makes the connection.
    ///
    /// In a child task: a task keeps the memory of its deepest call stack
    /// until it ends, and the host's lease registry has large frames. Done
    /// here, that memory goes back when the child ends instead of staying
    /// with the strategy's task for the life of the connection.
    @inline(never)
    static func start(settings: SharedSettings, context: StrategyContext) async throws -> VoipConnection {
        try await inChildTask {
            let lease = try await context.leases.acquire(LeaseRequest(
                holds: "tcp connection to \(settings.settings.endpoint)", reason: settings.settings.reason))
            return VoipConnection(settings: settings, context: context, lease: lease)
        }
    }

    init(settings: SharedSettings, context: StrategyContext, lease: any LeaseHandle) {
        self.shared = settings
        self.context = context
        self.lease = lease
        self.figures = Mutex(ConnectionFigures(
            remote: settings.settings.endpoint.description,
            wire: settings.settings.wire.rawValue + (settings.settings.tls != nil ? "+tls" : "")))
    }

    /// Changes the figures and publishes them as the lease's status.
    private func update(_ change: (inout ConnectionFigures) -> Void) async {
        let status = figures.withLock { f -> [String: StatusValue] in
            change(&f)
            return f.status
        }
        await lease.setStatus(status)
    }

    // Memory: an async function's frame holds every local of everything
    // inlined into it, and the frames of `run` and `session` live as long as
    // the connection (10,000 connections: every byte counts 10,000 times).
    // So the steps that run once per connection (connect, hooks, events,
    // backoff) are `@inline(never)` functions whose frames are freed when
    // they return, and `run` keeps only the link and a few counters.

    func run() async {
        var attempt = 0
        await update { _ in }
        while !Task.isCancelled {
            let link: TCPLink
            let plan: SessionPlan
            switch await connectOrBackOff(attempt: &attempt) {
            case .connected(let l, let p): (link, plan) = (l, p)
            case .retry: continue
            case .stop: return
            }
            // Hooks and events run once per connection, in a child task
            // for the reason given at `start`.
            let pingsBefore = await inChildTask { await self.announceConnected(link) }
            let reason = await session(on: link, plan: plan, connectedAt: context.clock.now)
            link.close()
            if Task.isCancelled || reason == Self.cancelled { return }
            guard await announceDisconnected(link, reason: reason, pingsBefore: pingsBefore, attempt: &attempt) else { return }
        }
    }

    private enum ConnectOutcome {
        case connected(TCPLink, SessionPlan)
        /// It failed and the backoff passed.
        case retry
        /// Cancelled.
        case stop
    }

    /// Connects; on failure logs it and backs off.
    @inline(never)
    private func connectOrBackOff(attempt: inout Int) async -> ConnectOutcome {
        do {
            let (link, plan) = try await connect()
            return .connected(link, plan)
        } catch is CancellationError {
            return .stop
        } catch {
            let message = "\(error)"
            // A refusal that will not change by itself (a certificate that
            // does not verify, bad credentials) waits the longest backoff.
            let permanent = (error as? LinkError)?.permanent == true
            context.log.warning("cannot connect to \(settings.endpoint): \(message)\(permanent ? " (not transient: retrying at the longest backoff)" : "")")
            await context.events.record("connect-failed", ["remote": settings.endpoint.description, "error": message])
            guard await backOff(attempt: permanent ? Self.longestBackoff : attempt, after: message) else { return .stop }
            attempt += 1
            return .retry
        }
    }

    /// Status, log, event and `on_connect` for a fresh link; returns the
    /// ping count before the session.
    @inline(never)
    private func announceConnected(_ link: TCPLink) async -> UInt64 {
        let (local, remote) = link.addresses
        await update { f in
            f.state = "up"
            f.local = local
            f.remote = remote
        }
        context.log.info("connected \(local) -> \(remote)")
        await context.events.record("connected", ["local": local, "remote": remote])
        if let onConnect = settings.onConnect {
            let result = await context.hooks.run(
                HookCommand(argv: onConnect, timeout: settings.hookTimeout), event: "connect",
                variables: ["local": local, "remote": remote])
            if !result.exit.succeeded { context.log.warning("on_connect \(result.exit)") }
        }
        return figures.withLock { $0.pings }
    }

    /// Log, event and `on_disconnect` for an ended link, then the backoff;
    /// false when cancelled.
    @inline(never)
    private func announceDisconnected(_ link: TCPLink, reason: String, pingsBefore: UInt64, attempt: inout Int) async -> Bool {
        let (local, remote) = figures.withLock { ($0.local, $0.remote) }
        // A connection that proved itself (something came back, or a ping
        // went out) resets the backoff; one that dies at once does not.
        let proven = link.bytesReceived > 0 || figures.withLock { $0.pings } > pingsBefore
        if proven { attempt = 0 }
        context.log.warning("connection \(local) -> \(remote) ended: \(reason)")
        await context.events.record("disconnected", ["local": local, "remote": remote, "reason": reason])
        if let onDisconnect = settings.onDisconnect {
            let result = await context.hooks.run(
                HookCommand(argv: onDisconnect, timeout: settings.hookTimeout), event: "disconnect",
                variables: ["local": local, "remote": remote, "reason": reason])
            if !result.exit.succeeded { context.log.warning("on_disconnect \(result.exit)") }
        }
        guard await backOff(attempt: attempt, after: reason) else { return false }
        attempt += 1
        return true
    }

    private static let cancelled = "cancelled"
    /// An attempt number whose backoff is the configured maximum.
    private static let longestBackoff = 64

    /// Waits out the backoff delay for `attempt`; false when cancelled.
    @inline(never)
    private func backOff(attempt: Int, after error: String) async -> Bool {
        let delay = settings.reconnect.delay(attempt: attempt)
        await update { f in
            f.state = "backoff"
            f.local = ""
            f.lastError = error
        }
        context.log.info("reconnecting to \(settings.endpoint) in \(delay.vigilDescription) (attempt \(attempt + 1))")
        let at = context.clock.now + delay
        do {
            _ = try await context.scheduler.wake(WakeRequest(earliest: at, latest: at, label: "\(context.name) reconnect"))
        } catch {
            return false
        }
        await update { f in
            f.state = "connecting"
            f.reconnects += 1
            f.remote = settings.endpoint.description
        }
        return true
    }

    /// Resolves the endpoint, connects to its first address that answers
    /// (with TLS, completes the handshake) and opens the protocol's session
    /// (MQTT CONNECT and SUBSCRIBE, SIP REGISTER, raw `send_on_connect`), all
    /// within `connect_timeout`.
    @inline(never)
    private func connect() async throws -> (TCPLink, SessionPlan) {
        let settings = self.settings
        let clock = context.clock
        let deadline = clock.now + settings.connectTimeout
        let opened = try await withDeadline(deadline, clock: clock) { () -> (TCPLink, SessionPlan) in
            let addresses = try await AddressResolver.resolve(settings.endpoint)
            var failures: [String] = []
            var link: TCPLink?
            for address in addresses {
                do {
                    link = try await TCPLink.connect(to: address, options: settings.linkOptions, tls: settings.tls, clock: clock)
                    break
                } catch let error as LinkError {
                    // A certificate that does not verify fails the same on every address.
                    if error.permanent { throw error }
                    failures.append(error.description)
                }
            }
            guard let link else { throw LinkError(failures.joined(separator: "; ")) }
            do {
                return (link, try await self.openSession(on: link))
            } catch {
                link.close()
                throw error
            }
        }
        guard let opened else {
            throw LinkError("connect to \(settings.endpoint) timed out after \(settings.connectTimeout.vigilDescription) (connect_timeout)")
        }
        return opened
    }

    /// The protocol's opening exchange on a fresh link.
    private func openSession(on link: TCPLink) async throws -> SessionPlan {
        switch settings.wire {
        case .raw:
            if !settings.sendOnConnect.isEmpty {
                do {
                    try await link.send(settings.sendOnConnect)
                } catch {
                    throw LinkError("send_on_connect failed: \(error)")
                }
            }
            return SessionPlan(interval: settings.interval)
        case .mqtt:
            try await openMQTT(on: link)
            return SessionPlan(interval: settings.interval)
        case .sip:
            guard let sip = settings.sip, sip.aor != nil else { return SessionPlan(interval: settings.interval) }
            var registration = SIPRegistration(settings: sip, transport: settings.tls != nil ? "tls" : "tcp")
            let (expires, flowTimer) = try await register(&registration, on: link)
            context.log.info("registered \(sip.aor ?? "") for \(expires.vigilDescription)\(flowTimer.map { ", Flow-Timer \($0.vigilDescription)" } ?? "")")
            return SessionPlan(interval: flowTimer ?? settings.interval, registration: registration, registeredFor: expires)
        }
    }

    /// CONNECT, CONNACK, then SUBSCRIBE and SUBACK when topics are configured.
    private func openMQTT(on link: TCPLink) async throws {
        guard let mqtt = settings.mqtt else { return }
        var password = mqtt.password
        if let file = mqtt.passwordFile { password = try readSecret(file).get() }
        let keepAlive = UInt16(clamping: settings.interval.components.seconds)
        try await link.send(MQTTPacket.connect(mqtt, keepAliveSeconds: keepAlive, password: password))
        if let refusal = MQTTPacket.connackRefusal(try await link.nextControl()) {
            throw LinkError(refusal.message, permanent: refusal.permanent)
        }
        guard !mqtt.subscriptions.isEmpty else { return }
        try await link.send(MQTTPacket.subscribe(mqtt.subscriptions, packetID: 1))
        while true {
            let packet = try await link.nextControl()
            guard packet.first == 0x90 else { continue }  // e.g. a stray PUBACK; SUBACK is what is awaited
            if let refusal = MQTTPacket.subackRefusal(packet, topics: mqtt.subscriptions, packetID: 1) {
                throw LinkError(refusal, permanent: true)
            }
            return
        }
    }

    /// One REGISTER transaction (answering one digest challenge); returns
    /// what the registrar granted.
    private func register(_ registration: inout SIPRegistration, on link: TCPLink) async throws -> (Duration, Duration?) {
        var password = registration.settings.password
        if let file = registration.settings.passwordFile { password = try readSecret(file).get() }
        let local = link.addresses.local
        try await link.send(registration.request(local: local, password: password))
        var challenges = 0
        while true {
            let bytes = try await link.nextControl()
            let head = SIPFramer.headerEnd(bytes, from: 0).map { String(decoding: bytes[..<$0], as: UTF8.self) } ?? ""
            let response = SIPMessage(head: head)
            guard registration.answers(response) else { continue }
            switch response.statusCode {
            case 100..<200:
                continue
            case 200..<300:
                await update { $0.registrations += 1 }
                return registration.granted(by: response)
            case 401, 407:
                // One challenge, and one more for a stale nonce; a third means the credentials are wrong.
                guard challenges < 2, registration.take(challengeOf: response, hasPassword: password != nil) else {
                    throw Self.refusal(response, hasPassword: password != nil)
                }
                challenges += 1
                try await link.send(registration.request(local: local, password: password))
            default:
                throw Self.refusal(response, hasPassword: password != nil)
            }
        }
    }

    /// A registrar's final refusal as a LastError.
    private static func refusal(_ response: SIPMessage, hasPassword: Bool) -> LinkError {
        // The reason phrase comes from the server: printable ASCII only, bounded.
        let reason = String(String.UnicodeScalarView(response.reason.unicodeScalars.prefix(120).filter { $0.value >= 0x20 && $0.value < 0x7F }))
        let status = "\(response.statusCode) \(reason)".trimmingSpaces
        let hint: String
        switch response.statusCode {
        case 401, 407: hint = hasPassword ? " (wrong sip.username or password)" : " (the registrar wants credentials: set sip.password or sip.password_file)"
        case 423: hint = " (sip.expires is too short; the registrar's Min-Expires is \(response.header("min-expires") ?? "not given"))"
        default: hint = ""
        }
        // 5xx and 408 may pass; a refusal of who we are will not.
        let transient = response.statusCode >= 500 || response.statusCode == 408
        return LinkError("the registrar refused REGISTER: \(status)\(hint)", permanent: !transient)
    }

    /// Renews the registration before it expires, on this flow, for as long
    /// as the session lasts; returns why it stopped.
    private func renewRegistration(_ plan: SessionPlan, on link: TCPLink) async -> String {
        guard var registration = plan.registration else { return await link.awaitEnd() }
        var expires = plan.registeredFor
        while true {
            let at = context.clock.now + renewalDelay(for: expires)
            do {
                _ = try await context.scheduler.wake(WakeRequest(earliest: at, latest: at, label: "\(context.name) register"))
            } catch {
                return Self.cancelled
            }
            do {
                var current = registration
                let granted = try await withDeadline(context.clock.now + settings.connectTimeout, clock: context.clock) { [current] in
                    var r = current
                    let g = try await self.register(&r, on: link)
                    return (r, g.0)
                }
                guard let granted else { return "registration renewal got no answer within connect_timeout (\(settings.connectTimeout.vigilDescription))" }
                (current, expires) = granted
                registration = current
                context.log.info("renewed the registration for \(expires.vigilDescription)")
            } catch is CancellationError {
                return Self.cancelled
            } catch {
                return "registration renewal failed: \(error)"
            }
        }
    }

    /// Keeps `link` alive until it dies; returns why it ended.
    @inline(never)
    private func session(on link: TCPLink, plan: SessionPlan, connectedAt: VigilInstant) async -> String {
        if settings.onData != nil || plan.registration != nil {
            return await withTaskGroup(of: String.self) { group in
                // The data loop ends when the link ended and every byte went
                // to the hook; it stands in for awaitEnd so the last data
                // before a close still reaches on_data.
                group.addTask { await self.deliverData(from: link) }
                group.addTask { await self.keepAlive(link, interval: plan.interval, since: connectedAt) }
                if plan.registration != nil { group.addTask { await self.renewRegistration(plan, on: link) } }
                let first = await group.next() ?? Self.cancelled
                group.cancelAll()
                return first
            }
        }
        let interval = plan.interval
        // Without on_data this task waits for the end itself and the
        // keep-alive loop is the only child: one task fewer per connection
        // (each costs about a kilobyte for as long as the connection lives).
        // The loop closes the link when it gives up, which ends the wait.
        return await withTaskGroup(of: String.self) { group in
            group.addTask {
                let reason = await self.keepAlive(link, interval: interval, since: connectedAt)
                if reason != Self.cancelled { link.close(reason: reason) }
                return reason
            }
            let ended = await link.awaitEnd()
            group.cancelAll()
            let gaveUp = await group.next() ?? Self.cancelled
            return gaveUp != Self.cancelled ? gaveUp : ended
        }
    }

    /// The keep-alive loop: at each deadline, skip (traffic proved the link
    /// alive) or run the ping handler within `handler_timeout`.
    @inline(never)
    private func keepAlive(_ link: TCPLink, interval: Duration, since connectedAt: VigilInstant) async -> String {
        let clock = context.clock
        var base = connectedAt
        // MQTT's keep-alive counts only what the client sends (the broker
        // drops a client that sent nothing for 1.5 × keep-alive, whatever
        // the broker itself sent); raw and SIP count what comes back.
        let clientTraffic = settings.wire == .mqtt
        // Formatted once per connection, not once per ping.
        let label = "\(context.name) keep-alive"
        while true {
            let (earliest, latest) = window(after: base, interval: interval)
            do {
                _ = try await context.scheduler.wake(WakeRequest(
                    earliest: earliest, latest: latest, align: settings.align, label: label))
            } catch {
                return Self.cancelled
            }
            if settings.skipPingOnTraffic, let traffic = clientTraffic ? link.lastSent : link.lastReceived, traffic > base {
                base = traffic
                await update { $0.skippedPings += 1 }
                continue
            }
            let started = clock.now
            // The wake came after the window's end (base + interval; `latest`
            // is only this round's random target inside the window): the
            // machine or the process was busy or frozen, and the ping is late.
            if started > base + interval { await update { $0.latePings += 1 } }
            let deadline = started + settings.handlerTimeout
            let ping = settings.ping
            let expectsPong = !settings.expect.isEmpty
            if expectsPong { link.expectPong() }
            let finished: VigilInstant?
            do {
                finished = try await link.withHandlerDeadline(deadline) {
                    try await link.send(ping, isPing: true)
                    return expectsPong ? try await link.awaitPong() : clock.now
                }
            } catch is CancellationError {
                return Self.cancelled
            } catch {
                return "ping failed: \(error)"
            }
            guard let finished else {
                link.abandonPong()
                let late = clock.now - deadline
                await update { $0.overruns += 1 }
                let what = expectsPong ? "no pong" : "the ping could not be sent"
                let reason = "ping handler overran handler_timeout (\(settings.handlerTimeout.vigilDescription)): \(what)"
                context.log.warning("\(reason); closing the connection")
                await context.events.record("handler-overrun", [
                    "remote": settings.endpoint.description, "late_ms": String(late.nanoseconds / 1_000_000)])
                return reason
            }
            let rtt = finished - started
            await update { f in
                f.pings += 1
                if expectsPong { f.lastRttMicroseconds = rtt.microseconds }
            }
            base = clientTraffic ? started : max(started, link.lastReceived ?? started)
        }
    }

    /// The window of the next keep-alive deadline after `base`: RFC 5626's
    /// random 80–100 % of the interval (for `jitter` 0.2). The scheduler may
    /// fire anywhere in [earliest, latest] to coalesce with other wakes; with
    /// `align`, it prefers a slot boundary, so the window stays whole.
    private func window(after base: VigilInstant, interval: Duration) -> (VigilInstant, VigilInstant) {
        let earliest = base + .nanoseconds(Int64(Double(interval.nanoseconds) * (1 - settings.jitter)))
        let end = base + interval
        guard earliest < end else { return (earliest, end) }
        // Aim a little before the window's end: a batch of thousands of
        // sockets (coalesced or aligned wakes) takes a few hundred ms to go
        // through, and the last of them must still ping inside the window.
        let target = end - min((end - earliest) / 4, .seconds(1))
        if settings.align != nil { return (earliest, target) }
        let pick = Int64.random(in: earliest.nanoseconds...target.nanoseconds)
        return (earliest, VigilInstant(nanoseconds: pick))
    }

    /// Hands incoming bytes to `on_data`, one hook run at a time (bytes that
    /// arrive meanwhile go to the next run). Returns when the link ended and
    /// nothing is left.
    private func deliverData(from link: TCPLink) async -> String {
        guard let onData = settings.onData else { return await link.awaitEnd() }
        var runs = 0
        while true {
            let frame: DataFrame
            do {
                frame = try await link.nextData()
            } catch is CancellationError {
                return Self.cancelled
            } catch {
                return "\(error)"
            }
            runs += 1
            let bytes = frame.bytes
            var variables = ["remote": settings.endpoint.description, "bytes": String(bytes.count), "sequence": String(runs)]
            variables.merge(frame.variables) { old, _ in old }
            let result = await context.hooks.run(
                HookCommand(argv: onData, timeout: settings.onDataTimeout, stdin: bytes), event: "data", variables: variables)
            if Task.isCancelled { return Self.cancelled }
            if !result.exit.succeeded { context.log.warning("on_data \(result.exit)") }
            await context.events.record("data", ["bytes": String(bytes.count), "exit": result.exit.description])
        }
    }
}

/// What a session runs with, from the protocol's opening exchange.
///
/// A class: it travels through `connect`'s deadline race and the frames of
/// `run` and `session`, which the strategy's task keeps for the life of the
/// connection; a reference keeps them one word wide instead of a few
/// hundred bytes of SIP registration state each.
final class SessionPlan: Sendable {
    /// The keep-alive interval (SIP: the registrar's Flow-Timer if it sent one).
    let interval: Duration
    /// SIP: the registration to renew on this flow.
    let registration: SIPRegistration?
    let registeredFor: Duration

    init(interval: Duration, registration: SIPRegistration? = nil, registeredFor: Duration = .zero) {
        self.interval = interval
        self.registration = registration
        self.registeredFor = registeredFor
    }
}

/// Runs `body` in a child task and returns its result: the memory of its
/// call stack is freed when it ends, while the calling task would keep it
/// for as long as it lives.
func inChildTask<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        guard let value = try await group.next() else { throw CancellationError() }  // one task was added
        return value
    }
}

/// ``inChildTask(_:)`` for a body that cannot throw.
func inChildTask<T: Sendable>(_ body: @escaping @Sendable () async -> T) async -> T {
    await withTaskGroup(of: T.self) { group in
        group.addTask { await body() }
        // One task was added, so `next()` has a value; the fallback runs the
        // body here should that ever not hold.
        if let value = await group.next() { return value }
        return await body()
    }
}

/// Runs `body` until it finishes or `deadline` passes on `clock`, whichever
/// comes first; nil when the deadline won (`body` is then cancelled and
/// awaited, so it must honour cancellation).
func withDeadline<T: Sendable>(
    _ deadline: VigilInstant, clock: any VigilClock, _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
    try await withThrowingTaskGroup(of: Outcome<T>.self) { group in
        group.addTask { .finished(try await body()) }
        group.addTask {
            try await clock.sleep(until: deadline)
            return .deadlinePassed
        }
        defer { group.cancelAll() }
        switch try await group.next() {
        case .finished(let value)?: return value
        case .deadlinePassed?, nil: return nil
        }
    }
}

private enum Outcome<T: Sendable>: Sendable {
    case finished(T)
    case deadlinePassed
}
