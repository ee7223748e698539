import Foundation
import VigilTestSupport
import Testing
import VigilHost

/// vigild with a silent-audio strategy on a private bus, against a real
/// user-mode PulseAudio: the stream's lease and its live Status on D-Bus.
extension EndToEnd {
    @Suite(.serialized) struct SilentAudioEndToEndTests {
        @Test func leaseAndItsStatusAreOnTheBus() async throws {
            let pulse = try await UserPulseAudio()
            defer { pulse.stop() }
            try await BusHost.with(strategies: """
                [[strategy]]
                name = "speaker"
                kind = "silent-audio"
                server = "\(pulse.address)"
                sink = "nullsink"
                signal = "sine"
                frequency_hz = 30
                amplitude = "-60dBFS"
                """) { host in
                let path = try await host.leasePath(strategy: "speaker")
                // The sink's state reaches the lease from server events.
                var property = ""
                for _ in 0..<200 {
                    property = try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Lease", "Status"]).stdout
                    if property.contains("\"State\" s \"RUNNING\"") { break }
                    try await Task.sleep(for: .milliseconds(100))
                }
                #expect(property.hasPrefix("a{sv} "), "\(property)")
                for pair in ["\"Sink\" s \"nullsink\"", "\"Signal\" s \"sine 30 Hz at -60 dBFS\"", "\"State\" s \"RUNNING\"", "\"Stream\" s \"playing\"", "\"Underruns\" t 0"] {
                    #expect(property.contains(pair), "Status lacks \(pair): \(property)")
                }
                let holds = try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Lease", "Holds"]).stdout
                #expect(holds == "s \"audio stream on nullsink\"\n", "\(holds)")
                let leases = try host.vigilctl("leases")
                #expect(leases.stdout.contains("audio stream on nullsink") && leases.stdout.contains("RUNNING"), "\(leases.stdout)")
                let inputs = try pulse.pactl(["list", "sink-inputs"]).stdout
                #expect(inputs.contains("Vigil speaker (sine 30 Hz at -60 dBFS)"), "\(inputs)")
            }
            // vigild stopped cleanly: its stream is gone.
            let after = try pulse.pactl(["list", "sink-inputs"]).stdout
            #expect(!after.contains("Vigil speaker"), "\(after)")
        }
    }
}

/// A user-mode PulseAudio with a null sink in a private runtime directory.
/// Started with `spawnQuietly` (VigilTestSupport), not Foundation's `Process`.
final class UserPulseAudio: Sendable {
    let dir: TempDir
    let pid: pid_t
    var address: String { "unix:\(dir.path)/pulse/native" }
    var environment: [String: String] {
        ["XDG_RUNTIME_DIR": dir.path, "HOME": dir.path, "PATH": "/usr/bin:/bin", "PULSE_SERVER": address]
    }

    init() async throws {
        dir = try TempDir("vigil-e2e-pulse")
        let arguments = [
            "/usr/bin/pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--system=false",
            "-L", "module-native-protocol-unix auth-anonymous=1",
            "-L", "module-null-sink sink_name=nullsink rate=48000",
        ]
        pid = try spawnQuietly(arguments[0], Array(arguments.dropFirst()),
                               environment: ["XDG_RUNTIME_DIR": dir.path, "HOME": dir.path, "PATH": "/usr/bin:/bin"])
        // Ready when a client lists the null sink (the server announces nothing).
        for _ in 0..<200 {
            if (try? pactl(["list", "short", "sinks"]))?.stdout.contains("nullsink") == true { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        stop()
        throw DaemonError("pulseaudio in \(dir.path) did not list nullsink within 10 s")
    }

    func pactl(_ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/bin/pactl", arguments, environment: environment)
    }

    /// SIGKILL and reap; safe to call twice (the pid is then gone).
    func stop() {
        kill(pid, SIGKILL)
        var status: Int32 = 0
        _ = waitpid(pid, &status, 0)
    }
}
