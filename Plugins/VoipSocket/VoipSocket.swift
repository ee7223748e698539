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
    var state = "connecting" { didSet { changed.insert(.state) } }
    var remote: String { didSet { changed.insert(.remote) } }
    var local = "" { didSet { changed.insert(.local) } }
    var lastRttMicroseconds: Int64 = -1 { didSet { changed.insert(.lastRtt) } }
    var pings: UInt64 = 0 { didSet { changed.insert(.pings) } }
    var skippedPings: UInt64 = 0 { didSet { changed.insert(.skippedPings) } }
    var latePings: UInt64 = 0 { didSet { changed.insert(.latePings) } }
    var reconnects: UInt64 = 0 { didSet { changed.insert(.reconnects) } }
    var overruns: UInt64 = 0 { didSet { changed.insert(.overruns) } }
    var registrations: UInt64 = 0 { didSet { changed.insert(.registrations) } }
    var lastError = "" { didSet { changed.insert(.lastError) } }
    var wire = "raw"
    /// Waiting in ``StatusPublisher``'s queue (not shown).
    var queued = false

    /// The figures changed since `published` was last brought up to date.
    private struct Fields: OptionSet {
        let rawValue: UInt16
        static let state = Self(rawValue: 1 << 0), remote = Self(rawValue: 1 << 1), local = Self(rawValue: 1 << 2)
        static let lastRtt = Self(rawValue: 1 << 3), pings = Self(rawValue: 1 << 4), skippedPings = Self(rawValue: 1 << 5)
        static let latePings = Self(rawValue: 1 << 6), reconnects = Self(rawValue: 1 << 7), overruns = Self(rawValue: 1 << 8)
        static let registrations = Self(rawValue: 1 << 9), lastError = Self(rawValue: 1 << 10)
    }
    private var changed: Fields = []
    /// The status last handed out. Its storage is shared with the host's
    /// copy, so it costs no memory of its own; the next status is this one
    /// with the changed keys set (a ping changes two), not a new dictionary
    /// of twelve hashed keys, which was the largest cost of a ping's status.
    private var published: [String: StatusValue] = [:]

    init(remote: String, wire: String) {
        self.remote = remote
        self.wire = wire
    }

    /// The status now.
    mutating func status() -> [String: StatusValue] {
        if published.isEmpty {
            published = [
                "State": .string(state), "Remote": .string(remote), "Local": .string(local),
                "LastRttUsec": .int(lastRttMicroseconds), "Pings": .uint(pings), "SkippedPings": .uint(skippedPings),
                "LatePings": .uint(latePings),
                "Reconnects": .uint(reconnects), "Overruns": .uint(overruns), "LastError": .string(lastError),
                "Protocol": .string(wire), "Registrations": .uint(registrations),
            ]
        } else if !changed.isEmpty {
            if changed.contains(.state) { published["State"] = .string(state) }
            if changed.contains(.remote) { published["Remote"] = .string(remote) }
            if changed.contains(.local) { published["Local"] = .string(local) }
            if changed.contains(.lastRtt) { published["LastRttUsec"] = .int(lastRttMicroseconds) }
            if changed.contains(.pings) { published["Pings"] = .uint(pings) }
            if changed.contains(.skippedPings) { published["SkippedPings"] = .uint(skippedPings) }
            if changed.contains(.latePings) { published["LatePings"] = .uint(latePings) }
            if changed.contains(.reconnects) { published["Reconnects"] = .uint(reconnects) }
            if changed.contains(.overruns) { published["Overruns"] = .uint(overruns) }
            if changed.contains(.registrations) { published["Registrations"] = .uint(registrations) }
            if changed.contains(.lastError) { published["LastError"] = .string(lastError) }
        }
        changed = []
        return published
    }
}

