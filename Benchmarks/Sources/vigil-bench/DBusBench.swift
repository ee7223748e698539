// dbus: round-trip latency of the VigilDBus object server against the C
// libdbus reference service (dbus-test-tool echo) on the same private bus,
// and wakeups of an idle exported connection against a 100 ms polling loop.
// vigil-bench dbus [calls] [idle-seconds]: 5,000 calls, 3 s idle by default.
import Foundation
import Glibc
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

func dbusBench(_ args: [String]) async throws {
    let calls = args.first.flatMap(Int.init) ?? 5000
    let idleSeconds = args.dropFirst().first.flatMap(Double.init) ?? 3

    // A private bus.
    let bus = try TestDBusDaemon()
    defer { bus.stop() }
    let address = bus.address

    // The reference: libdbus's own echo service, in C.
    let echo = try startEchoService(on: address)
    defer { kill(echo.processIdentifier, SIGKILL) }

    // The VigilDBus service.
    let (benchName, benchPath, benchInterface) = ("org.vigil.Bench", "/org/vigil/Bench", "org.vigil.Bench1")
    let service = try await DBusConnection.connect(to: .address(address))
    let server = try await DBusObjectServer(connection: service)
    try await server.export(benchPath, interfaces: [
        DBusInterface(benchInterface, methods: [DBusMethod("Ping") { _ in [] }]),
    ])
    try await service.requestName(benchName)

    let client = try await DBusConnection.connect(to: .address(address))
    // Wait for the echo service's name.
    for _ in 0..<200 {
        if try await client.nameHasOwner(BenchAPI.echoName) { break }
        try await Task.sleep(for: .milliseconds(10))
    }

    func measure(_ destination: String, _ path: String, _ interface: String) async throws -> Double {
        let start = ContinuousClock.now
        for _ in 0..<calls {
            try await client.call(destination: destination, path: path, interface: interface, member: "Ping")
        }
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) * 1e6 / Double(calls) + Double(elapsed.components.attoseconds) / 1e12 / Double(calls)
    }
    _ = try await measure(benchName, benchPath, benchInterface) // warm-up
    let swiftMicros = try await measure(benchName, benchPath, benchInterface)
    let referenceMicros = try await measure(BenchAPI.echoName, "/", "org.vigil.Anything")
    print(String(format: "round trip, VigilDBus service:        %8.1f µs/call (%d sequential calls)", swiftMicros, calls))
    print(String(format: "round trip, dbus-test-tool echo (C):  %8.1f µs/call (reference)", referenceMicros))
    print(String(format: "ratio VigilDBus / C reference:        %8.2f", swiftMicros / referenceMicros))

    // Idle wakeups: with both connections open and an object exported,
    // count voluntary context switches of every thread of this process.
    await client.close()
    try await Task.sleep(for: .milliseconds(200))
    let idleBefore = voluntarySwitches()
    try await Task.sleep(for: .seconds(idleSeconds))
    let idleAfter = voluntarySwitches()
    // Reference: the same wait with a thread polling every 100 ms, as a
    // dbus_connection_read_write_dispatch(conn, 100) loop would.
    let stop = ManagedAtomicFlag()
    let poller = Thread {
        while !stop.isSet { poll(nil, 0, 100) }
    }
    poller.start()
    try await Task.sleep(for: .milliseconds(200))
    let pollBefore = voluntarySwitches()
    try await Task.sleep(for: .seconds(idleSeconds))
    let pollAfter = voluntarySwitches()
    stop.set()
    // The idle figure includes the sleeping benchmark task's own timer wakeup.
    print(String(format: "idle %.0f s, exported service:         %5d voluntary context switches (all threads)", idleSeconds, switches(from: idleBefore, to: idleAfter)))
    print(String(format: "idle %.0f s, 100 ms polling reference: %5d voluntary context switches (all threads)", idleSeconds, switches(from: pollBefore, to: pollAfter)))
    await service.close()
}

