import CVoipSocket
import CVoipTLS
import Foundation
import Glibc
import VigilClient
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// vigil-bench voip-socket [connections] [interval-seconds] [--tls] [--rounds K] [--no-pin] [--split S]: that many
/// voip-socket instances (default 10,000) in this process, each holding one
/// keep-alive connection to a pong server on 127.0.0.1 (an epoll loop in a
/// child process, ``PongServerProcess``, so this process needs only n
/// descriptors), pinging every interval (default 10 s) aligned to the same
/// slot, so each round is one batch of every connection.
///
/// Prints memory per connection (RSS growth / n), CPU per ping round (this
/// process's CPU over one round; the server's is printed apart), how long a round
/// takes from first to last ping, and whether every ping came inside its
/// window [0.8, 1.0] x interval after the previous one. Targets: <= 16 KiB
/// per connection, a round of 10,000 within 1 s. The CPU figure is the
/// median of K measured rounds (default 5) after the first.
///
/// Reference, same run and server: the same round done by a bare epoll loop
/// over n plain sockets (send n pings, wait for n pongs), no strategy
/// machinery.
///
/// `--split S` starts half of the connections, then the other half S
/// seconds (a decimal) after the first half is up: two phases more than the
/// window's width apart, as a slow start makes them, to see them merge
/// again (each measured round's spread is printed).
///
/// The side measured (this process) and the far end (the pong server, and
/// nginx) run on separate cores (``CorePlacement``); `--no-pin` leaves them
/// where the scheduler puts them.
///
/// With `--tls`, every connection is TLS: nginx's stream module terminates
/// it in front of the same pong server (``VoipTLSTerminator``), and the
/// reference loop runs OpenSSL sessions through the same nginx.
///
/// vigild's bus projection follows every lease event, statuses included, so
/// the benchmark runs the real one (``HostBusAPI``, on a private
/// dbus-daemon: lease objects, their rate-limited Status announcements)
/// with vigild's other registry followers; `--no-follower` measures
/// without them. All of it runs on the host's event loop, which is this
/// process's only executor thread, as in vigild (main.swift;
/// `VIGIL_BENCH_EXECUTOR=default`: on Swift's default executor).
func voipSocketBench(_ arguments: [String]) async throws {
    if arguments.first == PongServerProcess.childFlag {
        try runPongServerChild()
        return
    }
    let usage = "usage: vigil-bench voip-socket [connections] [interval-seconds] [--tls] [--no-follower] [--rounds K] [--no-pin] [--split SECONDS]"
    if arguments.contains("--help") {
        print(usage)
        return
    }
    let flags: Set = ["--tls", "--no-follower", "--no-pin"]
    let tls = arguments.contains("--tls")
    let follower = !arguments.contains("--no-follower")
    let pin = !arguments.contains("--no-pin")
    let placement = pin ? CorePlacement.split() : nil
    var args = arguments.filter { !flags.contains($0) }
    // One round's CPU still varies at times by a third with the same
    // syscalls (counted per round with perf's syscall tracepoints), more
    // often without ``CorePlacement``. A reference round run right after
    // each strategy round did not vary with it: the median of five rounds
    // is steadier than of three.
    let measuredRounds = try takeRounds(&args, default: 5, usage: usage)
    var split: Double?
    if let flag = args.firstIndex(of: "--split") {
        guard flag + 1 < args.count, let s = Double(args[flag + 1]), s > 0, s < 60 else {
            throw BenchError("--split takes seconds between the two halves' starts, above 0 and below 60\n\(usage)")
        }
        split = s
        args.removeSubrange(flag...(flag + 1))
    }
    if let unknown = args.first(where: { $0.hasPrefix("--") }) { throw BenchError("unknown option \(unknown)\n\(usage)") }
    var n = args.first.flatMap(Int.init) ?? 10_000
    let interval = args.dropFirst().first.flatMap(Int64.init) ?? 10
    // The pong server runs in a child process, so this process needs about
    // n descriptors (the connections) and the child another n; with TLS,
    // nginx's workers hold the two sides of each connection between them.
    let wanted = rlim_t(n + 300)
    var current = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &current)
    if current.rlim_cur < wanted {
        var limit = rlimit(rlim_cur: min(wanted, current.rlim_max), rlim_max: current.rlim_max)
        if current.rlim_max < wanted {
            // Raising the hard limit needs CAP_SYS_RESOURCE; try, else cap n.
            var raised = rlimit(rlim_cur: wanted, rlim_max: wanted)
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 {
                limit = raised
            } else {
                n = Int(current.rlim_max) - 300
                print("note: RLIMIT_NOFILE hard limit is \(current.rlim_max) (raising it needs CAP_SYS_RESOURCE): \(n) connections")
            }
        }
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else {
            print("cannot raise RLIMIT_NOFILE: \(String(cString: strerror(errno)))")
            exit(1)
        }
    }
    let server = try PongServerProcess(capacity: n + 400 + (tls ? n : 0))
    defer { server.stop() }
    let terminator = tls ? try VoipTLSTerminator(upstreamPort: server.port, connections: n + 100, placement: placement) : nil
    defer { terminator?.stop() }
    if let placement {
        try placement.pinFarEnd(server.pid)
        try placement.pinThisProcess()
    }
    let target = terminator?.address ?? server.address
    let front = terminator.map { " (nginx TLS, \($0.workers) workers, in front of \(server.address))" } ?? ""
    print("placement: \(placement.map { $0.description(tls: tls) } ?? (pin ? "not pinned (fewer than two cores)" : "not pinned (--no-pin)"))")
    print(EventLoop.isCurrent
        ? "executor: the host's event loop, as in vigild (one thread runs the strategies' tasks, the followers and the bus connection; the plugin's socket thread beside it)"
        : "executor: Swift's default executor (VIGIL_BENCH_EXECUTOR=default)")
    print("voip-socket: \(n) \(tls ? "TLS " : "")connections to \(target)\(front), keepalive_interval \(interval)s, aligned to \(interval)s slots, \(follower ? "with" : "without") vigild's bus projection (HostBusAPI on a private dbus-daemon) and its other registry followers")

    let kind = try PluginLoader(searchPath: [try hostBuildDirectory().path]).loadKind("voip-socket").get()
    let clock = SystemClock()
    let registry = LeaseRegistry(clock: clock)
    // What else a vigild attaches to its registry, real parts: the metrics
    // observer (each answered ping's round trip goes into a histogram) and
    // the followers of client leases and apps' inhibits.
    let metrics = HostMetrics()
    let clientLeases = ClientLeases(registry: registry, settings: ClientLeaseSettings())
    let inhibits = ForeignInhibits(registry: registry, settings: InhibitSettings(), grace: .seconds(5), logging: .discarding)
    if follower {
        await registry.observe(metrics)
        await clientLeases.start()
        await inhibits.start()
    }
    // Unstructured task: not cancelled: one stop, which ends by itself (a defer cannot await).
    defer { Task { await clientLeases.stop(); await inhibits.stop() } }
    let scheduler = try WakeScheduler.system(clock: clock)
    let supervisor = Supervisor(services: StrategyServices(
        registry: registry, scheduler: scheduler, clock: clock, logging: .discarding,
        hooks: { _, _ in NoHooks() }, events: { _ in NoEvents() }))
    let projection = follower
        ? try await BusProjection.start(clock: clock, registry: registry, supervisor: supervisor, scheduler: scheduler,
                                        clientLeases: clientLeases, inhibits: inhibits)
        : nil
    var strategies: [SupervisedStrategy] = []
    strategies.reserveCapacity(n)
    for i in 0..<n {
        var values: [String: ConfigValue] = [
            "connect": .string(target), "keepalive_interval": .integer(interval), "align": .boolean(true),
            "handler_timeout": .string("\(interval * 500)ms"), "expect": .string("\r\n"), "connect_timeout": .string("30s"),
        ]
        if let terminator { values["tls"] = .boolean(true); values["ca_file"] = .string(terminator.certificates.caCertificate) }
        let reader = ConfigReader(strategyName: "voip\(i)", keyPath: "strategy[\(i)]", values: values)
        let strategy = try kind.makeStrategy(reader)
        guard reader.problems.isEmpty else { throw BenchError("config: \(reader.problems)") }
        strategies.append(SupervisedStrategy(name: "voip\(i)", kind: "voip-socket", strategy: strategy))
    }
    let rssBefore = residentBytes(), heapBefore = heapInUse()
    let started = ContinuousClock.now, startCPU = processCPU()
    if let split {
        let half = n / 2
        await supervisor.start(Array(strategies[..<half]))
        guard await waitFor(seconds: 120, { server.accepted >= half }) else { throw BenchError("only \(server.accepted) of \(half) connected") }
        try await Task.sleep(for: .milliseconds(Int64(split * 1000)))
        print("split: the first \(half) connections up, the other \(n - half) started \(split) s later")
        await supervisor.start(Array(strategies[half...]))
    } else {
        await supervisor.start(strategies)
    }
    guard await waitFor(seconds: 120, { server.accepted >= n }) else { throw BenchError("only \(server.accepted) of \(n) connected") }
    // The CPU the start took (this process, every thread): what the
    // followers add there is CPU, whatever else the machine runs; the
    // time it takes also depends on that.
    print("connected \(n) in \(format(ContinuousClock.now - started)), \(String(format: "%.2f", processCPU() - startCPU)) s of CPU; RSS +\(kibPerConnection(residentBytes() - rssBefore, n)) KiB per connection (malloc in use +\(kibPerConnection(heapInUse() - heapBefore, n)))")

    // Round 1: every connection pings once (maybe split over two slots while connecting).
    guard await waitFor(seconds: Double(3 * interval), { server.connectionsWithPings(atLeast: 1) >= n }) else {
        throw BenchError("round 1 incomplete: \(server.connectionsWithPings(atLeast: 1)) of \(n)")
    }
    try await Task.sleep(for: .seconds(1))
    print("after round 1: RSS +\(kibPerConnection(residentBytes() - rssBefore, n)) KiB per connection (malloc in use +\(kibPerConnection(heapInUse() - heapBefore, n)))")
    // Rounds 2 to K+1: the next ping of every connection, all in one slot;
    // the median round's CPU is the figure (one round's varied by a third
    // from run to run). Asking the server whether the round came is the
    // benchmark's own work (a timer, a thread wake-up, a pipe exchange and a
    // parse each): every 250 ms, not every 50 (over the ~10 s wait, that
    // was 10-20 ms of the round's CPU), and the asking's thread CPU is taken
    // out of the round's.
    var roundCPU: [Double] = [], roundServerCPU: [Double] = [], roundPolling: [Double] = []
    var roundAnnouncements: [Int] = [], roundSpreads: [Double] = []
    for number in 2...(1 + measuredRounds) {
        let mark = server.totalPings
        let announcedBefore = await projection?.api.rateLimitedAnnouncements() ?? 0
        let cpuBefore = processCPU(), serverBefore = server.cpuNanoseconds
        var polling = 0.0
        guard await waitFor(seconds: Double(3 * interval), every: .milliseconds(250), cpu: &polling, { server.totalPings >= mark + n }) else {
            throw BenchError("round \(number) incomplete: \(server.totalPings - mark) of \(n)")
        }
        try await Task.sleep(for: .seconds(1))  // pongs handled, next wakes requested
        roundCPU.append(processCPU() - cpuBefore - polling)
        roundServerCPU.append(Double(server.cpuNanoseconds - serverBefore) / 1e9)
        roundPolling.append(polling)
        roundAnnouncements.append((await projection?.api.rateLimitedAnnouncements() ?? 0) - announcedBefore)
        roundSpreads.append(server.lastRound().spreadMs)
    }
    let cpu = median(roundCPU), serverCPU = median(roundServerCPU), polling = median(roundPolling)
    let rss = residentBytes() - rssBefore
    let round = server.lastRound()
    let leases = await registry.active
    let active = leases.count
    // Each connection counts the handler runs that started after their
    // window's end (LatePings in its status): the exact check, from where the
    // window is known (it starts at the previous pong's arrival).
    func figure(_ key: String) -> UInt64 { leases.reduce(0) { total, lease in
        if case .uint(let v)? = lease.status[key] { return total + v } else { return total }
    } }
    let latePings = figure("LatePings"), sentPings = figure("Pings"), overruns = figure("Overruns")
    print("")
    print("memory per connection:   \(String(format: "%.1f", Double(rss) / Double(n) / 1024)) KiB (RSS +\(rss / 1_048_576) MiB for \(n); target <= \(tls ? 64 : 16) KiB)")
    print("leases held:             \(active)")
    print("round of \(n) pings:       first to last ping \(String(format: "%.1f", round.spreadMs)) ms (target <= 1000 ms); rounds 2-\(1 + measuredRounds): \(roundSpreads.map { String(format: "%.0f", $0) }.joined(separator: ", ")) ms")
    print("CPU per round:           \(String(format: "%.1f", cpu * 1000)) ms strategy side, median of rounds 2-\(1 + measuredRounds) (\(roundCPU.map { String(format: "%.1f", $0 * 1000) }.joined(separator: ", ")) ms; \(String(format: "%.2f", cpu / Double(n) * 1e6)) us per ping; the benchmark's own polling of the server, \(String(format: "%.1f", polling * 1000)) ms, taken out); server process \(String(format: "%.1f", serverCPU * 1000)) ms")
    print("pings inside window:     \(round.insideWindow(interval: Double(interval)))/\(round.gaps.count) with gap in [0.8, 1.0] x \(interval) s (+ round spread); latest \(String(format: "%.1f", round.maxLatenessMs(interval: Double(interval)))) ms after the window end; earliest gap \(String(format: "%.3f", (round.gaps.min() ?? 0))) s")
    print("late pings (strategy):   \(latePings) of \(sentPings) pings so far started after their window's end; overruns \(overruns)")
    let stats = await scheduler.statistics
    print("wake scheduler:          \(stats.batchesFired) batches for \(stats.requestsFired) wakes")
    if let projection {
        print("bus projection:          vigild's HostBusAPI on a private dbus-daemon (\(await projection.shownLeases()) lease objects shown); metrics observer, client-lease and inhibit followers attached as in vigild")
        print("status announcements:    \(roundAnnouncements.sorted()[roundAnnouncements.count / 2]) PropertiesChanged (lease Status) per round of \(n) pings, median of rounds 2-\(1 + measuredRounds) (\(roundAnnouncements.map(String.init).joined(separator: ", "))): at most one per lease and second, \(HostBusAPI.rateLimitedAnnouncementsPerSecond) a second for the host")
    }
    await supervisor.stopAll()
    await projection?.stop()

    // Reference: the same round from a bare epoll loop over plain sockets,
    // as many times (each on new connections); the median round's CPU.
    var references: [ReferenceFigures] = []
    for _ in 0..<measuredRounds {
        references.append(try bareEpollRound(n: n, port: UInt16(terminator?.port ?? Int(server.port)), server: server, tls: terminator))
    }
    let reference = references.sorted { $0.clientCPUms < $1.clientCPUms }[references.count / 2]
    print("")
    print("reference (bare epoll loop, same server, \(n) \(tls ? "OpenSSL sessions through the same nginx" : "sockets")), median of \(references.count) rounds (\(references.map { String(format: "%.1f", $0.clientCPUms) }.joined(separator: ", ")) ms):")
    print("  round: \(String(format: "%.1f", reference.wallMs)) ms; CPU \(String(format: "%.1f", reference.clientCPUms)) ms client side (\(String(format: "%.2f", reference.clientCPUms * 1000 / Double(n))) us per ping), server process \(String(format: "%.1f", reference.serverCPUms)) ms; memory \(String(format: "%.2f", reference.rssPerConnection / 1024)) KiB per connection (malloc in use +\(kibPerConnection(heapInUse() - heapBefore, n)))")
    print("ratio: strategy CPU per round / bare loop = \(String(format: "%.2f", cpu * 1000 / max(reference.clientCPUms, 0.001)))x")
}

