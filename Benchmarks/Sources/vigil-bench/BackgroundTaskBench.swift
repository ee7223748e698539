// background-task: leases per second through the registry (power backend
// none, and logind against the python3-dbus stand-in on a private bus), and
// BeginBackgroundTask+End round trips per second from a D-Bus client; next
// to the D-Bus reference measured in the same run: dbus-test-tool echo (C
// libdbus) answering the same number of round trips on the same bus. The
// D-Bus figures are of the release vigild run as its own process.
import Foundation
import Glibc
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

func backgroundTaskBench(_ args: [String]) async throws {
    if args.first == LeaseFloor.childFlag {
        guard args.count == 2 else { throw BenchError("usage: vigil-bench background-task \(LeaseFloor.childFlag) BUS-ADDRESS") }
        LeaseFloor.serve(address: args[1])
    }
    guard let (numbers, rounds) = try roundsArguments(args, usage: "usage: vigil-bench background-task [leases] [--rounds K]", numbers: 1) else { return }
    let count = numbers.first ?? 2000
    let logindCount = max(1, count / 4)
    let clock = SystemClock()
    let bus = try startBenchBus()
    defer { bus.stop() }
    let address = bus.address
    print("background-task: \(count) leases per figure (\(logindCount) against the logind stand-in); private dbus-daemon; 2 cores shared by all.")

    // 1. The registry alone: acquire (with a 60 s budget, so a deadline
    //    watcher is armed) and release, power backend none.
    let none = LeaseRegistry(clock: clock, backend: NoPowerBackend(reason: "benchmark"))
    let noneRate = try await registryRate(none, count: count)
    print(String(format: "registry acquire+release, backend none:         %9.0f leases/s", noneRate))

    // 2. With logind: each acquire is Inhibit() on the stand-in (the fd is
    //    the lease), each release closes the fd. Reference: the same
    //    Inhibit calls and closes made directly, without the registry.
    let standIn = try LogindStandInProcess(busAddress: address)
    defer { standIn.stop() }
    let system = try await DBusConnection.connect(to: .address(address))
    let logind = LeaseRegistry(clock: clock, backend: LogindPowerBackend(connection: system, reason: "benchmark"))
    let logindRate = try await registryRate(logind, count: logindCount)
    let bareStart = ContinuousClock.now
    for _ in 0..<logindCount {
        let reply = try await system.call(destination: LogindPowerBackend.busName, path: LogindPowerBackend.path,
                                          interface: LogindPowerBackend.interface, member: "Inhibit",
                                          arguments: [.string("sleep"), .string("bench"), .string("bench"), .string("block")])
        if case .unixFD(let fd) = reply.body.first { fd.close() }
    }
    let bareRate = Double(logindCount) / (micros(ContinuousClock.now - bareStart) / 1e6)
    print(String(format: "registry acquire+release, backend logind:       %9.0f leases/s", logindRate))
    print(String(format: "  reference: bare Inhibit()+close on the stand-in: %7.0f /s   ratio %.2f", bareRate, logindRate / bareRate))
    await system.close()

    // 3. Client leases over D-Bus: the release vigild as its own process on
    //    the private bus (as a real host runs; the clients here do not share
    //    its threads), power backend none.
    let echo = try startEchoService(on: address)
    defer { kill(echo.processIdentifier, SIGKILL) }

    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-bgtask-bench-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let vigild = try await startBenchVigild(busAddress: address, dir: directory, hostSettings: """
        client_max_leases_per_uid = 100000
        client_max_budget_per_uid = "100000h"
        """)
    defer { vigild.terminate(); vigild.waitUntilExit() }
    print("BeginBackgroundTask figures: vigild (release build, its own process, pid \(vigild.processIdentifier)) on the private bus.")
    let client = try await DBusConnection.connect(to: .address(address))
    for _ in 0..<500 {
        if try await client.nameHasOwner(BenchAPI.echoName) { break }
        try await Task.sleep(for: .milliseconds(10))
    }
    let echoGet = BenchAPI.hostProperty(VigilAPI.Host.version, destination: BenchAPI.echoName)
    // The floor: the API's messages per lease from a minimal C server.
    let floor = try LeaseFloor.start(address: address)
    defer { floor.terminate(); floor.waitUntilExit() }
    // Where each figure's CPU goes: the server, the bus, this client.
    let parties = CPUParties(server: vigild.processIdentifier, echo: echo.processIdentifier, bus: bus.pid)
    let floorParties = CPUParties(server: floor.processIdentifier, echo: echo.processIdentifier, bus: bus.pid)
    // Each figure: K rounds of vigild, the floor and echo in turn; the rates
    // and ratios are the medians of the rounds (the echo reference alone
    // varied by up to half from one run to the next), the CPU per lease is
    // over all rounds.
    for inFlight in [1, 8] {
        var vigildRates: [Double] = [], floorRates: [Double] = [], echoRates: [Double] = []
        var leaseCPU = CPUParties.Sample(), floorCPU = CPUParties.Sample(), echoCPU = CPUParties.Sample()
        for _ in 0..<rounds {
            let leaseCost = parties.sample()
            vigildRates.append(try await beginEndRate(client, count: count, inFlight: inFlight))
            let leaseDone = parties.sample(), floorCost = floorParties.sample()
            floorRates.append(try await beginEndRate(client, count: count, inFlight: inFlight, destination: LeaseFloor.busName))
            let floorDone = floorParties.sample(), echoCost = parties.sample()
            echoRates.append(try await measureCalls(client, echoGet, calls: 2 * count, inFlight: inFlight).callsPerSecond / 2)
            let echoDone = parties.sample()
            leaseCPU.add(leaseDone, since: leaseCost)
            floorCPU.add(floorDone, since: floorCost)
            echoCPU.add(echoDone, since: echoCost)
        }
        let pairs = median(vigildRates), floorPairs = median(floorRates), echoPairs = median(echoRates)
        print("BeginBackgroundTask+End, \(inFlight) in flight (\(count) leases, 2 round trips each; median of \(rounds) rounds, each vigild, floor, echo in turn):")
        print(String(format: "  vigild:   %8.0f leases/s  (%8.0f round trips/s)", pairs, 2 * pairs))
        print(String(format: "  floor:    %8.0f leases/s  (%8.0f round trips/s; the API's messages from a minimal C server)", floorPairs, 2 * floorPairs))
        print(String(format: "  echo (C): %8.0f pairs/s   (%8.0f round trips/s, Properties.Get; D-Bus reference)", echoPairs, 2 * echoPairs))
        print("  ratio vigild / C reference: \(medianRatio(vigildRates, echoRates))")
        print("  ratio floor / C reference:  \(medianRatio(floorRates, echoRates)); vigild / floor: \(medianRatio(vigildRates, floorRates))")
        let lease = leaseCPU.per(count * rounds), floorLease = floorCPU.per(count * rounds), pair = echoCPU.per(count * rounds)
        let pairTotal = pair.echo + pair.bus + pair.client
        print(String(format: "  CPU per lease: vigild %.0f us (its event loop, the main thread, %.0f), dbus-daemon %.0f, this client %.0f; total %.0f us",
                     lease.server, lease.serverBusThread, lease.bus, lease.client, lease.server + lease.bus + lease.client))
        // Read against the bus's own CPU in the same phase (the same work
        // per lease), vigild's cost holds still while the machine's load moves.
        print(String(format: "  vigild / dbus-daemon CPU per lease: %.2f", lease.server / max(lease.bus, 1e-9)))
        print(String(format: "  CPU per floor lease: the C server %.0f us, dbus-daemon %.0f, this client %.0f; total %.0f us",
                     floorLease.server, floorLease.bus, floorLease.client, floorLease.server + floorLease.bus + floorLease.client))
        print(String(format: "  CPU per echo pair: dbus-test-tool %.0f us, dbus-daemon %.0f, this client %.0f; total %.0f us",
                     pair.echo, pair.bus, pair.client, pairTotal))
        print(String(format: "  dbus-daemon waits for input (voluntary context switches): %.2f per lease, %.2f per floor lease, %.2f per echo pair",
                     leaseCPU.busWaits(per: count * rounds), floorCPU.busWaits(per: count * rounds), echoCPU.busWaits(per: count * rounds)))
        // With calls in flight the two cores are the limit (each phase keeps
        // them about as busy), so the target of half of echo is a CPU budget:
        // a lease may cost twice an echo pair's CPU in all, and the bus's and
        // this client's part of vigild's leases comes out of it first. (One
        // in flight waits on round trips instead; no budget is printed.)
        if inFlight > 1 {
            let halfEchoLease = 2 * pairTotal, beforeServer = lease.bus + lease.client
            print(String(format: "  at half of echo a lease may cost %.0f us of CPU in all; the bus and this client took %.0f of vigild's, "
                         + "leaving vigild %.0f us per lease (it took %.0f; the bare C floor %.0f)",
                         halfEchoLease, beforeServer, halfEchoLease - beforeServer, lease.server, floorLease.server))
        }
    }
    let messages = try await messagesPerLease(client, address: address, server: VigilAPI.busName)
    let floorMessages = try await messagesPerLease(client, address: address, server: LeaseFloor.busName)
    print("  bus messages per lease: \(messages.signals) signals and 2 replies from vigild, 2 calls (echo pair: 2 calls, 2 replies), counted over \(messages.leases) leases")
    print("  the floor sent \(floorMessages.signals) signals per lease; one lease's signals \(floorMessages.lastLease == messages.lastLease ? "match vigild's" : "DIFFER from vigild's: \(floorMessages.lastLease) against \(messages.lastLease)")")
    let leftOver = try await activeLeaseCount(client)
    if leftOver != 0 { print("warning: \(leftOver) leases still active after the benchmark") }
    try await beginLatencyUnderReads(client: client, address: address, echoGet: echoGet, count: max(200, count / 4))
    await client.close()
}

