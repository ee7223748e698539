import Foundation
import VigilTestSupport
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// The real silent-audio plugin, loaded from the build directory.
enum SilentAudioPlugin {
    static func kind() throws -> any StrategyKind {
        try PeriodicWakePlugin.loader.loadKind("silent-audio").get()
    }

    static func problems(_ values: [String: ConfigValue]) throws -> [String] {
        let reader = ConfigReader(strategyName: "audio", keyPath: "strategy[0]", values: values)
        _ = try kind().makeStrategy(reader)
        return reader.problems.map(\.description)
    }

    static func make(_ values: [String: ConfigValue]) throws -> any KeepAliveStrategy {
        let reader = ConfigReader(strategyName: "audio", keyPath: "strategy[0]", values: values)
        let s = try kind().makeStrategy(reader)
        guard reader.problems.isEmpty else { throw DescribedError("config problems: \(reader.problems)") }
        return s
    }
}

/// Starts a program with posix_spawn, output to /dev/null. Not Foundation's
/// `Process`: it takes a child that closes its inherited descriptors (as
/// pulseaudio does at start) for exited, and then blocks in waitpid on it,
/// which stalls every other `Process` of the test run.
/// Polls `condition` every 50 ms until it holds. For an outside process's
/// state that announces nothing (a server's readiness, a sink's state);
/// `timeout` only bounds a broken run.
func eventually(_ what: String, timeout: Duration = .seconds(20), _ condition: () async throws -> Bool) async throws {
    let clock = ContinuousClock()
    let end = clock.now + timeout
    while clock.now < end {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw DescribedError("timed out after \(timeout) waiting for: \(what)")
}

/// A user-mode PulseAudio with one null sink (`nullsink`), in a private
/// runtime directory, killed with SIGKILL when the value goes away.
final class PulseServer: PulseTools, Sendable {
    private let pid = Lock<pid_t?>(nil)
    let dir: String
    let sinkRate: Int
    let suspendAfter: Int?

    var address: String { "unix:\(dir)/pulse/native" }

    /// The environment for pulseaudio and its clients (pactl, parec).
    var environment: [String: String] {
        ["XDG_RUNTIME_DIR": dir, "HOME": dir, "PATH": "/usr/bin:/bin", "PULSE_SERVER": address]
    }

    /// `suspendAfter`: load module-suspend-on-idle with that timeout (seconds).
    init(suspendAfter: Int? = nil, sinkRate: Int = 48_000) async throws {
        var template = Array("/tmp/vigil-pulse-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { throw POSIXError(.EIO) }
        dir = String(cString: p)
        self.sinkRate = sinkRate
        self.suspendAfter = suspendAfter
        try await start()
    }

    func start() async throws {
        var arguments = [
            "-n", "--daemonize=no", "--exit-idle-time=-1", "--system=false", "--log-target=stderr",
            "-L", "module-native-protocol-unix auth-anonymous=1",
            // For pacmd (kill-sink-input, which pactl lacks).
            "-L", "module-cli-protocol-unix",
            "-L", "module-null-sink sink_name=nullsink rate=\(sinkRate)",
            "-L", "module-always-sink",
        ]
        if let suspendAfter { arguments += ["-L", "module-suspend-on-idle timeout=\(suspendAfter)"] }
        var env = environment
        env["PULSE_SERVER"] = nil
        let pid = try spawnQuietly("/usr/bin/pulseaudio", arguments, environment: env)
        self.pid.withLock { $0 = pid }
        try await eventually("PulseAudio in \(dir) lists nullsink") { sinkLine != nil }
    }

    /// SIGKILL, as a crash would.
    func kill() {
        let pid: pid_t? = self.pid.withLock { running in defer { running = nil }; return running }
        if let pid { killAndReap(pid) }
    }

    deinit {
        kill()
        try? FileManager.default.removeItem(atPath: dir)
    }

    func pacmd(_ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/bin/pacmd", arguments, environment: environment)
    }
}

/// A pulse server (PulseAudio, or PipeWire's pipewire-pulse) with a null
/// sink named `nullsink`, driven with the PulseAudio tools.
protocol PulseTools: AnyObject {
    /// The server's private runtime directory.
    var dir: String { get }
    /// Its libpulse server string.
    var address: String { get }
    var sinkRate: Int { get }
    /// The environment for the server's clients (pactl, parec).
    var environment: [String: String] { get }
}

extension PulseTools {
    func pactl(_ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/bin/pactl", arguments, environment: environment)
    }

    /// `nullsink`'s line of `pactl list short sinks`.
    var sinkLine: String? {
        (try? pactl(["list", "short", "sinks"]))?.stdout.split(separator: "\n").map(String.init).first { $0.contains("\tnullsink\t") }
    }

    /// RUNNING, IDLE or SUSPENDED.
    var sinkState: String? { sinkLine?.split(separator: "\t").last.map(String.init) }

    var sinkInputs: String { (try? pactl(["list", "sink-inputs"]))?.stdout ?? "" }

    /// Runs pactl and throws with its stderr when it fails.
    @discardableResult
    func pactlChecked(_ arguments: [String]) throws -> String {
        let out = try pactl(arguments)
        guard out.status == 0 else { throw DescribedError("pactl \(arguments.joined(separator: " ")): \(out.stderr)") }
        return out.stdout
    }

    /// Columns of `pactl list short <what>`, one array per line.
    func shortList(_ what: String) throws -> [[String]] {
        try pactlChecked(["list", "short", what]).split(separator: "\n").map { $0.split(separator: "\t").map(String.init) }
    }

    /// The index of sink `name`.
    func sinkIndex(_ name: String) throws -> String? {
        try shortList("sinks").first { $0.count > 1 && $0[1] == name }?[0]
    }

    /// (index, sink index) of each stream.
    func streams() throws -> [(index: String, sink: String)] {
        try shortList("sink-inputs").compactMap { $0.count > 1 ? ($0[0], $0[1]) : nil }
    }

    /// Loads a null sink named `name`; returns its module index.
    @discardableResult
    func loadNullSink(_ name: String) throws -> String {
        try pactlChecked(["load-module", "module-null-sink", "sink_name=\(name)", "rate=\(sinkRate)"]).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Unloads the module that made sink `name`.
    func unloadSink(_ name: String) throws {
        let module: String? = try shortList("modules").first { line in
            line.count > 2 && line[1] == "module-null-sink" && line[2].split(separator: " ").contains("sink_name=\(name)")
        }?[0]
        guard let module else { throw DescribedError("no module-null-sink made sink \(name)") }
        try pactlChecked(["unload-module", module])
    }

    /// Starts recording nullsink's monitor (parec takes a second or two
    /// before its first data arrives, so start it early).
    func startRecording() throws -> Recording {
        let file = "\(dir)/recording-\(UUID().uuidString).raw"
        let pid = try spawnQuietly(
            "/usr/bin/parec", ["-d", "nullsink.monitor", "--raw", "--format=s16le", "--rate=\(sinkRate)", "--channels=2", "--latency-msec=50", file],
            environment: environment, stderr: "\(dir)/parec.log")
        return Recording(pid: pid, file: file, log: "\(dir)/parec.log")
    }
}

/// PipeWire, WirePlumber and pipewire-pulse, started without systemd in a
/// private runtime directory, with a null sink `nullsink` loaded through
/// pactl. WirePlumber gets no session bus: a `main.lua.d` override turns off
/// its D-Bus device reservation and flatpak portal, without which it exits.
/// Every process is killed (and reaped) when the value goes away.
final class PipeWireServer: PulseTools, Sendable {
    private let pids = Lock<[pid_t]>([])
    let dir: String
    let sinkRate = 48_000

    var address: String { "unix:\(dir)/pulse/native" }

    var environment: [String: String] {
        ["XDG_RUNTIME_DIR": dir, "XDG_CONFIG_HOME": "\(dir)/config", "HOME": dir, "PATH": "/usr/bin:/bin", "PULSE_SERVER": address]
    }

    init() async throws {
        var template = Array("/tmp/vigil-pipewire-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { throw POSIXError(.EIO) }
        dir = String(cString: p)
        do {
            try await start()
        } catch {
            stop()
            throw error
        }
    }

    private func start() async throws {
        let overrides = "\(dir)/config/wireplumber/main.lua.d"
        try FileManager.default.createDirectory(atPath: overrides, withIntermediateDirectories: true)
        // Sorts before 90-enable-all.lua, which acts on these settings.
        try """
        alsa_monitor.properties["alsa.reserve"] = false
        default_access.properties["enable-flatpak-portal"] = false

        """.write(toFile: "\(overrides)/60-vigil-test.lua", atomically: true, encoding: .utf8)
        var env = environment
        env["PULSE_SERVER"] = nil
        try spawn("/usr/bin/pipewire", env)
        try await eventually("pipewire's socket in \(dir)") { FileManager.default.fileExists(atPath: "\(dir)/pipewire-0") }
        try spawn("/usr/bin/wireplumber", env)
        try spawn("/usr/bin/pipewire-pulse", env)
        try await eventually("pipewire-pulse answers in \(dir)") { (try? pactl(["info"]))?.stdout.contains("on PipeWire") == true }
        try loadNullSink("nullsink")
        try await eventually("PipeWire lists nullsink") { sinkLine != nil }
    }

    private func spawn(_ program: String, _ env: [String: String]) throws {
        let name = URL(fileURLWithPath: program).lastPathComponent
        let pid = try spawnQuietly(program, [], environment: env, stderr: "\(dir)/\(name).log")
        pids.withLock { $0.append(pid) }
    }

    /// The server's log files, for a failure message.
    var logs: String {
        ["pipewire", "wireplumber", "pipewire-pulse"].map { name in
            "\(name): " + ((try? String(contentsOfFile: "\(dir)/\(name).log", encoding: .utf8))?.suffix(2_000).description ?? "")
        }.joined(separator: "\n")
    }

    /// Stops the processes this server started, the last started first.
    func stop() {
        let started: [pid_t] = pids.withLock { pids in defer { pids.removeAll() }; return pids }
        for pid in started.reversed() { killAndReap(pid) }
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

/// SIGKILL to a child this test started, and waits for it.
func killAndReap(_ pid: pid_t) {
    Glibc.kill(pid, SIGKILL)
    var status: Int32 = 0
    _ = waitpid(pid, &status, 0)
}

/// A named sink unloaded and loaded again under silent-audio: its stream is
/// back within 2 s of the load, though the reconnect backoff starts at 10 s;
/// the return comes from the server's sink events, not from a timer.
func checkSinkComesBack(_ server: some PulseTools) async throws {
    let h = try await AudioHarness()
    try await h.start([
        "server": .string(server.address), "sink": .string("nullsink"), "latency": .string("200ms"),
        "reconnect_initial": .string("10s"), "reconnect_max": .string("60s"),
    ])
    try await h.waitFor(.acquired)
    try server.unloadSink("nullsink")
    try await h.waitFor(.released)
    try await h.events.waitFor("audio-waiting")
    #expect(try server.streams().isEmpty)
    let clock = ContinuousClock()
    let loaded = clock.now
    try server.loadNullSink("nullsink")
    try await h.waitFor(.acquired, count: 2, timeout: .seconds(10))
    let back = clock.now - loaded
    #expect(back < .seconds(2), "the stream came back \(back) after the sink")
    let history = h.history.filter { $0.kind != .status }
    #expect(history.map(\.kind) == [.acquired, .released, .acquired], "\(history.map(\.kind))")
    #expect(h.events.all.contains { $0.name == "audio-lost" && $0.fields["reason"] == "sink nullsink was removed" }, "\(h.events.all)")
    try await eventually("the new stream plays on nullsink") {
        let sink = try server.sinkIndex("nullsink")
        return try server.streams().map(\.sink) == [sink].compactMap { $0 }
    }
    try await eventually("nullsink runs again") { server.sinkState == "RUNNING" }
    await h.supervisor.stopAll()
}

/// A running parec.
struct Recording {
    let pid: pid_t
    let file: String
    let log: String

    /// Stops parec and returns what it recorded: interleaved stereo s16le.
    func stop() throws -> [Int16] {
        Glibc.kill(pid, SIGINT)
        var status: Int32 = 0
        _ = waitpid(pid, &status, 0)
        let data = (try? Data(contentsOf: URL(fileURLWithPath: file))) ?? Data()
        try? FileManager.default.removeItem(atPath: file)
        return data.withUnsafeBytes { raw in
            (0..<(raw.count / 2)).map { Int16(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 2, as: Int16.self)) }
        }
    }

    /// Records at least `frames` frames.
    func frames(_ frames: Int) async throws -> [Int16] {
        try await eventually("\(frames) frames recorded") {
            (FileManager.default.contents(atPath: file)?.count ?? 0) >= frames * 4
        }
        return try stop()
    }

    /// Records at least `frames` frames after the first non-zero sample
    /// (the strategy's signal), polling the file parec writes.
    func signalFrames(_ frames: Int, timeout: Duration = .seconds(20)) async throws -> [Int16] {
        try await eventually("\(frames) frames of signal recorded") {
            guard let data = FileManager.default.contents(atPath: file) else { return false }
            let first = data.withUnsafeBytes { raw in
                (0..<(raw.count / 2)).first { raw.loadUnaligned(fromByteOffset: $0 * 2, as: Int16.self) != 0 }
            }
            guard let first else { return false }
            return data.count / 2 - first >= frames * 2
        }
        let all = try stop()
        let first = all.firstIndex { $0 != 0 } ?? 0
        return Array(all[(first - first % 2)...])
    }
}

/// Measurements of a recorded signal (one channel).
enum SignalMeasure {
    static func leftChannel(_ interleaved: [Int16]) -> [Double] {
        stride(from: 0, to: interleaved.count - 1, by: 2).map { Double(interleaved[$0]) }
    }

    /// The longest stretch of `x` without a dropout: a run of at least
    /// `dropout` zero samples (1 ms at 48 kHz). A sine of the tests' lowest
    /// slope (60 Hz at -40 dBFS, 2.6 steps a sample at its zero crossing)
    /// has at most one zero sample in a row; a stream the loaded machine
    /// did not refill in time (an underrun) has hundreds.
    static func longestUnbroken(_ x: [Double], dropout: Int = 48) -> ArraySlice<Double> {
        var best = x[0..<0]
        var start = 0, zeros = 0
        for (i, value) in x.enumerated() {
            zeros = value == 0 ? zeros + 1 : 0
            if zeros == dropout {
                let end = i - dropout + 1
                if end - start > best.count { best = x[start..<end] }
            }
            if zeros >= dropout { start = i + 1 }
        }
        if x.count - start > best.count { best = x[start...] }
        return best
    }

    static func peak(_ samples: [Int16]) -> Int {
        samples.map { abs(Int($0)) }.max() ?? 0
    }

    static func rms(_ x: ArraySlice<Double>) -> Double {
        guard !x.isEmpty else { return 0 }
        return (x.reduce(0) { $0 + $1 * $1 } / Double(x.count)).squareRoot()
    }

    /// Frequency from positive-going zero crossings, interpolated.
    static func zeroCrossingFrequency(_ x: ArraySlice<Double>, rate: Int) -> Double {
        var crossings: [Double] = []
        var i = x.startIndex + 1
        while i < x.endIndex {
            if x[i - 1] < 0, x[i] >= 0 {
                crossings.append(Double(i - 1) + (-x[i - 1]) / (x[i] - x[i - 1]))
            }
            i += 1
        }
        guard crossings.count > 2, let first = crossings.first, let last = crossings.last else { return 0 }
        return Double(crossings.count - 1) / ((last - first) / Double(rate))
    }

    /// Share of the signal's energy at `frequency` (Goertzel): near 1 when
    /// that frequency dominates.
    static func energyShare(_ x: ArraySlice<Double>, at frequency: Double, rate: Int) -> Double {
        let w = 2 * Double.pi * frequency / Double(rate)
        var re = 0.0, im = 0.0
        for (n, v) in x.enumerated() {
            re += v * cos(w * Double(n))
            im -= v * sin(w * Double(n))
        }
        let power = 2 * (re * re + im * im) / Double(x.count)
        let total = x.reduce(0) { $0 + $1 * $1 }
        return total > 0 ? power / total : 0
    }

    /// Runs of 10 ms windows whose RMS is above `threshold`: (start, length)
    /// in seconds. Runs apart by at most `bridging` seconds of quiet are one
    /// (a dropout inside a burst: the sound server's underrun on a loaded
    /// machine plays silence for a few windows).
    static func bursts(_ x: [Double], rate: Int, threshold: Double, bridging: Double = 0) -> [(start: Double, length: Double)] {
        var merged: [(start: Double, length: Double)] = []
        for run in loudRuns(x, rate: rate, threshold: threshold) {
            if let last = merged.last, run.start - (last.start + last.length) <= bridging + 1e-9 {
                merged[merged.count - 1].length = run.start + run.length - last.start
            } else {
                merged.append(run)
            }
        }
        return merged
    }

    private static func loudRuns(_ x: [Double], rate: Int, threshold: Double) -> [(start: Double, length: Double)] {
        let window = rate / 100
        var out: [(Double, Double)] = []
        var start: Int?
        var w = 0
        while (w + 1) * window <= x.count {
            let loud = rms(x[(w * window)..<((w + 1) * window)]) > threshold
            if loud, start == nil { start = w }
            if !loud, let s = start {
                out.append((Double(s) / 100, Double(w - s) / 100))
                start = nil
            }
            w += 1
        }
        if let s = start { out.append((Double(s) / 100, Double(w - s) / 100)) }
        return out
    }
}

/// A supervisor with the real clock and wake scheduler, and a record of its
/// lease events.
final class AudioHarness: @unchecked Sendable {
    // Invariant: `collector` is set once in init and only cancelled in deinit.
    private let leaseEvents = WaitableLog<LeaseEvent>()
    let clock = SystemClock()
    let registry: LeaseRegistry
    let supervisor: Supervisor
    let logs = WaitableLog<LogLine>()
    let events = RecordingEvents()
    private var collector: Task<Void, Never>?

    init(backend: any PowerBackend = NoPowerBackend()) async throws {
        registry = LeaseRegistry(clock: clock, backend: backend)
        let events = self.events
        supervisor = Supervisor(services: StrategyServices(
            registry: registry, scheduler: try WakeScheduler.system(clock: clock), clock: clock, logging: logs.logging,
            hooks: { name, log in HookRunner(strategy: name, log: log) }, events: { _ in events }))
        let stream = await registry.events()
        let leaseEvents = self.leaseEvents
        collector = Task {
            for await e in stream { leaseEvents.append(e) }
        }
    }

    deinit { collector?.cancel() }

    var history: [LeaseEvent] { leaseEvents.all }

    func start(_ values: [String: ConfigValue], name: String = "keepalive") async throws {
        let strategy = try SilentAudioPlugin.make(values)
        await supervisor.start([SupervisedStrategy(name: name, kind: "silent-audio", strategy: strategy)])
    }

    /// Waits until `count` events of `kind` were seen.
    func waitFor(_ kind: LeaseEvent.Kind, count: Int = 1, timeout: Duration = .seconds(30)) async throws {
        let seen = await leaseEvents.wait(timeout: timeout) { $0.filter { $0.kind == kind }.count >= count }
        guard seen else {
            throw DescribedError("no \(count) × \(kind) lease events after \(timeout); history: \(history.map(\.kind)); log:\n\(logs.entries.joined(separator: "\n"))")
        }
    }

    /// The live status of the strategy's active lease.
    func activeStatus() async -> [String: StatusValue] {
        await registry.active.first?.status ?? [:]
    }

    /// Waits until the supervisor reports a failure of the strategy.
    func waitForFailure(timeout: Duration = .seconds(30)) async throws -> StrategyStatus {
        let changes = await supervisor.changes()
        if let s = await supervisor.statuses.first(where: { $0.lastError != nil }) { return s }
        return try await withThrowingTaskGroup(of: StrategyStatus?.self) { group in
            group.addTask {
                for await s in changes where s.lastError != nil { return s }
                return nil
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            defer { group.cancelAll() }
            guard let s = try await group.next() ?? nil else {
                throw DescribedError("the strategy did not fail within \(timeout); log:\n\(self.logs.entries.joined(separator: "\n"))")
            }
            return s
        }
    }
}