/// vigild's bus projection itself: ``HostBusAPI`` over the benchmark's
/// registry and supervisor, exported on a private dbus-daemon, as
/// `HostRuntime.busParts` gives it a running host's parts.
struct BusProjection {
    let bus: TestDBusDaemon
    let connection: DBusConnection
    let api: HostBusAPI
    let directory: URL

    static func start(clock: any VigilClock, registry: LeaseRegistry, supervisor: Supervisor, scheduler: any WakeScheduling,
                      clientLeases: ClientLeases, inhibits: ForeignInhibits) async throws -> BusProjection {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-voip-bench-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let store = try SurvivalStore(path: directory.appendingPathComponent("survival.sqlite").path)
        let bus = try startBenchBus()
        let connection = try await DBusConnection.connect(to: .address(bus.address))
        let parts = HostBusParts(
            version: "bench", runId: UUID().uuidString.lowercased(), configPath: "", startedAt: clock.now,
            startedWallMicros: Int64(Date().timeIntervalSince1970 * 1_000_000), clock: clock, logging: .discarding,
            registry: registry, supervisor: supervisor, scheduler: scheduler, store: store, clientLeases: clientLeases,
            inhibits: inhibits, strategyBus: StrategyBusBridge(logging: .discarding), costs: StrategyCosts(clock: clock),
            configuredStrategy: { _ in nil }, reload: { ReloadResult(applied: false, messages: ["benchmark"]) },
            health: { HostHealth() }, servesInhibits: { false })
        let api = HostBusAPI(parts: parts, connection: connection, hostUID: getuid())
        try await api.export()
        return BusProjection(bus: bus, connection: connection, api: api, directory: directory)
    }