/// Runs one connection: connect, keep alive, notice death, back off, repeat.
final class VoipConnection: Sendable {
    private let shared: SharedSettings
    var settings: VoipSocketSettings { shared.settings }
    let context: StrategyContext
    let lease: any LeaseHandle
    /// Where the status goes in a batch with other connections' (the host's
    /// registry), if the lease handle allows it.
    let statusSink: (any LeaseStatusSink)?
    private let figures: Lock<ConnectionFigures>

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
        self.statusSink = (lease as? any BatchableLeaseHandle)?.statusSink
        self.figures = Lock(ConnectionFigures(
            remote: settings.settings.endpoint.description,
            wire: settings.settings.wire.rawValue + (settings.settings.tls != nil ? "+tls" : "")))
    }

    /// Changes the figures and has ``StatusPublisher`` publish them as the
    /// lease's status (soon, and once for many changes in a row).
    func update(_ change: (inout ConnectionFigures) -> Void) {
        let enqueue = figures.withLock { f -> Bool in
            change(&f)
            defer { f.queued = true }
            return !f.queued
        }
        if enqueue { StatusPublisher.shared.enqueue(self) }
    }

    /// The current figures as a status, to publish now (called by
    /// ``StatusPublisher``: a later change queues the connection again).
    func takeStatus() -> [String: StatusValue] {
        figures.withLock { f in
            f.queued = false
            return f.status()
        }
    }

    // Memory: an async function's frame holds every local of everything
    // inlined into it, and the frames of `run` and `session` live as long as
    // the connection (10,000 connections: every byte counts 10,000 times).
    // So the steps that run once per connection (connect, hooks, events,
    // backoff) are `@inline(never)` functions, and `run` keeps only the link
    // and a few counters. Those steps also run in child tasks: a task keeps
    // the stack slabs of its deepest await chain until it ends (a frame
    // that does not fit the next slab gets a new one as large as all the
    // slabs after the current one), so a deep connect in the strategy's own
    // task would cost its depth for the life of the connection.

    func run() async {
        var attempt = 0
        update { _ in }
        while !Task.isCancelled {
            let link: TCPLink
            let plan: SessionPlan
            // Connecting (resolving, the deadline race, the protocol's
            // opening exchange), hooks, events and the backoff run once per
            // connection, each in a child task for the reason given at
            // `start`: the connect path is the deepest, and this task would
            // otherwise keep its slabs for the life of the connection.
            switch await inChildTask({ [attempt] in await self.connectOrBackOff(attempt: attempt) }) {
            case .connected(let l, let p): (link, plan) = (l, p)
            case .retry:
                attempt += 1
                continue
            case .stop: return
            }
            // An MQTT session or a SIP registration proved itself in the
            // opening exchange; a raw connection does at its first pong.
            let opened = settings.wire == .mqtt || plan.registers
            let pingsBefore = await inChildTask { await self.announceConnected(link, sessionOpened: opened) }
            let reason = await session(on: link, plan: plan, connectedAt: context.clock.now)
            if Task.isCancelled || reason == Self.cancelled {
                await sayGoodbye(on: link, plan: plan)
                link.close()
                return
            }
            link.close()
            let next = await inChildTask { [attempt] in
                await self.announceDisconnected(link, reason: reason, pingsBefore: pingsBefore, attempt: attempt)
            }
            guard let next else { return }
            attempt = next
        }
    }

    private enum ConnectOutcome: Sendable {
        case connected(TCPLink, SessionPlan)
        /// It failed and the backoff passed: the next attempt is one later.
        case retry
        /// Cancelled.
        case stop
    }

    /// Connects; on failure logs it and backs off.
    @inline(never)
    private func connectOrBackOff(attempt: Int) async -> ConnectOutcome {
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
            guard await backOff(attempt: attempt, longest: permanent, after: message) else { return .stop }
            return .retry
        }
    }

    /// Status, log, event and `on_connect` for a fresh link; returns the
    /// ping count before the session.
    @inline(never)
    private func announceConnected(_ link: TCPLink, sessionOpened: Bool) async -> UInt64 {
        let (local, remote) = link.addresses
        update { f in
            f.state = "up"
            f.local = local
            f.remote = remote
            // Recovered: the error of the outage is over (the strategy's
            // LastError follows).
            if sessionOpened { f.lastError = "" }
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
    /// the next attempt's number, nil when cancelled.
    @inline(never)
    private func announceDisconnected(_ link: TCPLink, reason: String, pingsBefore: UInt64, attempt: Int) async -> Int? {
        var attempt = attempt
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
        guard await backOff(attempt: attempt, after: reason) else { return nil }
        return attempt + 1
    }

    private static let cancelled = "cancelled"
    /// An attempt number whose backoff is the configured maximum.
    private static let longestBackoff = 64

    /// Waits out the backoff delay for `attempt` (counted from 0 in each
    /// outage; `longest`: the configured maximum whatever the attempt);
    /// false when cancelled.
    @inline(never)
    private func backOff(attempt: Int, longest: Bool = false, after error: String) async -> Bool {
        let delay = settings.reconnect.delay(attempt: longest ? Self.longestBackoff : attempt)
        update { f in
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
        update { f in
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
        let cost = context.cost
        let deadline = clock.now + settings.connectTimeout
        let opened = try await withDeadline(deadline, clock: clock) { () -> (TCPLink, SessionPlan) in
            let addresses = try await AddressResolver.resolve(settings.endpoint)
            var failures: [String] = []
            var link: TCPLink?
            for address in addresses {
                do {
                    link = try await TCPLink.connect(to: address, options: settings.linkOptions, tls: settings.tls, clock: clock, cost: cost)
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
            // An MQTT 5 broker may impose a keep-alive (Server Keep Alive): the
            // pings then follow it.
            let imposed = try await openMQTT(on: link)
            if let imposed, imposed != settings.interval {
                context.log.info("the broker set the keep-alive to \(imposed.vigilDescription) (Server Keep Alive); pinging at that interval")
            }
            return SessionPlan(interval: imposed ?? settings.interval)
        case .sip:
            guard let sip = settings.sip, sip.aor != nil else { return SessionPlan(interval: settings.interval) }
            var registration = SIPRegistration(settings: sip, transport: settings.tls != nil ? "tls" : "tcp")
            let (expires, flowTimer) = try await register(&registration, on: link)
            context.log.info("registered \(sip.aor ?? "") for \(expires.vigilDescription)\(flowTimer.map { ", Flow-Timer \($0.vigilDescription)" } ?? "")")
            return SessionPlan(interval: flowTimer ?? settings.interval, registration: registration, registeredFor: expires)
        }
    }

    /// CONNECT, CONNACK, then SUBSCRIBE and SUBACK when topics are
    /// configured; returns the keep-alive an MQTT 5 broker imposed, if any.
    private func openMQTT(on link: TCPLink) async throws -> Duration? {
        guard let mqtt = settings.mqtt else { return nil }
        var password = mqtt.password
        if let file = mqtt.passwordFile { password = try readSecret(file).get() }
        let keepAlive = UInt16(clamping: settings.interval.components.seconds)
        try await link.send(MQTTPacket.connect(mqtt, keepAliveSeconds: keepAlive, password: password))
        let acknowledgement = MQTTPacket.connack(try await link.nextControl(), version: mqtt.version)
        if let refusal = acknowledgement.refusal {
            throw LinkError(refusal.message, permanent: refusal.permanent)
        }
        // 0 would mean no keep-alive at all; the strategy keeps its own then.
        let imposed = acknowledgement.serverKeepAliveSeconds.flatMap { $0 > 0 ? Duration.seconds(Int64($0)) : nil }
        guard !mqtt.subscriptions.isEmpty else { return imposed }
        try await link.send(MQTTPacket.subscribe(mqtt.subscriptions, packetID: 1, version: mqtt.version))
        while true {
            let packet = try await link.nextControl()
            guard packet.first == 0x90 else { continue }  // e.g. a stray PUBACK; SUBACK is what is awaited
            if let refusal = MQTTPacket.subackRefusal(packet, topics: mqtt.subscriptions, packetID: 1, version: mqtt.version) {
                throw LinkError(refusal, permanent: true)
            }
            return imposed
        }
    }

    /// One REGISTER transaction (answering one digest challenge); returns
    /// what the registrar granted our binding. `expires` zero removes our
    /// binding (and returns zero).
    private func register(_ registration: inout SIPRegistration, on link: TCPLink, expires: Duration? = nil) async throws -> (Duration, Duration?) {
        var password = registration.settings.password
        if let file = registration.settings.passwordFile { password = try readSecret(file).get() }
        let local = link.addresses.local
        try await link.send(registration.request(local: local, password: password, expires: expires))
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
                if expires == .zero { return (.zero, nil) }
                update { $0.registrations += 1 }
                return try registration.granted(by: response)
            case 401, 407:
                // One challenge, and one more for a stale nonce; a third means the credentials are wrong.
                guard challenges < 2, registration.take(challengeOf: response, hasPassword: password != nil) else {
                    throw Self.refusal(response, hasPassword: password != nil)
                }
                challenges += 1
                try await link.send(registration.request(local: local, password: password, expires: expires))
            default:
                throw Self.refusal(response, hasPassword: password != nil)
            }
        }
    }

    /// A registrar's final refusal as a LastError.
    private static func refusal(_ response: SIPMessage, hasPassword: Bool) -> LinkError {
        // The reason phrase comes from the server: printable ASCII only, bounded.
        let reason = serverText(response.reason, limit: 120)
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
        guard var registration = plan.registration.withLock({ $0 }) else { return await link.awaitEnd() }
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
                // Its CSeq is where the unregistration at stop goes on from.
                plan.registration.withLock { $0 = current }
                context.log.info("renewed the registration for \(expires.vigilDescription)")
            } catch is CancellationError {
                return Self.cancelled
            } catch {
                return "registration renewal failed: \(error)"
            }
        }
    }

    /// The longest a goodbye (SIP unregistration, MQTT DISCONNECT) may
    /// hold up a clean stop.
    static let goodbyeTimeout: Duration = .seconds(1)

    /// On a clean stop (shutdown, or a reload that removes the strategy):
    /// removes our SIP binding (`Expires: 0`, ours only) or sends MQTT
    /// DISCONNECT (so the broker publishes no will), within
    /// ``goodbyeTimeout``. In a task of its own: the strategy's task is
    /// cancelled, and the goodbye must still go out. A crash sends nothing,
    /// which is what a will is for.
    @inline(never)
    private func sayGoodbye(on link: TCPLink, plan: SessionPlan) async {
        guard !link.hasEnded, settings.wire != .raw else { return }
        let timeout = min(Self.goodbyeTimeout, settings.connectTimeout)
        let clock = context.clock
        // Unstructured task: awaited at once; not cancelled, on purpose: the strategy's task is
        // cancelled and the goodbye must still go out, within its deadline.
        let said: String = await Task {
            do {
                let done = try await withDeadline(clock.now + timeout, clock: clock) { () -> String in
                    switch self.settings.wire {
                    case .raw:
                        return ""
                    case .mqtt:
                        try await link.send(MQTTPacket.disconnect(version: self.settings.mqtt?.version ?? .v311))
                        // The broker closes the connection when it has read
                        // DISCONNECT; closing first could reset it unread.
                        _ = await link.awaitEnd()
                        return "sent DISCONNECT to the broker"
                    case .sip:
                        guard var registration = plan.registration.withLock({ $0 }) else { return "" }
                        registration.skipCSeq()
                        _ = try await self.register(&registration, on: link, expires: .zero)
                        return "removed our registration of \(registration.settings.aor ?? "") (Expires: 0)"
                    }
                }
                return done ?? "no goodbye to \(self.settings.endpoint) within \(timeout.vigilDescription)"
            } catch {
                return "the goodbye to \(self.settings.endpoint) failed: \(error)"
            }
        }.value
        if !said.isEmpty { context.log.info("stopping: \(said)") }
    }

    /// Keeps `link` alive until it dies; returns why it ended.
    ///
    /// Its frame lives as long as the connection: it keeps the keeper and
    /// awaits; making the keeper, the hooks' task group and the end's
    /// report are functions of their own, whose frames are not held.
    @inline(never)
    private func session(on link: TCPLink, plan: SessionPlan, connectedAt: VigilInstant) async -> String {
        // The keep-alive has no task: the shared schedule's wakes run it
        // (``PingKeeper``), and it closes the link when it gives up, which
        // ends the waits below.
        let keeper = startKeeper(on: link, plan: plan, connectedAt: connectedAt)
        let ended = settings.onData != nil || plan.registers ? await handlers(on: link, plan: plan) : await link.awaitEnd()
        return await sessionEnded(keeper, ended: ended)
    }

    @inline(never)
    private func startKeeper(on link: TCPLink, plan: SessionPlan, connectedAt: VigilInstant) -> PingKeeper {
        let keeper = PingKeeper(connection: self, link: link, interval: plan.interval, since: connectedAt)
        keeper.start()
        return keeper
    }

    /// `on_data` and the SIP renewals for as long as the link lasts.
    @inline(never)
    private func handlers(on link: TCPLink, plan: SessionPlan) async -> String {
        await withTaskGroup(of: String.self) { group in
            // The data loop ends when the link ended and every byte went
            // to the hook; it stands in for awaitEnd so the last data
            // before a close still reaches on_data.
            group.addTask { await self.deliverData(from: link) }
            if plan.registers { group.addTask { await self.renewRegistration(plan, on: link) } }
            let first = await group.next() ?? Self.cancelled
            group.cancelAll()
            return first
        }
    }

    /// Stops the keeper; why the session ended (the keeper's failure first).
    @inline(never)
    private func sessionEnded(_ keeper: PingKeeper, ended: String) async -> String {
        let (failure, overrunLate) = keeper.stop()
        if let overrunLate, let failure {
            context.log.warning("\(failure); closing the connection")
            await context.events.record("handler-overrun", [
                "remote": settings.endpoint.description, "late_ms": String(overrunLate.nanoseconds / 1_000_000)])
        }
        return failure ?? ended
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
    /// SIP: the registration to renew on this flow, as last sent (the
    /// renewals' CSeq goes on into the unregistration at stop).
    let registration: Lock<SIPRegistration?>
    let registeredFor: Duration
    /// SIP: a registration is kept on this flow.
    let registers: Bool

    init(interval: Duration, registration: SIPRegistration? = nil, registeredFor: Duration = .zero) {
        self.interval = interval
        self.registration = Lock(registration)
        self.registers = registration != nil
        self.registeredFor = registeredFor
    }
}

/// Runs `body` in a child task and returns its result: the memory of its
/// call stack is freed when it ends, while the calling task would keep it
/// for as long as it lives. Not inlined: inlined, the group's frame is
/// part of the caller's, which the calling task then keeps.
@inline(never)
func inChildTask<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        guard let value = try await group.next() else { throw CancellationError() }  // one task was added
        return value
    }
}

