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
            // One second of signal, from its first sample on.
            steady = try await recording.signalFrames(pulse.sinkRate)
        }
        await h.supervisor.stopAll()
        switch signal {
        case "zero":
            #expect(SignalMeasure.peak(steady) == 0)
        case "fluctuate":
            #expect(SignalMeasure.peak(steady) == 1)
            // Every frame is ±1, alternating: no run of zeros.
            let left = SignalMeasure.leftChannel(steady)
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
            let x = SignalMeasure.leftChannel(steady)[...]
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
}