    /// The lease objects the projection shows now.
    func shownLeases() async -> Int {
        guard let reader = try? await DBusConnection.connect(to: .address(bus.address)) else { return 0 }
        let client = VigilClient(connection: reader, destination: await connection.uniqueName)
        let shown = (try? await client.host().leases.count) ?? 0
        await reader.close()
        return shown
    }

    func stop() async {
        await api.stop()
        await connection.close()
        bus.stop()
        try? FileManager.default.removeItem(at: directory)
    }
}

/// A benchmark that cannot go on, with the reason (shared by the benchmarks).
struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

private struct NoHooks: HookRunning {
    func run(_ command: HookCommand, event: String, variables: [String: String]) async -> HookResult {
        HookResult(exit: .failedToStart("hooks are off in the benchmark"), output: "", duration: .zero)
    }
}

private struct NoEvents: EventRecording {
    func record(_ event: String, _ fields: [String: String]) async {}
}

private func waitFor(seconds: Double, _ condition: () -> Bool) async -> Bool {
    var cpu = 0.0
    return await waitFor(seconds: seconds, every: .milliseconds(50), cpu: &cpu, condition)
}

/// ``waitFor(seconds:_:)`` adding the CPU time `condition` took to `cpu`
/// (seconds; each call runs on one thread, without suspending).
private func waitFor(seconds: Double, every period: Duration, cpu: inout Double, _ condition: () -> Bool) async -> Bool {
    let end = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while true {
        let before = threadCPU()
        let met = condition()
        cpu += threadCPU() - before
        if met { return true }
        if ContinuousClock.now > end { return false }
        try? await Task.sleep(for: period)
    }
}