/// ``inChildTask(_:)`` for a body that cannot throw (not inlined either).
@inline(never)
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

/// Publishes the status of connections whose figures changed, one after the
/// other, from one task.
///
/// Why: a ping changes its connection's figures from the wake or the event
/// thread, where nothing can wait for the lease registry. A batch of 10,000
/// pongs then costs one task and 10,000 calls in a row, not a task and its
/// hops per ping; a connection that changes again before its turn is
/// published once, with its latest figures. One publisher keeps each lease's
/// statuses in order: every snapshot is taken after the one before it went.
final class StatusPublisher: Sendable {
    static let shared = StatusPublisher()

    private struct State {
        var queue: [VoipConnection] = []
        var running = false
    }

    private let state = Lock(State())

    /// Publishes `connection`'s status soon (it is not queued yet).
    func enqueue(_ connection: VoipConnection) {
        let start = state.withLock { s -> Bool in
            s.queue.append(connection)
            defer { s.running = true }
            return !s.running
        }
        // Unstructured task: not cancelled: it ends when the queue is empty (the next enqueue
        // starts another).
        if start { Task.detached { await self.drain() } }
    }

    /// How long the statuses that follow a published batch gather before
    /// the next goes. A round of 10,000 pongs arrives over a few hundred
    /// milliseconds: published as they came, it went as over a thousand
    /// small batches, each a task, a hop into the registry and a wake-up of
    /// every follower of the registry's changes; gathered, it goes as a few
    /// large ones. A lone change (a reconnect) still goes at once. Far
    /// inside the bus's 1 s rate limit of `Status`.
    static let gathering: Duration = .milliseconds(25)

    private func drain() async {
        while true {
            let batch: [VoipConnection] = state.withLock { s in
                if s.queue.isEmpty { s.running = false }
                defer { s.queue = [] }
                return s.queue
            }
            if batch.isEmpty { return }
            await Self.publish(batch)
            try? await Task.sleep(for: Self.gathering)
        }
    }

    /// Most statuses in one call: the registry is not held for long at once.
    static let chunk = 512

    /// One call per sink (the host's registry) for up to ``chunk``
    /// connections; a lease that cannot batch gets a call of its own.
    private static func publish(_ batch: [VoipConnection]) async {
        var sink: (any LeaseStatusSink)?
        var updates: [(lease: LeaseID, status: [String: StatusValue])] = []
        func flush() async {
            if let sink, !updates.isEmpty { await sink.setStatuses(updates) }
            updates.removeAll(keepingCapacity: true)
        }
        for connection in batch {
            guard let own = connection.statusSink else {
                await flush()
                await connection.lease.setStatus(connection.takeStatus())
                continue
            }
            if own !== sink || updates.count >= chunk {
                await flush()
                sink = own
            }
            updates.append((connection.lease.id, connection.takeStatus()))
        }
        await flush()
    }
}
