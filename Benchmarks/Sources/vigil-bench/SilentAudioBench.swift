import Foundation
import VigilHost
import VigilTestSupport



private func stop(_ pid: pid_t, _ signal: Int32 = SIGTERM) {
    kill(pid, signal)
    var status: Int32 = 0
    _ = waitpid(pid, &status, 0)
}

/// Per thread of `pid`: CPU time in nanoseconds (schedstat) and voluntary
/// context switches (each one a wakeup after a sleep).
private func processCost(_ pid: pid_t) -> [Int: (cpuNanos: Int64, voluntary: Int)] {
    let dir = "/proc/\(pid)/task"
    let threads = sampleThreads(pid: pid)
    var out: [Int: (Int64, Int)] = [:]
    for (tid, sample) in threads {
        let s = (try? String(contentsOfFile: "\(dir)/\(tid)/schedstat", encoding: .utf8)) ?? ""
        out[tid] = (s.split(separator: " ").first.flatMap { Int64($0) } ?? 0, sample.voluntary)
    }
    return out
}

/// CPU time (schedstat, ns) and voluntary switches of the threads of `pid`
/// named `name` (all of them when nil): the plugin's `vigil-audio` thread
/// (its `pa_mainloop`) is the thread that streams.
func threadCost(_ pid: pid_t, named name: String? = nil) -> (cpuNanos: Int64, voluntary: Int) {
    let dir = "/proc/\(pid)/task"
    var cpu: Int64 = 0, voluntary = 0
    for (tid, sample) in sampleThreads(pid: pid) {
        if let name {
            let comm = (try? String(contentsOfFile: "\(dir)/\(tid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            guard comm == name else { continue }
        }
        let s = (try? String(contentsOfFile: "\(dir)/\(tid)/schedstat", encoding: .utf8)) ?? ""
        cpu += s.split(separator: " ").first.flatMap { Int64($0) } ?? 0
        voluntary += sample.voluntary
    }
    return (cpu, voluntary)
}

/// Growth between two samples: threads that ended in between are not
/// counted (their last figures are gone), new threads count in full.
private func costDelta(_ before: [Int: (cpuNanos: Int64, voluntary: Int)], _ after: [Int: (cpuNanos: Int64, voluntary: Int)]) -> (Int64, Int) {
    var cpu: Int64 = 0, voluntary = 0
    for (tid, a) in after {
        let b = before[tid] ?? (0, 0)
        cpu += a.cpuNanos - b.cpuNanos
        voluntary += a.voluntary - b.voluntary
    }
    return (cpu, voluntary)
}

/// vigil-bench silent-audio [seconds per signal]: for each signal, vigild
/// with one silent-audio instance at the default buffer (2 s) on a null sink
/// of a private user-mode PulseAudio, measured side by side with the
/// references: `pacat` streaming /dev/zero with the same buffer and sample
/// format to the same sink (A), and the same with the plugin's request size
/// too (B). Prints CPU time per hour of streaming
/// (measured over the window and scaled up) and wakeups per second.
/// Default 30 s per signal (2 minutes in all).
func silentAudioBench(_ args: [String]) async throws {
    // The name PulseLoop gives its thread (Plugins/SilentAudio/PulseLoop.swift).
    let audioThreadName = "vigil-audio"
    let seconds = args.first.flatMap(Double.init) ?? 30
    let bin = try hostBuildDirectory()
    var template = Array("/tmp/vigil-audio-bench-XXXXXX".utf8CString)
    guard let dirPointer = mkdtemp(&template) else { throw BenchError("mkdtemp failed") }
    let dir = String(cString: dirPointer)
    defer { try? FileManager.default.removeItem(atPath: dir) }
    let server = "unix:\(dir)/pulse/native"
    let env = ["XDG_RUNTIME_DIR": dir, "HOME": dir, "PATH": "/usr/bin:/bin", "PULSE_SERVER": server]

    let pulse = try spawnQuietly("/usr/bin/pulseaudio", [
        "-n", "--daemonize=no", "--exit-idle-time=-1", "--system=false",
        "-L", "module-native-protocol-unix auth-anonymous=1",
        "-L", "module-null-sink sink_name=nullsink rate=48000 format=s16le channels=2",
    ], environment: env.filter { $0.key != "PULSE_SERVER" })
    defer { stop(pulse, SIGKILL) }
    var ready = false
    for _ in 0..<100 where !ready {
        try await Task.sleep(for: .milliseconds(100))
        ready = FileManager.default.fileExists(atPath: "\(dir)/pulse/native")
    }
    guard ready else { throw BenchError("pulseaudio did not start in \(dir)") }
    try await Task.sleep(for: .milliseconds(500))

    let signals: [(String, String)] = [
        ("zero", "signal = \"zero\""),
        ("fluctuate", "signal = \"fluctuate\""),
        ("sine 20 Hz", "signal = \"sine\"\nfrequency_hz = 20\namplitude = \"-60dBFS\""),
        ("pink noise", "signal = \"noise\"\nnoise = \"pink\"\namplitude = \"-60dBFS\""),
    ]
    print("silent-audio: \(Int(seconds)) s per signal, default buffer 2s (request size 1s), s16le 2ch 48000 Hz on a null sink")
    print("references, same sink and format, measured in the same windows, streaming /dev/zero:")
    print("  pacat A: pacat --raw --latency-msec=2000 /dev/zero (the same buffer, pacat's own request size)")
    print("  pacat B: pacat --raw --latency-msec=2000 --process-time-msec=1000 /dev/zero (the same buffer and request size)\n")
    print("              whole vigild       its audio thread      pacat A               pacat B               audio thread / pacat")
    print("signal        CPU s/h  wakes/s   CPU s/h  wakes/s      CPU s/h  wakes/s      CPU s/h  wakes/s       A       B")
    for (label, options) in signals {
        let config = """
        [host]
        state_dir = "\(dir)/state-\(label.filter(\.isLetter))"
        survival_interval = "60s"

        [[strategy]]
        name = "keepalive"
        kind = "silent-audio"
        server = "\(server)"
        sink = "nullsink"
        \(options)
        """
        let configPath = "\(dir)/vigil.toml"
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
        let host = try spawnQuietly(bin.appendingPathComponent("vigild").path, ["--config", configPath, "--log-level", "warning"], environment: env)
        let pacatArguments = ["--raw", "-d", "nullsink", "--format=s16le", "--rate=48000", "--channels=2", "--latency-msec=2000"]
        let stockPacat = try spawnQuietly("/usr/bin/pacat", pacatArguments + ["/dev/zero"], environment: env)
        let pacat = try spawnQuietly("/usr/bin/pacat", pacatArguments + ["--process-time-msec=1000", "/dev/zero"], environment: env)
        // Start-up (plugin load, connection, first buffer) is not streaming.
        try await Task.sleep(for: .seconds(3))
        let hostBefore = processCost(host), pacatBefore = processCost(pacat), audioBefore = threadCost(host, named: audioThreadName)
        let stockBefore = processCost(stockPacat)
        let start = ContinuousClock.now
        try await Task.sleep(for: .seconds(seconds))
        let hostAfter = processCost(host), pacatAfter = processCost(pacat), audioAfter = threadCost(host, named: audioThreadName)
        let stockAfter = processCost(stockPacat)
        let window = (ContinuousClock.now - start).seconds
        stop(host)
        stop(pacat)
        stop(stockPacat)
        func perHour(_ a: [Int: (cpuNanos: Int64, voluntary: Int)], _ b: [Int: (cpuNanos: Int64, voluntary: Int)]) -> (Double, Double) {
            let (cpu, voluntary) = costDelta(a, b)
            return (Double(cpu) / 1e9 / window * 3600, Double(voluntary) / window)
        }
        let (hostCPU, hostWakes) = perHour(hostBefore, hostAfter)
        let (pacatCPU, pacatWakes) = perHour(pacatBefore, pacatAfter)
        let (stockCPU, stockWakes) = perHour(stockBefore, stockAfter)
        let audioCPU = Double(audioAfter.cpuNanos - audioBefore.cpuNanos) / 1e9 / window * 3600
        let audioWakes = Double(audioAfter.voluntary - audioBefore.voluntary) / window
        print(label.padding(toLength: 14, withPad: " ", startingAt: 0)
              + String(format: "%7.2f %8.2f %9.2f %8.2f %12.2f %8.2f %12.2f %8.2f %9.2f %7.2f", hostCPU, hostWakes, audioCPU, audioWakes,
                       stockCPU, stockWakes, pacatCPU, pacatWakes,
                       stockCPU > 0 ? audioCPU / stockCPU : .infinity, pacatCPU > 0 ? audioCPU / pacatCPU : .infinity))
    }
    print("\nwhole vigild: every thread of the host (its heartbeat every 60 s and start-up leftovers included);")
    print("audio thread: the silent-audio plugin's \(audioThreadName) thread (a plain pa_mainloop), which does all the streaming: the figure compared with pacat.")
    print("A is the issue's reference (pacat with the same buffer); B also copies the plugin's request size (1 s), the stricter comparison.")
}