/// voluntary_ctxt_switches of each thread, from /proc/self/task/*/status.
private func voluntarySwitches() -> [String: Int] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    var counts: [String: Int] = [:]
    for task in tasks {
        guard let status = try? String(contentsOfFile: "/proc/self/task/\(task)/status", encoding: .utf8) else { continue }
        for line in status.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches:") {
            counts[task] = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
        }
    }
    return counts
}

/// Switches made between two snapshots by threads alive at the second one
/// (threads that exited in between are not counted).
private func switches(from before: [String: Int], to after: [String: Int]) -> Int {
    after.reduce(0) { $0 + $1.value - (before[$1.key] ?? 0) }
}

/// A flag set once from one thread and read from another.
final class ManagedAtomicFlag: Sendable {
    private let value = Lock(false)
    var isSet: Bool { value.withLock { $0 } }
    func set() { value.withLock { $0 = true } }
}

// MARK: - dbus-api

// dbus-api: the host's org.vigil.Vigil1 objects (the release vigild as its
// own process, 1,000 client leases) under Properties.Get and
// ListLeases, against dbus-test-tool echo (C libdbus, its own process) called
// by the same client connection in the same run.
func dbusAPIBench(_ args: [String]) async throws {
    guard let (numbers, rounds) = try roundsArguments(args, usage: "usage: vigil-bench dbus-api [calls] [leases] [--rounds K]", numbers: 2) else { return }
    let calls = numbers.first ?? 5000
    let leaseCount = numbers.dropFirst().first ?? 1000
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-dbus-api-bench-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let bus = try startBenchBus()
    defer { bus.stop() }
    let address = bus.address

    let echo = try startEchoService(on: address)
    defer { kill(echo.processIdentifier, SIGKILL) }

    // The host: the release vigild as its own process (as a real host runs;
    // the clients here do not share its threads), no strategies; the
    // leases are client leases another connection holds.
    let vigild = try await startBenchVigild(busAddress: address, dir: directory, hostSettings: """
        client_max_leases_per_uid = 100000
        client_max_budget_per_uid = "100000h"
        """)
    defer { vigild.terminate(); vigild.waitUntilExit() }
    let holder = try await DBusConnection.connect(to: .address(address))
    var heldFDs: [BusFileDescriptor] = []
    for i in 0..<leaseCount {
        let reply = try await holder.call(BenchAPI.beginBackgroundTask(
            name: "bench hold \(i)", reason: "benchmark lease \(i) of \(leaseCount)", budgetMicros: 3_600_000_000))
        if case .unixFD(let fd) = reply.body.last { heldFDs.append(fd) }
    }
    defer { for fd in heldFDs { fd.close() } }

    let client = try await DBusConnection.connect(to: .address(address))
    // Wait until the echo service has its name and the API shows every lease.
    for _ in 0..<500 {
        let echoUp = try await client.nameHasOwner(BenchAPI.echoName)
        let shown = try await client.call(BenchAPI.hostProperty(VigilAPI.Host.leases)).argument(0, as: DBusVariant.self)
        if echoUp, case let .array(_, paths) = shown.value, paths.count == leaseCount { break }
        try await Task.sleep(for: .milliseconds(10))
    }

    let vigilGet = BenchAPI.hostProperty(VigilAPI.Host.version)
    let echoGet = BenchAPI.hostProperty(VigilAPI.Host.version, destination: BenchAPI.echoName)
    let listLeases = BenchAPI.host(VigilAPI.Host.listLeases)
    let leaseReply = try await client.call(listLeases)
    guard case let .array(_, rows) = leaseReply.body.first, rows.count == leaseCount else {
        throw DBusError.failed("ListLeases returned \(leaseReply.body.first.map { "\($0.signature)" } ?? "nothing"), expected \(leaseCount) leases")
    }
    // The C reference for ListLeases: the same 1,000-row payload crosses
    // the bus once, as an argument to echo (which replies empty).
    let echoPayload = BenchCall(destination: BenchAPI.echoName, path: "/", interface: "org.vigil.Anything",
                                member: "Take", arguments: leaseReply.body)
    let payloadBytes = estimatedSize(leaseReply.body)

    print("dbus-api: org.vigil.Vigil1 served by the release vigild (its own process), \(leaseCount) client leases; private dbus-daemon;")
    print("reference dbus-test-tool echo (C libdbus, own process); same client connection, same run. 2 cores shared by all.")
    _ = try await measureCalls(client, vigilGet, calls: min(calls, 1000), inFlight: 1) // warm-up
    _ = try await measureCalls(client, echoGet, calls: min(calls, 1000), inFlight: 1)
    // Each figure: K rounds of vigild then echo; the rates and ratios are
    // medians of the rounds (one pair alone varied by a fifth either way
    // from run to run), every round's ratio printed.
    print("(each figure: median of \(rounds) rounds, each vigild then echo)")
    for inFlight in [1, 8, 32] {
        let (vigil, reference) = try await pairedRounds(rounds,
            { try await measureCalls(client, vigilGet, calls: calls, inFlight: inFlight) },
            { try await measureCalls(client, echoGet, calls: calls, inFlight: inFlight) })
        print("Properties.Get Host.Version, \(inFlight) in flight (\(calls) calls):")
        print("  vigild:     \(CallFigures.median(vigil).line)")
        print("  echo (C):   \(CallFigures.median(reference).line)")
        print("  ratio vigild / C calls/s: \(medianRatio(vigil.map(\.callsPerSecond), reference.map(\.callsPerSecond)))")
    }
    let listCalls = max(50, calls / 20)
    for inFlight in [1, 4] {
        let (vigil, reference) = try await pairedRounds(rounds,
            { try await measureCalls(client, listLeases, calls: listCalls, inFlight: inFlight) },
            { try await measureCalls(client, echoPayload, calls: listCalls, inFlight: inFlight) })
        print("ListLeases with \(leaseCount) leases (~\(payloadBytes / 1024) KiB reply), \(inFlight) in flight (\(listCalls) calls):")
        print("  vigild:     \(CallFigures.median(vigil).line)")
        print("  echo (C), same payload as argument:  \(CallFigures.median(reference).line)")
        print("  ratio vigild / C calls/s: \(medianRatio(vigil.map(\.callsPerSecond), reference.map(\.callsPerSecond)))")
    }
    // Where the client's time goes: its own CPU for the sequential echo calls.
    let usageBefore = processCPUSeconds()
    let clientOnly = try await measureCalls(client, echoGet, calls: calls, inFlight: 1)
    let cpu = processCPUSeconds() - usageBefore
    print(String(format: "client cost: %.1f µs of this process's CPU per call against echo (%.0f calls/s, 1 in flight)",
                 cpu * 1e6 / Double(calls), clientOnly.callsPerSecond))

    await client.close()
    await holder.close()
}

