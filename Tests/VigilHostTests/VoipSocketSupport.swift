import Foundation
import VigilTestSupport
import Glibc
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// The real voip-socket plugin, loaded from the build directory.
enum VoipSocketPlugin {
    static func kind() throws -> any StrategyKind {
        try PeriodicWakePlugin.loader.loadKind("voip-socket").get()
    }

    static func problems(_ values: [String: ConfigValue]) throws -> [String] {
        let reader = ConfigReader(strategyName: "voip", keyPath: "strategy[0]", values: values)
        _ = try kind().makeStrategy(reader)
        return reader.problems.map(\.description)
    }

    static func make(_ values: [String: ConfigValue]) throws -> any KeepAliveStrategy {
        let reader = ConfigReader(strategyName: "voip", keyPath: "strategy[0]", values: values)
        let s = try kind().makeStrategy(reader)
        guard reader.problems.isEmpty else { throw DescribedError("config problems: \(reader.problems)") }
        return s
    }
}

/// What a loopback test server saw, with times on `CLOCK_BOOTTIME` (or the
/// test clock it was given).
struct ServerEvent: Sendable {
    enum Kind: Sendable, Equatable { case accepted, ping, data, closedByClient }
    var kind: Kind
    var connection: Int
    var at: VigilInstant
    var bytes: [UInt8] = []
}

/// A TCP server on 127.0.0.1 running on its own thread (poll(2)), for the
/// voip-socket tests. It answers each `ping` it finds with `pong` while
/// `answering` is on, can greet (also right before closing, with
/// `closeOnAccept`), can chatter (send `chatter.bytes` on every connection
/// every `chatter.every`, from its own thread, so no stall of the tests'
/// tasks makes a silence), can close every connection at once, and
/// records what happened so tests can await it.
final class LoopbackServer: @unchecked Sendable {
    // Invariant: `answering`, `outgoing` and `stopped` are in `shared`
    // (`events` locks itself); the fds belong to the thread; `thread` is set
    // in init.
    private struct Shared {
        var answering: Bool
        var outgoing: [[UInt8]] = []
        var stopped = false
    }
    private let shared: Lock<Shared>
    private let events = WaitableLog<ServerEvent>()
    private let listenFD: Int32
    let port: UInt16
    let ping: [UInt8]
    let pong: [UInt8]
    let greeting: [UInt8]
    let closeOnAccept: Bool
    let chatter: (bytes: [UInt8], every: Duration)?
    let ipv6: Bool
    let clock: any VigilClock
    private var thread: Thread?

