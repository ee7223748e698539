import VigilKit

/// A configured `silent-audio` instance.
///
/// Each *session* connects, picks the sink, opens one playback stream and
/// holds one lease while the stream plays. When the server goes away, the
/// sink disappears or the stream is killed, the session ends, its lease is
/// released (so the lease history shows the gap) and a new session starts
/// after the `reconnect` backoff. A failure before anything played (no
/// server, unknown sink) is thrown at once, and so is one that persists
/// until the backoff reaches its maximum: the host then shows it as the
/// strategy's `LastError` and restarts the strategy with its own backoff.
public struct SilentAudio: KeepAliveStrategy {
    public let settings: SilentAudioSettings

    public init(settings: SilentAudioSettings) {
        self.settings = settings
    }

    public func run(in context: StrategyContext) async throws {
        var attempt = 0
        var played = false
        while true {
            try Task.checkCancellation()
            do {
                let loss = try await session(context)
                played = true
                attempt = 0
                context.log.warning("\(loss); reconnecting")
                await context.events.record("audio-lost", ["reason": loss])
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

    /// One connection and stream. Returns why a stream that played ended;
    /// throws when it could not start.
    private func session(_ context: StrategyContext) async throws -> String {
        let pulse = try PulseConnection()
        defer { pulse.close() }
        var events = pulse.events.makeAsyncIterator()

        try pulse.connect(server: settings.server, applicationName: "Vigil")
        switch try await Self.next(&events) {
        case .contextReady: break
        case .contextFailed(let reason): throw SilentAudioError.noServer(server: settings.server, reason: reason)
        default: throw SilentAudioError.pulse("unexpected event before the connection was ready")
        }
        let server = await pulse.serverInfo()
        let sinks = await pulse.sinks()
        let sink: SinkInfo
        if let name = settings.sink {
            guard let found = sinks.first(where: { $0.name == name }) else {
                throw SilentAudioError.unknownSink(name, available: sinks.map(\.name))
            }
            sink = found
        } else {
            guard let name = server?.defaultSink, let found = sinks.first(where: { $0.name == name }) else {
                throw SilentAudioError.noDefaultSink
            }
            sink = found
        }
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
        try pulse.openStream(StreamSpec(
            name: "Vigil \(context.name) (\(settings.signal))", sink: settings.sink, format: settings.format,
            rate: rate, channels: channels, latency: settings.latency,
            dontMove: settings.sink != nil, startCorked: false), renderer: renderer)
        switch try await Self.next(&events) {
        case .streamReady: break
        case .streamFailed(let reason): throw SilentAudioError.streamFailed(sink: sink.name, reason: reason)
        case .contextFailed(let reason): throw SilentAudioError.connectionLost(reason)
        default: throw SilentAudioError.pulse("unexpected event before the stream was ready")
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
            "Server": .string([server.map { "\($0.name) \($0.version)" }, pulse.serverAddress.map { "at \($0)" }].compactMap { $0 }.joined(separator: " ")),
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

        let outcome: Result<String, any Error>
        do {
            outcome = .success(try await withThrowingTaskGroup(of: Void.self) { group in
                if case .periodic(let every, let length, _) = settings.play {
                    let latency = settings.latency
                    group.addTask { try await Self.playPeriodically(pulse, status, context, every: every, length: length, latency: latency) }
                }
                defer { group.cancelAll() }
                var sinkIndex = playing.index
                while true {
                    switch try await Self.next(&events) {
                    case .sinkChanged(let info) where info.index == sinkIndex:
                        await status.set(["State": .string(info.state)])
                    case .sinkRemoved(let index) where index == sinkIndex:
                        return "sink \(playing.name) was removed"
                    case .underflow:
                        await status.set(["Underruns": .uint(pulse.underruns)])
                    case .streamMoved(let index, let name):
                        sinkIndex = index
                        context.log.info("stream moved to sink \(name)")
                        await status.set(["Sink": .string(name)])
                    case .streamFailed(let reason):
                        return "stream on \(playing.name) ended: \(reason)"
                    case .contextFailed(let reason):
                        return "lost the connection to the server: \(reason)"
                    case .contextReady, .streamReady, .sinkChanged, .sinkRemoved:
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