/// The C reference service: `dbus-test-tool echo` (libdbus) owning
/// org.vigil.BenchEcho on the bus at `address`; it answers every call with
/// an empty reply.
func startEchoService(on address: String) throws -> Process {
    let echo = Process()
    echo.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-test-tool")
    echo.arguments = ["echo", "--name=\(BenchAPI.echoName)"]
    echo.environment = ["DBUS_SESSION_BUS_ADDRESS": address]
    try echo.run()
    return echo
}

struct CallFigures {
    var callsPerSecond: Double
    var p50Micros: Double
    var p99Micros: Double
    var line: String {
        String(format: "%8.0f calls/s   p50 %7.1f µs   p99 %7.1f µs", callsPerSecond, p50Micros, p99Micros)
    }

    /// Each figure's median over `rounds`.
    static func median(_ rounds: [CallFigures]) -> CallFigures {
        CallFigures(callsPerSecond: vigil_bench.median(rounds.map(\.callsPerSecond)),
                    p50Micros: vigil_bench.median(rounds.map(\.p50Micros)), p99Micros: vigil_bench.median(rounds.map(\.p99Micros)))
    }
}

/// The arguments of a benchmark measured in rounds: up to `numbers`
/// positive numbers and `--rounds K` (1 to 50, default 3). Nil once the
/// usage is printed for `--help`; anything else is refused with it.
func roundsArguments(_ args: [String], usage: String, numbers count: Int) throws -> (numbers: [Int], rounds: Int)? {
    if args.contains("--help") {
        print(usage)
        return nil
    }
    var rest = args
    let rounds = try takeRounds(&rest, default: 3, usage: usage)
    let numbers = rest.compactMap { Int($0) }.filter { $0 > 0 }
    guard rest.count <= count, numbers.count == rest.count else {
        throw BenchError("unexpected arguments: \(rest.joined(separator: " "))\n\(usage)")
    }
    return (numbers, rounds)
}