/// This thread's CPU time, in seconds.
private func threadCPU() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

private func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    return (fields.count > 1 ? Int(fields[1]) ?? 0 : 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
}

private func processCPU() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// Bytes malloc has handed out and not had back (all arenas).
private func heapInUse() -> Int {
    vigil_heap_in_use()
}

private func kibPerConnection(_ bytes: Int, _ n: Int) -> String { String(format: "%.1f", Double(bytes) / Double(n) / 1024) }

private func format(_ d: Duration) -> String { String(format: "%.2f s", d.seconds) }

private func monotonicNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// Ping times of the connections in the last round.
struct RoundFigures {
    var spreadMs: Double
    /// Per connection: seconds between its last two pings.
    var gaps: [Double]

    /// Gaps inside [0.8, 1.0] x interval, measured at the server: each window
    /// starts at the pong of the previous ping, which the server cannot see,
    /// so the previous round's delivery spread is allowed on top.
    func insideWindow(interval: Double) -> Int {
        gaps.filter { $0 >= 0.8 * interval && $0 <= interval + spreadMs / 1000 }.count
    }
    func maxLatenessMs(interval: Double) -> Double { max(0, ((gaps.max() ?? 0) - interval) * 1000) }
}

/// A CRLFCRLF -> CRLF pong server on 127.0.0.1: one thread, epoll,
/// edge-triggered, recording each connection's last two ping times.
final class BenchPongServer: Sendable {
    /// Written by the server thread, read by the benchmark.
    private struct Figures {
        var lastPing: [Int64]
        var previousPing: [Int64]
        var pingCount: [Int32]
        var acceptedCount = 0
        var pings = 0
        var cpu: Int64 = 0
    }
    private let figures: Lock<Figures>
    let listenFD: Int32
    let port: UInt16
    private let epollFD: Int32

