import Foundation
import Testing
import VigilHost
import VigilKit

/// silent-audio against PipeWire with pipewire-pulse and WirePlumber, as a
/// desktop runs them, started by the test without systemd. Checked as the
/// PulseAudio tests check: the stream is listed, the sink runs, and its
/// monitor records the ±1 LSB signal.
@Suite(.serialized) struct SilentAudioPipeWireTests {
    @Test func playsOnPipeWirePulse() async throws {
        let server = try await PipeWireServer()
        defer { server.stop() }
        // WirePlumber suspends the idle null sink (after 5 s); nothing plays yet.
        let recording = try server.startRecording()
        let h = try await AudioHarness()
        try await h.start(["server": .string(server.address), "sink": .string("nullsink"), "latency": .string("200ms")])
        try await h.waitFor(.acquired)
        let inputs = server.sinkInputs
        #expect(inputs.contains("Vigil keepalive (fluctuate)"), "\(inputs)")
        #expect(inputs.contains("application.name = \"Vigil\""), "\(inputs)")
        try await eventually("nullsink runs") { server.sinkState == "RUNNING" }
        let status = await h.activeStatus()
        #expect(status["Server"].map { "\($0)".contains("on PipeWire") } == true, "\(status)")
        #expect(status["Sink"] == .string("nullsink"))
        try await eventually("the lease reports RUNNING") { await h.activeStatus()["State"] == .string("RUNNING") }

        // One second of signal: every sample ±1 LSB, alternating.
        let steady = try await recording.signalFrames(server.sinkRate)
        #expect(SignalMeasure.peak(steady) == 1, "peak \(SignalMeasure.peak(steady))")
        let left = SignalMeasure.leftChannel(steady)
        #expect(left.filter { $0 == 0 }.count < left.count / 100, "\(left.prefix(20))")

        // Past WirePlumber's 5 s suspend timeout the sink still runs.
        try await Task.sleep(for: .seconds(6))
        #expect(server.sinkState == "RUNNING")

        await h.supervisor.stopAll()
        #expect(!server.sinkInputs.contains("Vigil"), "the stream outlived the strategy")
        #expect(await h.registry.active.isEmpty)
    }

    /// The defect found with PipeWire: a sink that went away and came back
    /// got its stream only after the backoff. Now within 2 s of its return.
    @Test func sinkThatComesBackGetsItsStreamAtOnce() async throws {
        let server = try await PipeWireServer()
        defer { server.stop() }
        try await checkSinkComesBack(server)
    }
}