    /// Listens on 127.0.0.1, or on ::1 with `ipv6`, on a free port.
    init(ping: [UInt8] = Array("\r\n\r\n".utf8), pong: [UInt8] = Array("\r\n".utf8), greeting: [UInt8] = [],
         closeOnAccept: Bool = false, answering: Bool = true, ipv6: Bool = false,
         chatter: (bytes: [UInt8], every: Duration)? = nil, clock: any VigilClock = SystemClock()) throws {
        self.ping = ping
        self.pong = pong
        self.greeting = greeting
        self.closeOnAccept = closeOnAccept
        self.chatter = chatter
        self.clock = clock
        self.shared = Lock(Shared(answering: answering))
        self.ipv6 = ipv6
        let fd = socket(ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw DescribedError("socket: \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var storage = sockaddr_storage()
        let size: Int
        if ipv6 {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_addr = in6addr_loopback
            withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: address, as: sockaddr_in6.self) }
            size = MemoryLayout<sockaddr_in6>.size
        } else {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: address, as: sockaddr_in.self) }
            size = MemoryLayout<sockaddr_in>.size
        }
        let bound = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else { throw DescribedError("bind/listen: \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listenFD = fd
        port = withUnsafeBytes(of: &storage) { raw in
            ipv6 ? UInt16(bigEndian: raw.load(as: sockaddr_in6.self).sin6_port) : UInt16(bigEndian: raw.load(as: sockaddr_in.self).sin_port)
        }
        let t = Thread { [self] in serve() }
        t.name = "loopback-server"
        thread = t
        t.start()
    }

    var address: String { ipv6 ? "[::1]:\(port)" : "127.0.0.1:\(port)" }

    /// Whether pings get their pong.
    var answering: Bool {
        get { shared.withLock { $0.answering } }
        set { shared.withLock { $0.answering = newValue } }
    }

    /// Sends `bytes` on every open connection.
    func send(_ bytes: [UInt8]) { shared.withLock { $0.outgoing.append(bytes) } }

    func stop() { shared.withLock { $0.stopped = true } }

    var all: [ServerEvent] { events.all }
    func all(_ kind: ServerEvent.Kind) -> [ServerEvent] { all.filter { $0.kind == kind } }

    private func record(_ event: ServerEvent) { events.append(event) }

    /// Waits until `condition` holds for the events so far; false after `timeout`.
    func wait(timeout: Duration = .seconds(10), until condition: @escaping @Sendable ([ServerEvent]) -> Bool) async -> Bool {
        await events.wait(timeout: timeout, until: condition)
    }

    func count(_ kind: ServerEvent.Kind, atLeast n: Int, timeout: Duration = .seconds(10)) async -> Bool {
        await wait(timeout: timeout) { $0.filter { $0.kind == kind }.count >= n }
    }

    private func serve() {
        var clients: [(fd: Int32, id: Int, scan: [UInt8])] = []
        var nextID = 0
        var buffer = [UInt8](repeating: 0, count: 65536)
        _ = fcntl(listenFD, F_SETFL, fcntl(listenFD, F_GETFL) | O_NONBLOCK)
        var chattered = ContinuousClock.now
        while !shared.withLock({ $0.stopped }) {
            var fds = [pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)]
            fds += clients.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            _ = poll(&fds, nfds_t(fds.count), 20)
            let pending: [[UInt8]] = shared.withLock { shared in defer { shared.outgoing = [] }; return shared.outgoing }
            for bytes in pending { for c in clients { _ = write(c.fd, bytes, bytes.count) } }
            if let chatter, ContinuousClock.now - chattered >= chatter.every {
                chattered = ContinuousClock.now
                for c in clients { _ = write(c.fd, chatter.bytes, chatter.bytes.count) }
            }
            if fds[0].revents != 0 {
                while true {
                    let fd = accept(listenFD, nil, nil)
                    if fd < 0 { break }
                    nextID += 1
                    record(ServerEvent(kind: .accepted, connection: nextID, at: clock.now))
                    if closeOnAccept {
                        if !greeting.isEmpty { _ = write(fd, greeting, greeting.count) }
                        close(fd)
                        continue
                    }
                    if !greeting.isEmpty { _ = write(fd, greeting, greeting.count) }
                    clients.append((fd, nextID, []))
                }
            }
            var closed: Set<Int32> = []
            for (i, entry) in fds.enumerated().dropFirst() where entry.revents != 0 {
                let client = clients[i - 1]
                let n = read(client.fd, &buffer, buffer.count)
                if n <= 0 {
                    record(ServerEvent(kind: .closedByClient, connection: client.id, at: clock.now))
                    closed.insert(client.fd)
                    continue
                }
                let now = clock.now
                var scan = client.scan + buffer[0..<n]
                record(ServerEvent(kind: .data, connection: client.id, at: now, bytes: Array(buffer[0..<n])))
                while let r = scan.firstRange(of: ping) {
                    scan.removeSubrange(..<r.upperBound)
                    record(ServerEvent(kind: .ping, connection: client.id, at: now))
                    if answering { _ = write(client.fd, pong, pong.count) }
                }
                clients[i - 1].scan = Array(scan.suffix(ping.count))
            }
            for fd in closed { close(fd) }
            clients.removeAll { closed.contains($0.fd) }
        }
        for c in clients { close(c.fd) }
        close(listenFD)
    }
}

/// Host pieces on the real clock, running voip-socket instances under a supervisor.
struct VoipHarness {
    let clock: any VigilClock
    let registry: LeaseRegistry
    let events = RecordingEvents()
    let logs = WaitableLog<LogLine>()
    let supervisor: Supervisor
    /// What the instances cost (their bytes, as the host counts them).
    let costs: StrategyCosts

    /// The test clock and the host's wake scheduler it drives, for
    /// ``armed()``; nil on the real clock.
    private(set) var testWake: (clock: ManualClock, scheduler: WakeScheduler, timer: ClockDrivenWakeTimer)?

    /// On the test clock, with the host's wake scheduler driven by it.
    init(testClock clock: ManualClock) throws {
        let timer = ClockDrivenWakeTimer(clock: clock)
        let scheduler = WakeScheduler(clock: clock, timer: timer)
        try self.init(clock: clock, scheduler: scheduler)
        testWake = (clock, scheduler, timer)
    }

    /// Waits until the connections' next keep-alive rounds wait on the
    /// test clock: their group's wake request is with the scheduler and its
    /// timer sleeps on the clock (``ManualClock/armed(_:timer:requests:)``).
    /// A round is put on the schedule from the plugin's own threads and
    /// tasks: time moved before its request arrives would fire it late.
    func armed() async throws {
        guard let testWake else { return }
        try await testWake.clock.armed(testWake.scheduler, timer: testWake.timer, requests: 1)
    }