    init(capacity: Int) throws {
        figures = Lock(Figures(
            lastPing: [Int64](repeating: 0, count: capacity),
            previousPing: [Int64](repeating: 0, count: capacity),
            pingCount: [Int32](repeating: 0, count: capacity)))
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard ok, listen(fd, 4096) == 0 else { throw BenchError("server bind/listen: \(String(cString: strerror(errno)))") }
        listenFD = fd
        port = UInt16(bigEndian: address.sin_port)
        epollFD = vigil_epoll_create()
        _ = vigil_epoll_add_level_in(epollFD, fd, UInt64(fd))
        let thread = Thread { [self] in serve() }
        thread.name = "bench-pong-server"
        thread.start()
    }

    var address: String { "127.0.0.1:\(port)" }
    var accepted: Int { figures.withLock { $0.acceptedCount } }
    var totalPings: Int { figures.withLock { $0.pings } }
    var cpuNanoseconds: Int64 { figures.withLock { $0.cpu } }
    func connectionsWithPings(atLeast k: Int32) -> Int { figures.withLock { $0.pingCount.filter { $0 >= k }.count } }

    func lastRound() -> RoundFigures {
        figures.withLock { f in
            var latest: [Int64] = []
            var gaps: [Double] = []
            for i in 0..<f.lastPing.count where f.pingCount[i] >= 2 {
                latest.append(f.lastPing[i])
                gaps.append(Double(f.lastPing[i] - f.previousPing[i]) / 1e9)
            }
            let spread = Double((latest.max() ?? 0) - (latest.min() ?? 0)) / 1e6
            return RoundFigures(spreadMs: spread, gaps: gaps)
        }
    }