/// How many leases vigild shows (Host.Leases).
private func activeLeaseCount(_ client: DBusConnection) async throws -> Int {
    let shown = try await client.call(BenchAPI.hostProperty(VigilAPI.Host.leases)).argument(0, as: DBusVariant.self)
    guard case let .array(_, paths) = shown.value else { throw DBusError.failed("Host.Leases is not an array") }
    return paths.count
}

/// Acquire + release through a registry, sequentially.
private func registryRate(_ registry: LeaseRegistry, count: Int) async throws -> Double {
    let request = LeaseRequest(holds: "bench", reason: "benchmark", budget: .seconds(60), power: PowerHold())
    let start = ContinuousClock.now
    for _ in 0..<count {
        let id = try await registry.acquire(strategy: "bench", request)
        await registry.release(id)
    }
    return Double(count) / (micros(ContinuousClock.now - start) / 1e6)
}

/// BeginBackgroundTask then End, `inFlight` clients at once on one connection (to vigild, or to `destination`).
private func beginEndRate(_ client: DBusConnection, count: Int, inFlight: Int, destination: String = VigilAPI.busName) async throws -> Double {
    let perCaller = count / inFlight
    let start = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for _ in 0..<inFlight {
            group.addTask {
                for _ in 0..<perCaller { try await client.beginAndEnd(reason: "benchmark", destination: destination) }
            }
        }
        try await group.waitForAll()
    }
    return Double(perCaller * inFlight) / (micros(ContinuousClock.now - start) / 1e6)
}

