import Synchronization
import VigilKit

/// The keep-alive of one session: at each deadline, skip (traffic proved the
/// link alive) or run the ping handler within `handler_timeout`; when the
/// handler fails, close the link with the reason.
///
/// A state machine with no task of its own: ``KeepAliveSchedule`` calls
/// ``due(generation:)`` from the batch's wake, the ping is sent from there,
/// and the pong (or the handler's deadline, or the link's end) settles the
/// round on the thread that learns it. Only a ping that cannot be sent at
/// once (a full socket buffer, a TLS write waiting for input) waits in a
/// task of its own.
final class PingKeeper: Sendable {
    private enum Phase {
        /// Waiting for round `generation`'s wake.
        case scheduled(generation: UInt64)
        /// The handler runs: started at `started`, link handler `handler`.
        case pinging(started: VigilInstant, handler: UInt64)
        case stopped
    }

    private struct State {
        var phase: Phase
        /// The window of the next round opens `interval` × (1 − jitter) after this.
        var base: VigilInstant
        var lastGeneration: UInt64 = 0
        /// Why the keep-alive gave up, once it did.
        var failure: String?
        /// How long after its deadline an overrun handler was cut off.
        var overrunLate: Duration?
    }

    private let connection: VoipConnection
    private let link: TCPLink
    private let interval: Duration
    let scheduler: any WakeScheduling
    /// Where this keeper's rounds wait on ``KeepAliveSchedule`` (with the
    /// alignment).
    let scheduleKey: KeepAliveSchedule.Key
    /// The strategy instance, whose wakeup a wake for this keeper's round is.
    let strategy: String
    private let clock: any VigilClock
    // What each ping reads, taken out of the settings once per session (a
    // ping must not copy the whole settings struct, or retain what it holds).
    private let ping: [UInt8]
    private let expectsPong: Bool
    private let handlerTimeout: Duration
    private let skipPingOnTraffic: Bool
    /// MQTT's keep-alive counts only what the client sends (the broker drops
    /// a client that sent nothing for 1.5 × keep-alive, whatever the broker
    /// itself sent); raw and SIP count what comes back.
    private let countsClientTraffic: Bool
    private let state: Lock<State>
    private let offsets: (earliest: Int64, target: Int64)
    /// The generation of this keeper's live entry on ``KeepAliveSchedule``
    /// (0: none). Changed only under the schedule's lock; atomic so that the
    /// schedule needs no table of its keepers.
    let scheduledEntry = Atomic<UInt64>(0)

    init(connection: VoipConnection, link: TCPLink, interval: Duration, since connectedAt: VigilInstant) {
        let settings = connection.settings
        self.connection = connection
        self.link = link
        self.interval = interval
        self.scheduler = connection.context.scheduler
        self.strategy = connection.context.name
        self.clock = connection.context.clock
        let offsets = Self.windowOffsets(interval: interval, jitter: settings.jitter)
        self.scheduleKey = KeepAliveSchedule.Key(connection.context.scheduler, align: settings.align, window: offsets)
        self.ping = settings.ping
        self.expectsPong = !settings.expect.isEmpty
        self.handlerTimeout = settings.handlerTimeout
        self.skipPingOnTraffic = settings.skipPingOnTraffic
        self.countsClientTraffic = settings.wire == .mqtt
        self.state = Lock(State(phase: .stopped, base: connectedAt))
        self.offsets = offsets
    }

    /// Schedules the first round.
    func start() {
        state.withLock { s in scheduleNext(&s) }
    }

    /// Stops: no round starts any more, and a running one settles unseen.
    /// Returns why the keep-alive gave up, if it did, and how late past its
    /// deadline an overrun handler was cut off.
    func stop() -> (failure: String?, overrunLate: Duration?) {
        let (failure, late, handler): (String?, Duration?, UInt64?) = state.withLock { s in
            var handler: UInt64?
            if case .pinging(_, let h) = s.phase { handler = h }
            s.phase = .stopped
            return (s.failure, s.overrunLate, handler)
        }
        if let handler { link.endHandler(generation: handler) }
        KeepAliveSchedule.shared.remove(self)
        return (failure, late)
    }

    /// Round `generation`'s wake fired.
    func due(generation: UInt64) {
        let now = clock.now
        enum Step { case nothing, skipped, ping(late: Bool, handler: UInt64) }
        let step: Step = state.withLock { s in
            guard case .scheduled(let g) = s.phase, g == generation else { return .nothing }
            if skipPingOnTraffic, let traffic = countsClientTraffic ? link.lastSent : link.lastReceived, traffic > s.base {
                s.base = traffic
                scheduleNext(&s)
                return .skipped
            }
            // The wake came after the window's end (base + interval; the
            // request's `latest` is only this round's random target inside
            // the window): the machine or the process was busy or frozen,
            // and the ping is late.
            let late = now > s.base + interval
            if expectsPong { link.expectPong() }
            let handler = link.beginHandler(deadline: now + handlerTimeout)
            s.phase = .pinging(started: now, handler: handler)
            return .ping(late: late, handler: handler)
        }
        switch step {
        case .nothing:
            return
        case .skipped:
            connection.update { $0.skippedPings += 1 }
        case .ping(let late, let handler):
            if late { connection.update { $0.latePings += 1 } }
            send(from: 0, handler: handler)
        }
    }