    init(clock: any VigilClock = SystemClock(), scheduler: (any WakeScheduling)? = nil, hooks: (any HookRunning)? = nil) throws {
        self.clock = clock
        registry = LeaseRegistry(clock: clock)
        let events = self.events
        let hooks = hooks
        let costs = StrategyCosts(clock: clock)
        self.costs = costs
        var services = StrategyServices(
            registry: registry, scheduler: try scheduler ?? WakeScheduler.system(clock: clock), clock: clock, logging: logs.logging,
            hooks: { name, log in hooks ?? HookRunner(strategy: name, log: log) }, events: { _ in events })
        services.cost = { costs.recorder(for: $0) }
        supervisor = Supervisor(services: services)
    }

    func start(_ values: [String: ConfigValue], name: String = "voip") async throws {
        let strategy = try VoipSocketPlugin.make(values)
        await supervisor.start([SupervisedStrategy(name: name, kind: "voip-socket", strategy: strategy)])
    }

    /// The live status of the lease `name` holds.
    func status(_ name: String = "voip") async -> [String: StatusValue] {
        await registry.active.first { $0.strategy == name }?.status ?? [:]
    }

    /// Waits (bounded) until the status of `name` satisfies `condition`.
    func waitForStatus(_ name: String = "voip", timeout: Duration = .seconds(10), _ condition: @escaping @Sendable ([String: StatusValue]) -> Bool) async -> [String: StatusValue] {
        let stream = await registry.events()
        let current = await status(name)
        if condition(current) { return current }
        let found = Task { () -> [String: StatusValue]? in
            for await e in stream where e.lease.strategy == name && condition(e.lease.status) { return e.lease.status }
            return nil
        }
        let timer = Task { try? await Task.sleep(for: timeout); found.cancel() }
        defer { timer.cancel() }
        if let value = await found.value { return value }
        return await status(name)
    }

    /// Waits (bounded) until the statuses of all of `names` satisfy `condition`.
    func waitForAll(_ names: [String], timeout: Duration = .seconds(20), _ condition: @escaping @Sendable ([String: StatusValue]) -> Bool) async -> Bool {
        let stream = await registry.events()
        var waiting = Set(names)
        for lease in await registry.active where waiting.contains(lease.strategy) && condition(lease.status) {
            waiting.remove(lease.strategy)
        }
        if waiting.isEmpty { return true }
        let found = Task { [waiting] () -> Bool in
            var left = waiting
            for await e in stream where left.contains(e.lease.strategy) && condition(e.lease.status) {
                left.remove(e.lease.strategy)
                if left.isEmpty { return true }
            }
            return false
        }
        let timer = Task { try? await Task.sleep(for: timeout); found.cancel() }
        defer { timer.cancel() }
        return await found.value
    }

    /// Records of `event` so far.
    func recorded(_ event: String) -> [[String: String]] { events.all.filter { $0.name == event }.map(\.fields) }

    /// Waits (bounded) until `event` was recorded at least `count` times.
    func waitForEvent(_ event: String, count: Int = 1, timeout: Duration = .seconds(10)) async -> Bool {
        await events.wait(timeout: timeout) { $0.filter { $0.name == event }.count >= count }
    }
}

extension StatusValue {
    var uintValue: UInt64 { if case .uint(let v) = self { v } else { 0 } }
    var stringValue: String { if case .string(let v) = self { v } else { "" } }
    var intValue: Int64 { if case .int(let v) = self { v } else { 0 } }
}

func strings(_ values: [String]) -> ConfigValue { .array(values.map(ConfigValue.string)) }

/// The host's wake scheduler, noting the label and the waiting task's
/// priority of every request it passes on.
final class PriorityRecordingScheduler: WakeScheduling {
    struct Request: Sendable, CustomStringConvertible {
        var label: String
        var priority: TaskPriority
        var description: String { "\(label) at \(priority)" }
    }

    private let inner: WakeScheduler
    private let seen = Lock<[Request]>([])

    init(_ inner: WakeScheduler) { self.inner = inner }

    var requests: [Request] { seen.withLock { $0 } }
    var clockInfo: WakeClockInfo { inner.clockInfo }

    func wake(_ request: WakeRequest) async throws -> WakeFiring {
        let priority = Task.currentPriority
        seen.withLock { $0.append(Request(label: request.label, priority: priority)) }
        return try await inner.wake(request)
    }
}