/// BeginBackgroundTask latency while 50 other clients (each its own
/// connection) keep reading: Properties.Get Host.Version and ListLeases,
/// with 200 leases held (client leases of one more connection). The reference: echo's Properties.Get
/// latency, measured by the same client under the same read load.
private func beginLatencyUnderReads(client: DBusConnection, address: String, echoGet: BenchCall, count: Int) async throws {
    let readerCount = 50
    // The 200 leases: client leases of another connection, ended by closing it.
    let holder = try await DBusConnection.connect(to: .address(address))
    var heldFDs: [BusFileDescriptor] = []
    for i in 0..<200 {
        let reply = try await holder.call(BenchAPI.beginBackgroundTask(name: "bench hold \(i)", reason: "read-load lease \(i)", budgetMicros: 3_600_000_000))
        if case .unixFD(let fd) = reply.body.last { heldFDs.append(fd) }
    }
    var connections: [DBusConnection] = []
    for _ in 0..<readerCount { connections.append(try await DBusConnection.connect(to: .address(address))) }
    let readers = connections
    let stop = ManagedAtomicFlag()
    let version = BenchAPI.hostProperty(VigilAPI.Host.version), listLeases = BenchAPI.host(VigilAPI.Host.listLeases)
    // Unstructured task: not cancelled: its readers stop when `stop` is set below, and it is
    // awaited.
    let load = Task {
        await withTaskGroup(of: Int.self) { group in
            for (index, reader) in readers.enumerated() {
                group.addTask {
                    var reads = 0
                    while !stop.isSet {
                        do {
                            try await reader.call((index + reads) % 2 == 0 ? version : listLeases)
                            reads += 1
                        } catch {
                            return reads
                        }
                    }
                    return reads
                }
            }
            var total = 0
            for await reads in group { total += reads }
            return total
        }
    }
    // Let every reader get going.
    try await Task.sleep(for: .milliseconds(300))
    let loadStart = ContinuousClock.now
    let begins = try await beginLatencies(client, count: count, reason: "latency under reads")
    let reference = try await measureCalls(client, echoGet, calls: count, inFlight: 1)
    let loadSeconds = micros(ContinuousClock.now - loadStart) / 1e6
    stop.set()
    let reads = await load.value
    for reader in readers { await reader.close() }
    for fd in heldFDs { fd.close() }
    await holder.close()
    print("BeginBackgroundTask latency while \(readerCount) clients read (Properties.Get and ListLeases, 200 leases), \(count) calls:")
    print(String(format: "  vigild:   p50 %8.2f ms   p99 %8.2f ms   (targets: p50 <= 10 ms, p99 <= 50 ms)",
                 begins.p50Micros / 1000, begins.p99Micros / 1000))
    print(String(format: "  echo (C) Properties.Get under the same load: p50 %8.2f ms   p99 %8.2f ms   (D-Bus reference)",
                 reference.p50Micros / 1000, reference.p99Micros / 1000))
    print(String(format: "  the readers were answered %.0f reads/s meanwhile", Double(reads) / max(loadSeconds, 1e-6)))
}