    /// Sends the ping from `offset`; waits for room in a task only when the
    /// socket cannot take it now.
    private func send(from offset: Int, handler: UInt64) {
        let progress: TCPLink.SendProgress
        do {
            progress = try link.sendSome(ping, from: offset)
        } catch {
            return settle(.failure(error), handler: handler)
        }
        switch progress {
        case .sent:
            sent(handler: handler)
        case .wouldBlock(let sent, _):
            // Unstructured task: not cancelled: it ends when the link has taken the rest of the
            // ping or failed (a link that ends fails its sends).
            Task { [self] in
                do {
                    try await link.send(Array(ping[sent...]), isPing: true)
                } catch {
                    return settle(.failure(error), handler: handler)
                }
                self.sent(handler: handler)
            }
        }
    }

    private func sent(handler: UInt64) {
        if !expectsPong {
            settle(.success(clock.now), handler: handler)
        } else {
            link.onPong(PongWaiter(keeper: self, handler: handler))
        }
    }

    /// The handler finished at the given instant, or failed.
    func settle(_ result: Result<VigilInstant, any Error>, handler: UInt64) {
        var overran = false
        var reason = ""
        if case .failure(let error) = result {
            overran = error is TCPLink.HandlerDeadlinePassed
            reason = overran ? overrunReason : "ping failed: \(error)"
        }
        // Only a failure needs the time (a pong carries its arrival): no
        // clock read per pong.
        let now: VigilInstant? = overran ? clock.now : nil
        let started: VigilInstant? = state.withLock { s in
            guard case .pinging(let started, let h) = s.phase, h == handler else { return nil }
            switch result {
            case .success:
                s.base = countsClientTraffic ? started : max(started, link.lastReceived ?? started)
                scheduleNext(&s)
            case .failure:
                s.failure = reason
                if let now { s.overrunLate = now - (started + handlerTimeout) }
                s.phase = .stopped
            }
            return started
        }
        guard let started else { return }  // stopped, or a settled round
        link.endHandler(generation: handler)
        switch result {
        case .success(let finished):
            let expectsPong = self.expectsPong
            connection.update { f in
                f.pings += 1
                if expectsPong { f.lastRttMicroseconds = (finished - started).microseconds }
                // A keep-alive round went through: the connection recovered.
                if !f.lastError.isEmpty { f.lastError = "" }
            }
        case .failure:
            if overran {
                link.abandonPong()
                connection.update { $0.overruns += 1 }
            }
            // The session waiting for the end goes on, and reports `reason`.
            link.close(reason: reason)
        }
    }

    private var overrunReason: String {
        let what = expectsPong ? "no pong" : "the ping could not be sent"
        return "ping handler overran handler_timeout (\(handlerTimeout.vigilDescription)): \(what)"
    }

    /// Puts the next round on the schedule.
    private func scheduleNext(_ s: inout State) {
        s.lastGeneration &+= 1
        s.phase = .scheduled(generation: s.lastGeneration)
        let (earliest, latest) = window(after: s.base)
        KeepAliveSchedule.shared.add(self, generation: s.lastGeneration, earliest: earliest, latest: latest)
    }

    /// The window of the next keep-alive deadline after `base`: RFC 5626's
    /// random 80–100 % of the interval (for `jitter` 0.2). The scheduler may
    /// fire anywhere in [earliest, latest] to coalesce with other wakes; with
    /// `align`, it prefers a slot boundary, so the window stays whole.
    private func window(after base: VigilInstant) -> (VigilInstant, VigilInstant) {
        let earliest = VigilInstant(nanoseconds: base.nanoseconds &+ offsets.earliest)
        let target = VigilInstant(nanoseconds: base.nanoseconds &+ offsets.target)
        if scheduleKey.align != nil || target <= earliest { return (earliest, target) }
        let pick = Int64.random(in: earliest.nanoseconds...target.nanoseconds)
        return (earliest, VigilInstant(nanoseconds: pick))
    }

    /// Where the window starts and where it aims, in nanoseconds after the
    /// base: the same for every round of the session, so worked out once
    /// (Duration arithmetic is 128-bit and showed in a ping's cost).
    private static func windowOffsets(interval: Duration, jitter: Double) -> (earliest: Int64, target: Int64) {
        let end = interval.nanoseconds
        let earliest = Int64(Double(end) * (1 - jitter))
        guard earliest < end else { return (earliest, end) }
        // Aim a little before the window's end: a batch of thousands of
        // sockets (coalesced or aligned wakes) takes a few hundred ms to go
        // through, and the last of them must still ping inside the window.
        return (earliest, end - min((end - earliest) / 4, 1_000_000_000))
    }
}
