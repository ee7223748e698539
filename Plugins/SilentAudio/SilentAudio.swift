import VigilKit

/// A configured `silent-audio` instance.
///
/// Each *session* connects and subscribes to the server's sink and server
/// events, picks the sink, opens a playback stream and holds one lease while
/// the stream plays. When the sink goes away, the lease is released (so the
/// lease history shows the gap) and the session waits, on the same
/// connection, for the server to announce the sink again: the stream comes
/// back as soon as the sink does, not after a backoff. A stream killed while
/// its sink stays is opened again after the first `reconnect` delay. With
/// the default sink (`sink` left out or `"@DEFAULT_SINK@"`), the stream
/// moves whenever the server's default sink changes. With
/// `stop_before_sleep`, the stream is closed before each system sleep and
/// opened again after resume.
///
/// When the server goes away, the session ends and a new one starts after
/// the `reconnect` backoff. A failure before anything played (no server,
/// unknown sink) is thrown at once, and so is one that persists until the
/// backoff reaches its maximum: the host then shows it as the strategy's
/// `LastError` and restarts the strategy with its own backoff.
public struct SilentAudio: KeepAliveStrategy {
    public let settings: SilentAudioSettings

    public init(settings: SilentAudioSettings) {
        self.settings = settings
    }

    public func run(in context: StrategyContext) async throws {
        guard settings.stopBeforeSleep else { return try await keepPlaying(context, played: false) }
        let gate = SleepGate()
        var watch: Task<Void, Never>?
        if let watcher = context.leases as? any SystemSleepWatching {
            do {
                watch = try await watcher.watchSleep(
                    who: "Vigil \(context.name)", beforeSleep: { await gate.sleep() }, afterResume: { await gate.wake() })
            } catch {
                context.log.warning("stop_before_sleep: \(error); the stream plays on through system sleep")
            }
        } else {
            context.log.warning("stop_before_sleep: this host does not announce system sleep; the stream plays on through it")
        }
        defer { watch?.cancel() }
        var played = false
        while true {
            await gate.untilAwake()
            // Plays until the system prepares to sleep: then the stream is
            // closed and its lease released, and only then may the sleep go on.
            do {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    let resumed = played
                    group.addTask { try await keepPlaying(context, played: resumed) }
                    group.addTask { try await gate.untilSleep() }
                    defer { group.cancelAll() }
                    try await group.next()
                }
            } catch {
                await gate.stopped()  // a sleep announced meanwhile need not wait
                throw error
            }
            played = true
            context.log.info("the system is going to sleep: stream stopped until it resumes")
            await context.events.record("audio-sleep", [:])
            await gate.stopped()
        }
    }

    /// Plays, reconnecting after losses, until cancelled or until
    /// reconnecting fails for good. `played`: something played before in
    /// this run, so a missing sink is waited for.
    private func keepPlaying(_ context: StrategyContext, played: Bool) async throws {
        var attempt = 0
        var played = played
        while true {
            try Task.checkCancellation()
            do {
                let loss = try await session(context, played: &played)
                attempt = 0
                context.log.warning("\(loss); reconnecting")
            } catch let error as CancellationError {
                throw error
            } catch {
                // Nothing played yet in this run, or the backoff is spent:
                // let the host show the error.
                guard played, settings.reconnect.ceiling(attempt: attempt) < settings.reconnect.maximum else { throw error }
                context.log.warning("reconnect attempt \(attempt + 1) failed: \(error)")
            }
            let delay = settings.reconnect.delay(attempt: attempt)
            attempt += 1
            context.log.info("reconnecting in \(delay.vigilDescription)")
            try await context.clock.sleep(for: delay)
        }
    }

    /// How a stream that played ended.
    private enum StreamEnd {
        /// Its sink went away: wait for it to come back.
        case sinkGone(String)
        /// The stream failed or was killed while its sink stays.
        case streamEnded(String)
        /// The connection to the server was lost.
        case connectionLost(String)

        var reason: String {
            switch self {
            case .sinkGone(let r), .streamEnded(let r), .connectionLost(let r): r
            }
        }
    }

    /// One connection, with a stream whenever its sink exists. Returns why
    /// the connection ended after something played; throws when nothing
    /// could start. `played` becomes true once a stream played in this run:
    /// from then on a missing sink is waited for, not an error.
    private func session(_ context: StrategyContext, played: inout Bool) async throws -> String {
        let pulse = try PulseConnection()
        defer { pulse.close() }
        var events = pulse.events.makeAsyncIterator()

        try pulse.connect(server: settings.server, applicationName: "Vigil")
        connecting: while true {
            switch try await Self.next(&events) {
            case .contextReady: break connecting
            case .contextFailed(let reason): throw SilentAudioError.noServer(server: settings.server, reason: reason)
            default: continue
            }
        }
        pulse.subscribe()
        while true {
            let (sink, server) = try await pickSink(pulse, &events, context, mayWait: played)
            let end = try await play(on: sink, server: server, pulse, &events, context)
            played = true
            await context.events.record("audio-lost", ["reason": end.reason])
            switch end {
            case .connectionLost(let reason):
                return reason  // logged by the caller, which reconnects
            case .sinkGone(let reason):
                context.log.warning("\(reason)")
                pulse.closeStream()
            case .streamEnded(let reason):
                context.log.warning("\(reason)")
                pulse.closeStream()
                // Not at once: a server that keeps killing the stream is
                // not hammered. A sink that went meanwhile is waited for.
                try await context.clock.sleep(for: settings.reconnect.delay(attempt: 0))
            }
        }
    }

    /// The configured sink, or the server's default sink. When it does not
    /// exist and `mayWait`, waits for the server to announce a new sink or a
    /// new default, and looks again; otherwise throws.
    private func pickSink(
        _ pulse: PulseConnection, _ events: inout AsyncStream<PulseEvent>.Iterator, _ context: StrategyContext, mayWait: Bool
    ) async throws -> (SinkInfo, ServerInfo) {
        var announced = false
        while true {
            let sinks = await pulse.sinks()
            // No answer: the connection is gone.
            guard let server = await pulse.serverInfo() else { throw SilentAudioError.connectionLost("the server did not answer") }
            let missing: SilentAudioError
            if let name = settings.sink {
                if let found = sinks.first(where: { $0.name == name }) { return (found, server) }
                missing = .unknownSink(name, available: sinks.map(\.name))
            } else {
                if let name = server.defaultSink, let found = sinks.first(where: { $0.name == name }) { return (found, server) }
                missing = .noDefaultSink
            }
            guard mayWait else { throw missing }
            if !announced {
                announced = true
                let wanted = settings.sink.map { "sink \($0)" } ?? "a default sink"
                context.log.notice("waiting for \(wanted) to appear")
                await context.events.record("audio-waiting", ["sink": settings.sink ?? "@DEFAULT_SINK@"])
            }
            waiting: while true {
                switch try await Self.next(&events) {
                case .sinkAdded, .serverChanged: break waiting
                case .contextFailed(let reason): throw SilentAudioError.connectionLost(reason)
                default: continue
                }
            }
        }
    }

    /// Plays on `sink` under a lease until the stream ends; throws when the
    /// stream could not start.
    private func play(
        on sink: SinkInfo, server: ServerInfo, _ pulse: PulseConnection, _ events: inout AsyncStream<PulseEvent>.Iterator,
        _ context: StrategyContext
    ) async throws -> StreamEnd {
        // Default to the sink's own rate and channels: nothing is resampled
        // (which would cost CPU and could filter out the ±1 LSB signal).
        let rate = settings.rate ?? sink.rate
        let channels = settings.channels ?? sink.channels
        if case .sine(let f, _) = settings.signal, f >= Double(rate) / 2 {
            throw SilentAudioError.unsupported("frequency_hz \(Signal.hertz(f)) is not below half of sink \"\(sink.name)\"'s sample rate (\(rate) Hz); lower it or set `rate`")
        }
        var envelope: BurstEnvelope?
        if case .periodic(_, let length, let fade) = settings.play {
            envelope = BurstEnvelope(frames: Self.frames(length, rate), fadeFrames: Self.frames(fade, rate))
        }
        let renderer = SignalRenderer(signal: settings.signal, format: settings.format, channels: channels, rate: rate, envelope: envelope)
        // Opened on the sink found, also when following the default: the
        // default may change again before the stream is ready, which the
        // server announces and the loop below follows.
        let stream = try pulse.openStream(StreamSpec(
            name: "Vigil \(context.name) (\(settings.signal))", sink: settings.sink, format: settings.format,
            rate: rate, channels: channels, latency: settings.latency,
            dontMove: settings.sink != nil, startCorked: false), renderer: renderer)
        opening: while true {
            switch try await Self.next(&events) {
            case .streamReady(stream) : break opening
            case .streamFailed(stream, let reason): throw SilentAudioError.streamFailed(sink: sink.name, reason: reason)
            case .contextFailed(let reason): throw SilentAudioError.connectionLost(reason)
            default: continue
            }
        }

        let playing = pulse.streamSink ?? (sink.index, sink.name)
        pulse.watchSink(playing.index)
        let lease = try await context.leases.acquire(LeaseRequest(
            holds: "audio stream on \(playing.name)",
            reason: "keep sink \(playing.name) awake with \(settings.signal)"))
        let status = LeaseStatus(lease)
        var values: [String: StatusValue] = [
            "Sink": .string(playing.name),
            "Signal": .string(settings.signal.description),
            "State": .string(sink.state),
            "Stream": .string("playing"),
            "Underruns": .uint(0),
            "Server": .string([.some("\(server.name) \(server.version)"), pulse.serverAddress.map { "at \($0)" }].compactMap { $0 }.joined(separator: " ")),
            "Format": .string("\(settings.format.rawValue) \(channels)ch \(rate)Hz"),
            "Play": .string(settings.play.description),
        ]
        if let buffer = pulse.bufferAttributes {
            let bytesPerSecond = Double(settings.format.bytesPerSample * channels * rate)
            values["Buffer"] = .string("\(Int((Double(buffer.tlength) / bytesPerSecond * 1000).rounded()))ms")
        }
        await status.set(values)
        context.log.info("playing \(settings.signal) on \(playing.name) (\(settings.format.rawValue) \(channels)ch \(rate)Hz, buffer \(settings.latency.vigilDescription), \(settings.play))")
        await context.events.record("audio-playing", ["sink": playing.name, "signal": settings.signal.description, "lease": lease.id.description])

        let outcome: Result<StreamEnd, any Error>
        do {
            outcome = .success(try await withThrowingTaskGroup(of: Void.self) { group in
                if case .periodic(let every, let length, _) = settings.play {
                    let latency = settings.latency
                    group.addTask { try await Self.playPeriodically(pulse, status, context, every: every, length: length, latency: latency) }
                }
                defer { group.cancelAll() }
                var current = playing
                while true {
                    switch try await Self.next(&events) {
                    case .sinkChanged(let info) where info.index == current.index:
                        await status.set(["State": .string(info.state)])
                    case .sinkRemoved(let index) where index == current.index:
                        return .sinkGone("sink \(current.name) was removed")
                    case .underflow:
                        await status.set(["Underruns": .uint(pulse.underruns)])
                    case .streamMoved(stream, let index, let name):
                        current = (index, name)
                        context.log.info("stream moved to sink \(name)")
                        await status.set(["Sink": .string(name)])
                    case .serverChanged where settings.sink == nil:
                        // Follow the default sink, also when the stream was
                        // moved by hand (the server then keeps it where it is).
                        if let target = await pulse.serverInfo()?.defaultSink, target != current.name {
                            context.log.info("the default sink is now \(target); moving the stream there")
                            pulse.moveStream(toSink: target)
                        }
                    case .streamFailed(stream, let reason):
                        // Killed with its sink (a named sink's stream may not
                        // move), with the connection, or alone: look to tell.
                        guard await pulse.serverInfo() != nil else {
                            return .connectionLost("lost the connection to the server: \(reason)")
                        }
                        let sinks = await pulse.sinks()
                        if !sinks.contains(where: { $0.index == current.index }) {
                            return .sinkGone("sink \(current.name) was removed")
                        }
                        return .streamEnded("stream on \(current.name) ended: \(reason)")
                    case .contextFailed(let reason):
                        return .connectionLost("lost the connection to the server: \(reason)")
                    default:
                        continue
                    }
                }
            })
        } catch {
            outcome = .failure(error)
        }
        await lease.release()
        return try outcome.get()
    }

    /// Plays `length` of signal every `every`; corks the stream in between.
    /// The stream started playing, so the first burst is already running.
    private static func playPeriodically(
        _ pulse: PulseConnection, _ status: LeaseStatus, _ context: StrategyContext,
        every: Duration, length: Duration, latency: Duration
    ) async throws {
        var burstStart = context.clock.now
        while true {
            // The last samples of the burst leave the buffer `latency` later.
            let end = burstStart + length + latency
            _ = try await context.scheduler.wake(WakeRequest(earliest: end, latest: end, label: "\(context.name) burst end"))
            pulse.setPlaying(false)
            await status.set(["Stream": .string("paused")])
            burstStart = burstStart + every
            _ = try await context.scheduler.wake(WakeRequest(earliest: burstStart, latest: burstStart, label: "\(context.name) burst"))
            pulse.setPlaying(true)
            await status.set(["Stream": .string("playing")])
        }
    }

    private static func next(_ events: inout AsyncStream<PulseEvent>.Iterator) async throws -> PulseEvent {
        guard let event = await events.next() else { throw CancellationError() }
        return event
    }

    private static func frames(_ d: Duration, _ rate: Int) -> Int {
        Int((d.seconds * Double(rate)).rounded())
    }
}