/// `--rounds K` (1 to 50) taken out of `args`; `rounds` without it.
func takeRounds(_ args: inout [String], default rounds: Int, usage: String) throws -> Int {
    guard let flag = args.firstIndex(of: "--rounds") else { return rounds }
    guard flag + 1 < args.count, let k = Int(args[flag + 1]), (1...50).contains(k) else {
        throw BenchError("--rounds takes a number of rounds from 1 to 50\n\(usage)")
    }
    args.removeSubrange(flag...(flag + 1))
    return k
}

/// `rounds` rounds of `first` then `second`: the measured and its reference
/// in turn, so that a slow stretch of the machine falls on both.
func pairedRounds<T>(_ rounds: Int, _ first: () async throws -> T, _ second: () async throws -> T) async throws -> ([T], [T]) {
    var a: [T] = [], b: [T] = []
    for _ in 0..<rounds {
        a.append(try await first())
        b.append(try await second())
    }
    return (a, b)
}

/// The median of the rounds' ratios `values[i] / references[i]`, and each round's.
func medianRatio(_ values: [Double], _ references: [Double]) -> String {
    let each = zip(values, references).map { $0 / $1 }
    return String(format: "%.2f (rounds %@)", median(each), each.map { String(format: "%.2f", $0) }.joined(separator: ", "))
}

/// Makes `calls` calls with `inFlight` concurrent callers (each waits for
/// its reply before the next call) and measures throughput and latency.
func measureCalls(_ client: DBusConnection, _ call: BenchCall, calls: Int, inFlight: Int) async throws -> CallFigures {
    let perCaller = calls / inFlight
    let start = ContinuousClock.now
    let latencies = try await withThrowingTaskGroup(of: [Double].self) { group in
        for _ in 0..<inFlight {
            group.addTask {
                var times: [Double] = []
                times.reserveCapacity(perCaller)
                for _ in 0..<perCaller {
                    let t0 = ContinuousClock.now
                    try await client.call(call)
                    times.append(micros(ContinuousClock.now - t0))
                }
                return times
            }
        }
        var all: [Double] = []
        for try await times in group { all += times }
        return all
    }
    let elapsed = micros(ContinuousClock.now - start)
    let sorted = latencies.sorted()
    func percentile(_ p: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }
    return CallFigures(callsPerSecond: Double(sorted.count) / elapsed * 1e6, p50Micros: percentile(0.5), p99Micros: percentile(0.99))
}

func micros(_ d: Duration) -> Double {
    Double(d.components.seconds) * 1e6 + Double(d.components.attoseconds) / 1e12
}

/// User + system CPU time of this process, in seconds.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// Rough wire size of a body (strings and paths with their length and NUL,
/// fixed-size values, 8-byte struct alignment).
private func estimatedSize(_ values: [BusValue]) -> Int {
    values.reduce(0) { total, value in
        switch value {
        case let .string(s), let .objectPath(s), let .signature(s): total + 5 + s.utf8.count
        case .uint64, .int64, .double: total + 8
        case let .array(_, items): total + 4 + estimatedSize(items)
        case let .structure(fields): total + 8 + estimatedSize(fields)
        case let .variant(inner): total + 4 + estimatedSize([inner])
        default: total + 4
        }
    }
}

/// A private dbus-daemon that lets one connection keep many calls in flight.
func startBenchBus() throws -> TestDBusDaemon {
    try TestDBusDaemon(prefix: "vigil-dbus-api-bench") { directory in
        """
        <type>session</type><listen>unix:dir=\(directory)</listen><auth>EXTERNAL</auth>
        <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
        <limit name="max_replies_per_connection">100000</limit>
        """
    }
}
