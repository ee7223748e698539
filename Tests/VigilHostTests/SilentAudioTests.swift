import Foundation
import Testing
import VigilHost
import VigilKit

/// silent-audio against a real user-mode PulseAudio with a null sink, one
/// server per test in its own runtime directory. Serialized: each test
/// records real audio in real time.
@Suite(.serialized) struct SilentAudioTests {
    /// The strategy's stream is listed while it runs and gone after; the
    /// sink stays RUNNING past the suspend-on-idle timeout with it, and
    /// suspends without it. The lease shows the sink, the signal and its
    /// state.
    @Test func keepsTheSinkRunningAndLetsItSuspendWhenStopped() async throws {
        let pulse = try await PulseServer(suspendAfter: 1)
        // Without a stream, the idle sink suspends after its 1 s timeout.
        try await eventually("nullsink suspends while idle") { pulse.sinkState == "SUSPENDED" }
        let h = try await AudioHarness()
        try await h.start(["server": .string(pulse.address), "sink": .string("nullsink")])
        try await h.waitFor(.acquired)
        try await eventually("nullsink runs") { pulse.sinkState == "RUNNING" }
        let inputs = pulse.sinkInputs
        #expect(inputs.contains("Vigil keepalive (fluctuate)"), "\(inputs)")
        #expect(inputs.contains("application.name = \"Vigil\""), "\(inputs)")
        // Three idle timeouts later it still runs: the stream keeps it awake.
        try await Task.sleep(for: .seconds(3))
        #expect(pulse.sinkState == "RUNNING")
        try await eventually("the lease reports RUNNING") { await h.activeStatus()["State"] == .string("RUNNING") }
        let status = await h.activeStatus()
        #expect(status["Sink"] == .string("nullsink"))
        #expect(status["Signal"] == .string("fluctuate"))
        #expect(status["Stream"] == .string("playing"))
        #expect(status["Underruns"] == .uint(0))
        #expect(status["Format"] == .string("s16le 2ch 48000Hz"))
        #expect(status["Server"].map { "\($0)".contains("pulseaudio") && "\($0)".contains(pulse.dir) } == true, "\(status)")
        let lease = try #require(await h.registry.active.first)
        #expect(lease.holds == "audio stream on nullsink")

        await h.supervisor.stopAll()
        #expect(!pulse.sinkInputs.contains("Vigil"), "the stream outlived the strategy")
        #expect(await h.registry.active.isEmpty)
        try await eventually("nullsink suspends once the strategy stopped") { pulse.sinkState == "SUSPENDED" }
    }