/// Between the sleep watch (logind's `PrepareForSleep`) and the playing
/// loop: the watch announces a sleep and waits until the stream stopped;
/// the loop waits for the system to be awake before it plays.
actor SleepGate {
    private var asleep = false
    /// The loop, waiting for a sleep to begin.
    private var sleepWaiter: CheckedContinuation<Void, any Error>?
    /// The watch, waiting for the stream to stop.
    private var stopWaiter: CheckedContinuation<Void, Never>?
    /// The loop, waiting for the system to resume.
    private var wakeWaiter: CheckedContinuation<Void, Never>?

    /// Called before the system sleeps; returns once the stream stopped (or
    /// at once if nothing plays, or the loop is gone).
    func sleep() async {
        asleep = true
        guard let waiter = sleepWaiter else { return }
        sleepWaiter = nil
        waiter.resume()
        await withCheckedContinuation { stopWaiter = $0 }
    }

    /// Called after the system resumed.
    func wake() {
        asleep = false
        wakeWaiter?.resume()
        wakeWaiter = nil
    }

    /// The loop: returns when a sleep begins; throws when cancelled.
    func untilSleep() async throws {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                // A cancellation after this check resumes the waiter: its
                // handler's task runs on this actor after this closure.
                if Task.isCancelled {
                    c.resume(throwing: CancellationError())
                } else if asleep {
                    c.resume()
                } else {
                    sleepWaiter = c
                }
            }
        } onCancel: {
            // Unstructured task: not cancelled: one hop into the actor to drop the waiter, from a
            // synchronous cancellation handler.
            Task { await self.cancelSleepWaiter() }
        }
    }

    private func cancelSleepWaiter() {
        sleepWaiter?.resume(throwing: CancellationError())
        sleepWaiter = nil
    }

    /// The loop: the stream is stopped (or the loop ends); the sleep may go on.
    func stopped() {
        stopWaiter?.resume()
        stopWaiter = nil
    }

    /// The loop: returns once the system is awake.
    func untilAwake() async {
        guard asleep else { return }
        await withCheckedContinuation { wakeWaiter = $0 }
    }
}

/// The live status of the stream's lease: merged updates, each published.
actor LeaseStatus {
    private let lease: any LeaseHandle
    private var values: [String: StatusValue] = [:]

    init(_ lease: any LeaseHandle) { self.lease = lease }

    func set(_ changes: [String: StatusValue]) async {
        values.merge(changes) { $1 }
        await lease.setStatus(values)
    }
}

extension PlayMode: CustomStringConvertible {
    public var description: String {
        switch self {
        case .always: "always"
        case .periodic(let every, let length, let fade):
            "\(length.vigilDescription) every \(every.vigilDescription), fade \(fade.vigilDescription)"
        }
    }
}