    private func serve() {
        let events = UnsafeMutablePointer<vigil_socket_event>.allocate(capacity: 256)
        var buffer = [UInt8](repeating: 0, count: 4096)
        let pong: [UInt8] = [13, 10]
        while true {
            let count = vigil_epoll_wait(epollFD, events, 256, -1)
            if count <= 0 { continue }
            let now = monotonicNanoseconds()
            var newPings: [(Int32, Int)] = []
            var newAccepts = 0
            for i in 0..<Int(count) {
                let fd = Int32(truncatingIfNeeded: events[i].token)
                if fd == listenFD {
                    while true {
                        let c = accept(listenFD, nil, nil)
                        if c < 0 { break }
                        _ = fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK)
                        _ = vigil_epoll_add(epollFD, c, UInt64(c))
                        newAccepts += 1
                    }
                    continue
                }
                var got = 0
                while true {
                    let r = vigil_recv(fd, &buffer, UInt(buffer.count))
                    if r > 0 { got += r; continue }
                    if r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) {
                        _ = vigil_epoll_del(epollFD, fd)
                        close(fd)
                    }
                    break
                }
                // Pings are CRLFCRLF; the bench clients send nothing else.
                let k = got / 4
                if k > 0 {
                    for _ in 0..<k { _ = vigil_send(fd, pong, 2) }
                    newPings.append((fd, k))
                }
            }
            var ts = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
            let cpuNow = Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
            figures.withLock { f in
                f.acceptedCount += newAccepts
                for (fd, k) in newPings where Int(fd) < f.lastPing.count {
                    f.previousPing[Int(fd)] = f.lastPing[Int(fd)]
                    f.lastPing[Int(fd)] = now
                    f.pingCount[Int(fd)] += Int32(k)
                    f.pings += k
                }
                f.cpu = cpuNow
            }
        }
    }

    /// Forgets per-connection figures (fds are reused by the reference run).
    func resetFigures() {
        figures.withLock { f in
            for i in 0..<f.pingCount.count { f.pingCount[i] = 0; f.lastPing[i] = 0; f.previousPing[i] = 0 }
        }
    }
}