    /// What the sink plays, recorded from its monitor.
    @Test(arguments: [
        ("zero", [:]),
        ("fluctuate", [:]),
        ("sine", ["frequency_hz": .integer(1000), "amplitude": .string("-20dBFS")]),
        ("sine", ["frequency_hz": .float(437.5), "amplitude": .string("5%"), "format": .string("float32le")]),
        ("sine", ["frequency_hz": .integer(60), "amplitude": .string("-40 dBFS"), "format": .string("s32le"), "channels": .integer(1)]),
    ] as [(String, [String: ConfigValue])])
    func recordingShowsTheConfiguredSignal(signal: String, options: [String: ConfigValue]) async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        var values: [String: ConfigValue] = ["server": .string(pulse.address), "signal": .string(signal), "latency": .string("200ms")]
        values.merge(options) { $1 }
        let recording = try pulse.startRecording()
        try await h.start(values)
        try await h.waitFor(.acquired)
        let steady: [Int16]
        if signal == "zero" {
            // Nothing to find: a second recorded once the stream plays.
            try await eventually("nullsink runs") { pulse.sinkState == "RUNNING" }
            _ = try recording.stop()
            steady = try await pulse.startRecording().frames(pulse.sinkRate)
        } else {
            // Two seconds of signal, from its first sample on.
            steady = try await recording.signalFrames(2 * pulse.sinkRate)
        }
        await h.supervisor.stopAll()
        switch signal {
        case "zero":
            #expect(SignalMeasure.peak(steady) == 0)
        case "fluctuate":
            #expect(SignalMeasure.peak(steady) == 1)
            // Every frame is ±1, alternating: no zeros, where the stream
            // ran unbroken (see below), for at least half a second.
            let left = SignalMeasure.longestUnbroken(SignalMeasure.leftChannel(steady), dropout: 4)
            #expect(left.count >= pulse.sinkRate / 2, "no half second without a dropout in \(steady.count / 2) frames")
            #expect(left.filter { $0 == 0 }.count < left.count / 100, "\(left.prefix(20))")
        default:
            let frequency = options["frequency_hz"].flatMap { v -> Double? in
                switch v { case .integer(let i): Double(i); case .float(let f): f; default: nil }
            } ?? 0
            let amplitude: Double = switch options["amplitude"] {
            case .string("-20dBFS")?: 0.1
            case .string("5%")?: 0.05
            default: 0.01
            }
            // Measured where the stream ran unbroken: on a loaded machine
            // an underrun leaves a gap of silence, which spreads energy
            // over every frequency without saying anything of the signal.
            // At least half a second of it, or the stream itself is broken.
            let x = SignalMeasure.longestUnbroken(SignalMeasure.leftChannel(steady))
            #expect(x.count >= pulse.sinkRate / 2, "no half second without a dropout in \(steady.count / 2) frames")
            let measured = SignalMeasure.zeroCrossingFrequency(x, rate: pulse.sinkRate)
            #expect(abs(measured - frequency) < frequency * 0.002, "measured \(measured) Hz, configured \(frequency) Hz")
            let share = SignalMeasure.energyShare(x, at: frequency, rate: pulse.sinkRate)
            #expect(share > 0.95, "only \(share) of the energy at \(frequency) Hz")
            // Peak amplitude from RMS (a sine's peak is √2 × RMS), in dB.
            let peak = SignalMeasure.rms(x) * 2.squareRoot() / 32_768
            let errorDB = 20 * log10(peak / amplitude)
            #expect(abs(errorDB) < 0.5, "amplitude off by \(errorDB) dB (measured peak \(peak), configured \(amplitude))")
        }
    }

    /// Kill PulseAudio and start it again: the lease is released when the
    /// server dies, and a new one is held once the strategy has reconnected,
    /// within its backoff. The history shows the gap.
    @Test func reconnectsAfterTheServerRestarts() async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        try await h.start([
            "server": .string(pulse.address), "latency": .string("200ms"),
            "reconnect_initial": .string("200ms"), "reconnect_max": .string("5s"),
        ])
        try await h.waitFor(.acquired)
        pulse.kill()
        try await h.waitFor(.released)
        let restarted = h.clock.now
        try await pulse.start()
        try await h.waitFor(.acquired, count: 2)
        let history = h.history.filter { $0.kind != .status }
        #expect(history.map(\.kind) == [.acquired, .released, .acquired], "\(history.map(\.kind))")
        let second = try #require(history.last)
        // Attempts come at most 200ms, 400ms, 800ms... apart: well within
        // 5 s of the server's return (plus the server's own start).
        #expect(second.at - restarted < .seconds(5), "reconnected \(second.at - restarted) after the restart")
        #expect(second.lease.id != history[0].lease.id)
        #expect(h.events.all.contains { $0.name == "audio-lost" && ($0.fields["reason"] ?? "").contains("connection") })
        try await eventually("the new stream is listed") { pulse.sinkInputs.contains("Vigil keepalive") }
        await h.supervisor.stopAll()
    }

    /// `pacmd kill-sink-input`: the stream is recreated under a new lease.
    @Test func killedStreamIsRecreated() async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        try await h.start(["server": .string(pulse.address), "latency": .string("200ms"), "reconnect_initial": .string("100ms")])
        try await h.waitFor(.acquired)
        let list = try pulse.pactl(["list", "short", "sink-inputs"]).stdout
        let index = try #require(list.split(whereSeparator: { $0.isWhitespace }).first.map(String.init), "\(list)")
        let kill = try pulse.pacmd(["kill-sink-input", index])
        #expect(kill.status == 0, "pacmd kill-sink-input \(index): \(kill.stderr) (list: \(list))")
        try await h.waitFor(.acquired, count: 2)
        #expect(h.history.filter { $0.kind != .status }.map(\.kind) == [.acquired, .released, .acquired])
        #expect(pulse.sinkInputs.contains("Vigil keepalive"))
        await h.supervisor.stopAll()
    }

    /// A named sink unloaded and loaded again: its stream is back within
    /// 2 s of the load, though the reconnect backoff starts at 10 s; the
    /// return comes from the server's sink events, not from a timer.
    @Test func sinkThatComesBackGetsItsStreamAtOnce() async throws {
        try await checkSinkComesBack(try await PulseServer())
    }

    /// `sink = "@DEFAULT_SINK@"`: the stream follows `pactl set-default-sink`,
    /// also after it was moved by hand, when PulseAudio itself no longer
    /// moves it. One lease throughout: the stream moves, it is not recreated.
    @Test func followsTheDefaultSink() async throws {
        let pulse = try await PulseServer()
        try pulse.loadNullSink("other")
        let nullsink = try #require(try pulse.sinkIndex("nullsink"))
        let other = try #require(try pulse.sinkIndex("other"))
        try pulse.pactlChecked(["set-default-sink", "nullsink"])
        let h = try await AudioHarness()
        try await h.start(["server": .string(pulse.address), "sink": .string("@DEFAULT_SINK@"), "latency": .string("200ms")])
        try await h.waitFor(.acquired)
        try await eventually("the lease shows nullsink") { await h.activeStatus()["Sink"] == .string("nullsink") }
        let stream = try #require(try pulse.streams().first)
        #expect(stream.sink == nullsink)

        // By hand (pavucontrol, or stream-restore's memory): the stream now
        // prefers `other`, and PulseAudio leaves it there when the default changes.
        try pulse.pactlChecked(["move-sink-input", stream.index, "other"])
        try await eventually("the lease shows the move") { await h.activeStatus()["Sink"] == .string("other") }
        try pulse.pactlChecked(["set-default-sink", "other"])
        try pulse.pactlChecked(["set-default-sink", "nullsink"])
        try await eventually("the stream follows the default to nullsink") { try pulse.streams().map(\.sink) == [nullsink] }
        try await eventually("the lease shows nullsink") { await h.activeStatus()["Sink"] == .string("nullsink") }
        try pulse.pactlChecked(["set-default-sink", "other"])
        try await eventually("the stream follows the default to other") { try pulse.streams().map(\.sink) == [other] }
        try await eventually("other runs") { try pulse.shortList("sinks").first { $0[1] == "other" }?.last == "RUNNING" }
        #expect(h.history.filter { $0.kind != .status }.map(\.kind) == [.acquired])
        #expect(h.logs.entries.contains { $0.contains("the default sink is now nullsink; moving the stream there") }, "\(h.logs.entries)")
        await h.supervisor.stopAll()
    }

    /// `stop_before_sleep`: before the system sleeps (logind's
    /// PrepareForSleep, from the logind stand-in), the stream is closed and
    /// its lease released under a delay lock, which lets the sleep go on at
    /// once; after resume the stream plays again under a new lease.
    @Test func stopsTheStreamBeforeTheSystemSleeps() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let observer = try await standIn.bus.connect()
        let pulse = try await PulseServer()
        let h = try await AudioHarness(backend: LogindPowerBackend(connection: host))
        try await h.start([
            "server": .string(pulse.address), "sink": .string("nullsink"), "latency": .string("200ms"),
            "stop_before_sleep": .boolean(true),
        ])
        try await h.waitFor(.acquired)
        // The strategy's delay lock (the stream's lease holds nothing on the system).
        #expect(try await standIn.waitForCount(observer, 1))
        let lock = "\(try await standIn.inhibitors(observer))"
        #expect(lock.contains("Vigil keepalive") && lock.contains("delay"), "\(lock)")

        let reply = try await standIn.call(observer, "SimulateSleep", [.uint64(10_000_000)], test: true)
        #expect(try reply.argument(1, as: Bool.self) == false, "the sleep waited for logind's maximum delay")
        // The lock was let go only once the stream had stopped: the strategy
        // records audio-sleep after its lease was released and before it
        // lets go of the lock, so the event is there when the sleep went on.
        #expect(h.events.all.contains { $0.name == "audio-sleep" }, "\(h.events.all)")
        try await h.waitFor(.released)
        try await h.waitFor(.acquired, count: 2)
        #expect(h.history.filter { $0.kind != .status }.map(\.kind) == [.acquired, .released, .acquired])
        try await eventually("the stream plays again") { pulse.sinkInputs.contains("Vigil keepalive") }
        // Ready for the next sleep.
        #expect(try await standIn.waitForCount(observer, 1))
        await h.supervisor.stopAll()
    }

    /// Without logind, `stop_before_sleep` says why it cannot work and the
    /// stream plays anyway.
    @Test func stopBeforeSleepWithoutLogindSaysWhy() async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        try await h.start(["server": .string(pulse.address), "latency": .string("200ms"), "stop_before_sleep": .boolean(true)])
        try await h.waitFor(.acquired)
        #expect(h.logs.entries.contains {
            $0.contains("stop_before_sleep: the power backend is none, which does not announce system sleep (only logind does); the stream plays on through system sleep")
        }, "\(h.logs.entries)")
        #expect(pulse.sinkInputs.contains("Vigil keepalive"))
        await h.supervisor.stopAll()
    }

    @Test func defaultSinkNameIsAccepted() throws {
        #expect(try SilentAudioPlugin.problems(["sink": .string("@DEFAULT_SINK@")]).isEmpty)
        let empty = try SilentAudioPlugin.problems(["sink": .string("")])
        #expect(empty.contains { $0.contains("or \"@DEFAULT_SINK@\" for the default sink") }, "\(empty)")
    }

    /// `play = "periodic"`: bursts of `for`, every `every`, faded in.
    @Test func periodicModePlaysForEvery() async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        let recording = try pulse.startRecording()
        try await h.start([
            "server": .string(pulse.address), "latency": .string("100ms"), "signal": .string("sine"),
            "frequency_hz": .integer(1000), "amplitude": .string("-20dBFS"),
            "play": .string("periodic"), "every": .string("1500ms"), "for": .string("500ms"), "fade": .string("100ms"),
        ])
        try await h.waitFor(.acquired)
        // parec may start in the middle of the first burst: record three
        // more periods and measure from the second burst on.
        let samples = try await recording.signalFrames(pulse.sinkRate * 5)
        await h.supervisor.stopAll()
        let all = SignalMeasure.leftChannel(samples)
        // A dropout of up to 100 ms inside a burst (an underrun while the
        // whole suite loads both cores) does not split it: the bursts are a
        // second of quiet apart.
        let second = try #require(SignalMeasure.bursts(all, rate: pulse.sinkRate, threshold: 100, bridging: 0.1).dropFirst().first)
        // From 10 ms before the second burst's first loud window.
        let x = Array(all[max(0, Int((second.start - 0.01) * Double(pulse.sinkRate)))...])
        let bursts = SignalMeasure.bursts(x, rate: pulse.sinkRate, threshold: 100, bridging: 0.1)
        #expect(bursts.count >= 2, "\(bursts)")
        // A loaded machine (the whole suite on 2 cores) can delay a cork or
        // an uncork: every burst and period must be roughly right, and the
        // best of them exactly so (a broken `for` or `every` fails both).
        let lengths = bursts.dropLast().map(\.length)
        let periods = zip(bursts, bursts.dropFirst()).map { $1.start - $0.start }
        #expect(lengths.allSatisfy { abs($0 - 0.5) <= 0.4 } && lengths.contains { abs($0 - 0.5) <= 0.06 }, "burst lengths \(lengths): \(bursts)")
        #expect(periods.allSatisfy { abs($0 - 1.5) <= 0.6 } && periods.contains { abs($0 - 1.5) <= 0.25 }, "periods \(periods): \(bursts)")
        // Faded in: the first 10 ms are much quieter than the middle. Read
        // on the burst nearest its 500 ms (a stress run met a burst cut
        // short by a late cork, whose middle was already silence).
        let best = try #require(bursts.dropLast().min { abs($0.length - 0.5) < abs($1.length - 0.5) })
        let from = max(0, Int((best.start - 0.01) * Double(pulse.sinkRate)))
        let onset = x[from...].firstIndex { $0 != 0 } ?? from
        let first = SignalMeasure.rms(x[onset..<(onset + pulse.sinkRate / 100)])
        let middle = SignalMeasure.rms(x[(onset + pulse.sinkRate / 4)..<(onset + pulse.sinkRate / 4 + pulse.sinkRate / 100)])
        #expect(first < middle / 4, "fade-in: first 10 ms at \(first), middle at \(middle), burst \(best)")
    }

    /// Bad input is refused with a clear message: in the config (amplitude,
    /// frequency, noise colour, periodic timings) before anything runs, and
    /// at run time (unknown sink, no server) as the strategy's LastError,
    /// while the host carries on.
    @Test func badConfigIsRefusedClearly() throws {
        let text = try SilentAudioPlugin.problems([
            "signal": .string("sine"), "amplitude": .string("+3dBFS"), "frequency_hz": .integer(30_000), "rate": .integer(48_000),
        ]).joined(separator: "\n")
        #expect(text.contains("strategy[0].amplitude: +3dBFS is above 0 dBFS (full scale)"), "\(text)")
        #expect(text.contains("strategy[0].frequency_hz: 30000 Hz is not below half the sample rate (48000 Hz / 2 = 24000 Hz)"), "\(text)")
        let noise = try SilentAudioPlugin.problems(["signal": .string("noise"), "noise": .string("pinc"), "amplitude": .string("150%")])
        #expect(noise.contains { $0.contains("strategy[0].noise: expected one of \"white\", \"pink\", \"brown\", found \"pinc\" (did you mean \"pink\"?)") }, "\(noise)")
        #expect(noise.contains { $0.contains("strategy[0].amplitude: expected a percentage above 0% and at most 100%") }, "\(noise)")
        let periodic = try SilentAudioPlugin.problems(["play": .string("periodic"), "every": .string("1s"), "for": .string("2s")])
        #expect(periodic.contains { $0.contains("strategy[0].for: must be shorter than every (1s)") }, "\(periodic)")
        let misplaced = try SilentAudioPlugin.problems(["signal": .string("zero"), "frequency_hz": .integer(50)])
        #expect(misplaced.contains { $0.contains("strategy[0].frequency_hz: only applies to signal = \"sine\"") }, "\(misplaced)")
        let signal = try SilentAudioPlugin.problems(["signal": .string("silence")])
        #expect(signal.contains { $0.contains("strategy[0].signal: expected one of \"zero\", \"fluctuate\", \"sine\", \"noise\"") }, "\(signal)")
    }

    @Test func unknownSinkFailsWithTheAvailableSinks() async throws {
        let pulse = try await PulseServer()
        let h = try await AudioHarness()
        try await h.start(["server": .string(pulse.address), "sink": .string("hdmi-out")])
        let failed = try await h.waitForFailure()
        #expect(failed.lastError == "unknown sink \"hdmi-out\"; available sinks: nullsink")
        #expect(h.logs.entries.contains { $0.contains("failed: unknown sink \"hdmi-out\"") })
        #expect(await h.registry.active.isEmpty)
        await h.supervisor.stopAll()
    }

    @Test func missingServerFailsClearly() async throws {
        let h = try await AudioHarness()
        try await h.start(["server": .string("unix:/nonexistent/pulse/native")])
        let failed = try await h.waitForFailure()
        #expect(failed.lastError == "no PulseAudio server at unix:/nonexistent/pulse/native: Connection refused", "\(failed.lastError ?? "")")
        #expect(failed.state == .backoff)
        await h.supervisor.stopAll()
    }
}