/// CPU time (schedstat, all threads) of the processes a D-Bus figure
/// involves, sampled between runs.
private struct CPUParties {
    let server: pid_t, echo: pid_t, bus: pid_t

    /// CPU nanoseconds of each party: at one moment (``sample()``), or
    /// summed over measured stretches (``add(_:since:)``).
    struct Sample {
        var server: Int64 = 0, serverBusThread: Int64 = 0, echo: Int64 = 0, bus: Int64 = 0, client: Int64 = 0
        /// dbus-daemon's voluntary context switches: each is a wait for
        /// more input, ended by a wake-up that a peer's write caused.
        var busWaits = 0

        mutating func add(_ after: Sample, since before: Sample) {
            server += after.server - before.server
            serverBusThread += after.serverBusThread - before.serverBusThread
            echo += after.echo - before.echo
            bus += after.bus - before.bus
            client += after.client - before.client
            busWaits += after.busWaits - before.busWaits
        }

        /// dbus-daemon's waits per item.
        func busWaits(per items: Int) -> Double { Double(busWaits) / Double(max(1, items)) }

        /// Microseconds per item of each party's CPU.
        func per(_ items: Int) -> (server: Double, serverBusThread: Double, echo: Double, bus: Double, client: Double) {
            func us(_ nanos: Int64) -> Double { Double(nanos) / 1000 / Double(max(1, items)) }
            return (us(server), us(serverBusThread), us(echo), us(bus), us(client))
        }
    }

    func sample() -> Sample {
        let busCost = threadCost(bus)
        return Sample(server: threadCost(server).cpuNanos, serverBusThread: threadCost(server, named: "vigild").cpuNanos,
                      echo: threadCost(echo).cpuNanos, bus: busCost.cpuNanos, client: threadCost(getpid()).cpuNanos,
                      busWaits: busCost.voluntary)
    }
}

/// The signals vigild sends per lease, counted by a listener on its own
/// connection over a few Begin+End pairs, up to the last lease's
/// `InterfacesRemoved` (after the timed runs: a listener makes the bus
/// deliver every signal, which costs the bus more). The Host's `Leases`
/// announcement, paced to one a second, is among them when it falls inside.
private func messagesPerLease(_ client: DBusConnection, address: String, server: String) async throws -> (signals: Double, leases: Int, lastLease: [String]) {
    let leases = 100
    let listener = try await DBusConnection.connect(to: .address(address))
    // Unstructured task: not cancelled: one close, which ends by itself (a defer cannot await).
    defer { Task { await listener.close() } }
    let signals = try await listener.signals(matching: DBusMatchRule(sender: server))
    var last = ""
    for _ in 0..<leases { last = try await client.beginAndEnd(reason: "count", destination: server) }
    var seen = 0
    // The last lease's own signals (not the paced root Leases), as
    // interface.member(signature), to compare the floor's with vigild's.
    var lastLease: [String] = []
    for await message in signals {
        seen += 1
        let aboutLast = message.path == last || message.body.first == .objectPath(last)
        if aboutLast { lastLease.append("\(message.interface ?? "").\(message.member ?? "")(\(message.signature))") }
        if message.member == "InterfacesRemoved", case .objectPath(last)? = message.body.first { break }
    }
    return (Double(seen) / Double(leases), leases, lastLease)
}