private struct ReferenceFigures {
    var wallMs: Double
    var clientCPUms: Double
    var serverCPUms: Double
    var rssPerConnection: Double
}

/// One ping round over n plain non-blocking sockets with one epoll loop.
private func bareEpollRound(n: Int, port: UInt16, server: PongServerProcess, tls: VoipTLSTerminator?) throws -> ReferenceFigures {
    server.resetFigures()
    let rssBefore = residentBytes()
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = port.bigEndian
    let ep = vigil_epoll_create()
    var context: UnsafeMutableRawPointer?
    if let tls {
        var error = [CChar](repeating: 0, count: 512)
        context = vigil_tls_context_new(tls.certificates.caCertificate, nil, nil, &error, 512)
        guard context != nil else { throw BenchError("reference TLS context: \(errorText(error))") }
    }
    var sessions: [Int32: UnsafeMutableRawPointer] = [:]
    var fds: [Int32] = []
    fds.reserveCapacity(n)
    for _ in 0..<n {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard fd >= 0, rc == 0 else { throw BenchError("reference connect: \(String(cString: strerror(errno)))") }
        if let context {
            // A blocking handshake: setup, not part of the measured round.
            var error = [CChar](repeating: 0, count: 512)
            guard let session = vigil_tls_session_new(context, fd, "127.0.0.1", &error, 512),
                vigil_tls_handshake(session, &error, 512) == vigil_TLS_OK
            else { throw BenchError("reference TLS handshake: \(errorText(error))") }
            sessions[fd] = session
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        _ = vigil_epoll_add(ep, fd, UInt64(fd))
        fds.append(fd)
    }
    // Drain the initial writable edges.
    let events = UnsafeMutablePointer<vigil_socket_event>.allocate(capacity: 256)
    while vigil_epoll_wait(ep, events, 256, 0) > 0 {}
    let rss = residentBytes() - rssBefore
    // The loop's own thread: what else the process still does (the
    // strategies' teardown) is not the reference's.
    let cpuBefore = threadCPU(), serverBefore = server.cpuNanoseconds
    let t0 = monotonicNanoseconds()
    let ping: [UInt8] = [13, 10, 13, 10]
    var status: Int32 = 0
    var error = [CChar](repeating: 0, count: 512)
    for fd in fds {
        if let session = sessions[fd] {
            _ = vigil_tls_write(session, ping, 4, &status, &error, 512)
        } else {
            _ = vigil_send(fd, ping, 4)
        }
    }
    var pongs = 0
    var buffer = [UInt8](repeating: 0, count: 256)
    while pongs < n {
        let count = vigil_epoll_wait(ep, events, 256, 5_000)
        if count <= 0 { break }
        for i in 0..<Int(count) {
            let fd = Int32(truncatingIfNeeded: events[i].token)
            let session = sessions[fd]
            while true {
                let r = session.map { vigil_tls_read($0, &buffer, UInt(buffer.count), &status, &error, 512) } ?? vigil_recv(fd, &buffer, UInt(buffer.count))
                if r > 0 { pongs += r / 2; continue }
                break
            }
        }
    }
    let wall = Double(monotonicNanoseconds() - t0) / 1e6
    let cpu = (threadCPU() - cpuBefore) * 1000
    Thread.sleep(forTimeInterval: 0.2)  // let the server thread publish its CPU time
    let serverCPU = Double(server.cpuNanoseconds - serverBefore) / 1e6
    for session in sessions.values { vigil_tls_session_free(session) }
    if let context { vigil_tls_context_free(context) }
    for fd in fds { close(fd) }
    close(ep)
    return ReferenceFigures(wallMs: wall, clientCPUms: cpu, serverCPUms: serverCPU, rssPerConnection: Double(rss) / Double(n))
}

/// A NUL-terminated C message buffer as text.
private func errorText(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
