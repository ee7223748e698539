import Foundation
import Glibc
import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// voip-socket against real TCP servers on 127.0.0.1. Intervals are short
/// (hundreds of milliseconds) where real sockets and real timers are the
/// point; the test clock makes the handler deadline exact.
@Suite struct VoipSocketTests {
    @Test func badOptionsAreRefusedClearly() throws {
        let text = try VoipSocketPlugin.problems([
            "connect": .string("::1:5060"), "keepalive_interval": .string("10s"), "handler_timeout": .string("20s"),
            "jitter": .string("150%"), "ping": .string("\\q"), "expect": .string("\\x4"),
            "reconnect": .table(["initial": .string("5s"), "max": .string("1s"), "jittr": .boolean(true)]),
            "tcp_keepalive": .table(["idle": .string("1.5s"), "count": .integer(0)]),
        ]).joined(separator: "\n")
        #expect(text.contains("strategy[0].connect: an IPv6 address needs brackets"), "\(text)")
        #expect(text.contains("strategy[0].handler_timeout: must be shorter than keepalive_interval (10s), found 20s"))
        #expect(text.contains("strategy[0].jitter: expected a fraction from 0 up to (not including) 1, found 1.5"))
        #expect(text.contains("strategy[0].ping: unknown escape \\q"))
        #expect(text.contains("strategy[0].expect: expected two hex digits after \\x"))
        #expect(text.contains("strategy[0].reconnect.max: must not be shorter than initial (5s), found 1s"))
        #expect(text.contains("strategy[0].reconnect.jittr: unknown key \"jittr\" (did you mean \"jitter\"?)"))
        #expect(text.contains("strategy[0].tcp_keepalive.idle: expected whole seconds"))
        #expect(text.contains("strategy[0].tcp_keepalive.count: expected an integer in 1...127, found 0"))
        for (connect, message) in [
            ("sip.example.org", "missing \":port\""), ("host:0", "port \"0\" is not a number in 1...65535"),
            ("[::1:5060", "missing \"]\""), (":5060", "empty or blank host"),
        ] {
            let problems = try VoipSocketPlugin.problems(["connect": .string(connect)]).joined()
            #expect(problems.contains("strategy[0].connect: \(message)"), "\(connect): \(problems)")
        }
        #expect(try VoipSocketPlugin.problems([:]).joined().contains("strategy[0].connect: missing required key"))
        #expect(try VoipSocketPlugin.problems(["connect": .string("[::1]:5060"), "align": .boolean(true), "jitter": .string("10%")]).isEmpty)
    }

    /// An IPv6 peer (`[::1]:port`): connected, pinged and answered; the
    /// lease shows both IPv6 addresses.
    @Test func connectsToAnIPv6Peer() async throws {
        let server = try LoopbackServer(ipv6: true)
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("200ms"), "jitter": .integer(0),
            "handler_timeout": .string("150ms"), "expect": .string("\r\n"),
        ])
        #expect(await server.count(.ping, atLeast: 2))
        let status = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 2 }
        await h.supervisor.stopAll()
        #expect(status["Remote"]?.stringValue == server.address, "\(status)")
        #expect(status["Local"]?.stringValue.hasPrefix("[::1]:") == true, "\(status)")
        #expect(status["Overruns"]?.uintValue == 0)
    }

    /// Pings come at a random 80–100 % of the interval, each with its pong;
    /// the lease shows the figures.
    @Test func pingsArriveInsideTheJitterWindow() async throws {
        let server = try LoopbackServer()
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("300ms"), "jitter": .float(0.3),
            "handler_timeout": .string("200ms"), "ping": .string("\\r\\n\\r\\n"), "expect": .string("\r\n"),
            "skip_ping_on_traffic": .boolean(false),
        ])
        // Twelve pings: one stall of the machine (the whole suite on two
        // cores) makes up to two late gaps, which eleven gaps absorb.
        #expect(await server.count(.ping, atLeast: 12))
        let status = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 11 }
        await h.supervisor.stopAll()
        let pings = server.all(.ping).map(\.at)
        let gaps = zip(pings.dropFirst(), pings).map { ($0 - $1).seconds * 1000 }
        // Window [210, 300] ms: never early; a loaded machine (the whole suite
        // on two cores) may deliver one late, but most land inside. A stall
        // while other suites start their daemons delayed one gap to 783 ms
        // (seen with the D-Bus, metrics and voip suites on two cores): a late
        // gap may be up to 1.5 s, and three in four must be in the window.
        for gap in gaps {
            #expect(gap >= 205 && gap <= 300 + 1200, "gap \(gap) ms outside [210, 300] ms; all: \(gaps)")
        }
        #expect(gaps.filter { $0 <= 300 + 30 }.count * 4 >= gaps.count * 3, "most gaps late: \(gaps)")
        #expect((gaps.max() ?? 0) - (gaps.min() ?? 0) > 5, "no jitter: \(gaps)")
        #expect(server.all(.accepted).count == 1, "\(h.logs.entries)")
        #expect(status["State"]?.stringValue == "up")
        #expect(status["Remote"]?.stringValue == server.address)
        #expect(status["Local"]?.stringValue.hasPrefix("127.0.0.1:") == true)
        #expect(status["LastRttUsec"].map { $0.intValue >= 0 && $0.intValue < 100_000 } == true, "\(status)")
        #expect(status["Overruns"]?.uintValue == 0 && status["Reconnects"]?.uintValue == 0)
        // The bytes on the network are the strategy's: four a ping, two a pong.
        let cost = h.costs.cost(of: "voip")
        #expect(cost.bytesSent >= 4 * UInt64(pings.count) && cost.bytesSent % 4 == 0, "\(cost), \(pings.count) pings")
        #expect(cost.bytesReceived >= 2 * (status["Pings"]?.uintValue ?? 0), "\(cost), \(status)")
    }

    /// The keep-alive rounds wait for their wake in a high-priority task:
    /// Swift's pool runs those on threads of their own, so a round's pings
    /// are not held up while every default-priority thread is busy (a
    /// plugin's blocking work; in this suite, the other tests starting their
    /// servers on two cores, which made pings 50-280 ms late in CI). The
    /// scheduler's side is `WakeTimerFDTests.expiryIsDeliveredAtHighPriority`.
    @Test func keepAliveRoundsWaitAtHighPriority() async throws {
        let server = try LoopbackServer()
        defer { server.stop() }
        let scheduler = PriorityRecordingScheduler(try WakeScheduler.system())
        let h = try VoipHarness(scheduler: scheduler)
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("200ms"), "jitter": .integer(0),
            "handler_timeout": .string("150ms"), "expect": .string("\r\n"), "skip_ping_on_traffic": .boolean(false),
        ])
        #expect(await server.count(.ping, atLeast: 2))
        await h.supervisor.stopAll()
        let rounds = scheduler.requests.filter { $0.label.hasPrefix("voip-socket keep-alive") }
        #expect(rounds.count >= 2, "\(scheduler.requests)")
        #expect(rounds.allSatisfy { $0.priority == .high }, "\(rounds)")
    }

    /// A server that accepts and never answers: the handler is cut off
    /// within 100 ms of its deadline, the connection closed and reconnected.
    @Test func handlerTimeoutIsEnforcedWithin100ms() async throws {
        let server = try LoopbackServer(answering: false)
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("300ms"), "handler_timeout": .string("250ms"),
            "expect": .string("\r\n"), "reconnect": .table(["initial": .string("50ms"), "max": .string("50ms")]),
        ])
        // Bounded generously: only the cut-offs below are timed.
        #expect(await server.count(.accepted, atLeast: 4, timeout: .seconds(30)))
        let status = await h.waitForStatus { $0["Overruns"]?.uintValue ?? 0 >= 3 }
        #expect(await h.waitForEvent("handler-overrun", count: 3))
        await h.supervisor.stopAll()
        // None came early, by the strategy's own clock: each overrun's
        // lateness is read from the instant its ping was due.
        let lateness = h.recorded("handler-overrun").compactMap { $0["late_ms"].flatMap(Int.init) }
        #expect(lateness.count >= 3 && lateness.allSatisfy { $0 >= 0 }, "cut off before handler_timeout: \(h.recorded("handler-overrun"))")
        // Three overruns, measured at the server from the ping to the close:
        // the best shows the deadline is enforced within 100 ms; the others
        // may be later when the rest of the suite loads both cores (a 2-core
        // machine running every test at once). The server's thread stamps a
        // ping when it reads it, which a loaded machine can delay by tens of
        // milliseconds more than the close (241.8 ms once, 180.4 ms once
        // beside the other suites), so the server's lower bound is read on
        // the latest of the three: a deadline enforced early is early for
        // every connection. Each one's own is the strategy's `late_ms` above.
        var cutOffs: [Double] = []
        for connection in 1...3 {
            let ping = try #require(server.all(.ping).first { $0.connection == connection })
            let closed = try #require(server.all(.closedByClient).first { $0.connection == connection })
            cutOffs.append((closed.at - ping.at).seconds * 1000)
        }
        #expect((cutOffs.max() ?? 0) >= 200, "closed well before handler_timeout (250 ms): \(cutOffs) ms after the ping")
        #expect((cutOffs.min() ?? .infinity) <= 250 + 100, "closed \(cutOffs) ms after the ping; handler_timeout is 250 ms")
        #expect(cutOffs.allSatisfy { $0 <= 250 + 1_000 }, "\(cutOffs)")
        #expect(status["LastError"]?.stringValue.contains("overran handler_timeout (250ms): no pong") == true, "\(status)")
        #expect(h.recorded("handler-overrun").count >= 1)
    }

    /// The same deadline on the test clock: not a millisecond early or late.
    @Test func handlerDeadlineIsExactOnTheTestClock() async throws {
        let clock = ManualClock()
        let server = try LoopbackServer(answering: false)
        defer { server.stop() }
        let h = try VoipHarness(testClock: clock)
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("60s"), "jitter": .integer(0), "handler_timeout": .string("10s"),
            "expect": .string("\r\n"), "reconnect": .table(["initial": .string("1h")]),
        ])
        #expect(await h.waitForStatus { $0["State"]?.stringValue == "up" }["State"]?.stringValue == "up")
        try await h.armed()
        await clock.advance(by: .seconds(60))
        #expect(await server.count(.ping, atLeast: 1))
        await clock.advance(by: .seconds(10) - .milliseconds(1))
        await clock.settle()
        #expect(await h.status()["Overruns"]?.uintValue == 0)
        #expect(server.all(.closedByClient).isEmpty)
        await clock.advance(by: .milliseconds(1))
        #expect(await server.count(.closedByClient, atLeast: 1))
        #expect(await h.waitForStatus { $0["Overruns"]?.uintValue == 1 }["Overruns"]?.uintValue == 1)
        await h.supervisor.stopAll()
    }

    /// Handlers with different deadlines on one clock (they share one
    /// deadline watcher): each is cut off at its own deadline, the shorter
    /// first, whichever pinged first.
    @Test func handlerDeadlinesOfSeveralConnectionsEachHold() async throws {
        let clock = ManualClock()
        let server = try LoopbackServer(answering: false)
        defer { server.stop() }
        let h = try VoipHarness(testClock: clock)
        for (name, timeout) in [("long", "10s"), ("short", "2s")] {
            try await h.start([
                "connect": .string(server.address), "keepalive_interval": .string("60s"), "jitter": .integer(0), "handler_timeout": .string(timeout),
                "expect": .string("\r\n"), "reconnect": .table(["initial": .string("1h")]),
            ], name: name)
            #expect(await h.waitForStatus(name) { $0["State"]?.stringValue == "up" }["State"]?.stringValue == "up")
        }
        try await h.armed()
        await clock.advance(by: .seconds(60))
        #expect(await server.count(.ping, atLeast: 2))
        await clock.advance(by: .seconds(2))
        #expect(await h.waitForStatus("short") { $0["Overruns"]?.uintValue == 1 }["Overruns"]?.uintValue == 1)
        await clock.settle()
        #expect(await h.status("long")["Overruns"]?.uintValue == 0)
        await clock.advance(by: .seconds(8))
        #expect(await h.waitForStatus("long") { $0["Overruns"]?.uintValue == 1 }["Overruns"]?.uintValue == 1)
        await h.supervisor.stopAll()
    }

    /// A handler that starts after its window's end is counted as late; one
    /// that starts at the end exactly is not (test clock).
    @Test func lateHandlerStartsAreCounted() async throws {
        let clock = ManualClock()
        let server = try LoopbackServer()
        defer { server.stop() }
        let h = try VoipHarness(testClock: clock)
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("60s"), "jitter": .integer(0),
            "handler_timeout": .string("10s"), "expect": .string("\r\n"),
        ])
        #expect(await h.waitForStatus { $0["State"]?.stringValue == "up" }["State"]?.stringValue == "up")
        try await h.armed()
        await clock.advance(by: .seconds(60))
        let onTime = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 1 }
        #expect(onTime["Pings"]?.uintValue == 1 && onTime["LatePings"]?.uintValue == 0, "\(onTime)")
        // One jump past the next window's end (a frozen process): the wake
        // fires 1 s late.
        await clock.jump(by: .seconds(61))
        let late = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 2 }
        #expect(late["Pings"]?.uintValue == 2 && late["LatePings"]?.uintValue == 1, "\(late)")
        await h.supervisor.stopAll()
    }

    /// A pong that stops coming makes the strategy reconnect.
    @Test func missingPongLeadsToReconnect() async throws {
        let server = try LoopbackServer()
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("200ms"), "handler_timeout": .string("150ms"),
            "expect": .string("\r\n"), "reconnect": .table(["initial": .string("20ms"), "max": .string("20ms")]),
        ])
        #expect(await server.count(.ping, atLeast: 2))
        server.answering = false
        #expect(await server.count(.accepted, atLeast: 2))
        server.answering = true
        let status = await h.waitForStatus { $0["Reconnects"]?.uintValue ?? 0 >= 1 && $0["State"]?.stringValue == "up" }
        await h.supervisor.stopAll()
        #expect(status["Overruns"]?.uintValue ?? 0 >= 1, "\(status)")
        #expect(h.recorded("disconnected").first?["reason"]?.contains("no pong") == true, "\(h.logs.entries)")
    }

    /// Bytes and the peer's close read in one go (the event thread stops
    /// reading at a short read, but not when the event reported the close):
    /// the close is noticed at once, not at the next ping a minute later.
    @Test func closeRightAfterDataIsNoticedAtOnce() async throws {
        let server = try LoopbackServer(greeting: Array("bye\r\n".utf8), closeOnAccept: true)
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("60s"),
            "reconnect": .table(["initial": .string("20ms"), "max": .string("20ms")]),
        ])
        #expect(await server.count(.accepted, atLeast: 3, timeout: .seconds(20)))
        let status = await h.waitForStatus { $0["Reconnects"]?.uintValue ?? 0 >= 2 }
        await h.supervisor.stopAll()
        let lastError = status["LastError"]?.stringValue ?? ""
        #expect(lastError == "the peer closed the connection" || lastError == "the peer reset the connection", "\(status)")
    }

    /// A server that closes every connection: reconnects back off with full
    /// jitter, each delay inside [0, min(max, initial * 2^n)].
    @Test func serverCloseBacksOffWithinBounds() async throws {
        let server = try LoopbackServer(closeOnAccept: true)
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("10s"),
            "reconnect": .table(["initial": .string("40ms"), "max": .string("160ms"), "jitter": .boolean(true)]),
        ])
        #expect(await server.count(.accepted, atLeast: 9, timeout: .seconds(30)))
        // Statuses reach the registry soon after the change, not at once.
        let status = await h.waitForStatus { ($0["Reconnects"]?.uintValue ?? 0) >= 8 }
        await h.supervisor.stopAll()
        let accepts = server.all(.accepted).map(\.at)
        let gaps = zip(accepts.dropFirst(), accepts).map { ($0 - $1).seconds * 1000 }
        // The delays the strategy chose, from its log: "in 23ms (attempt 2)".
        let chosen: [Double] = h.logs.entries.compactMap { line in
            guard let r = line.range(of: " in "), let end = line.range(of: " (attempt ") else { return nil }
            guard case .success(let d) = DurationSyntax.parse(String(line[r.upperBound..<end.lowerBound])) else { return nil }
            return d.seconds * 1000
        }
        #expect(chosen.count >= 8, "\(h.logs.entries)")
        for (n, delay) in chosen.prefix(8).enumerated() {
            let ceiling = min(160, 40 * Double(1 << n))
            #expect(delay >= 0 && delay <= ceiling, "delay \(n): \(delay) ms, bound \(ceiling) ms; all: \(chosen)")
        }
        for (n, (gap, delay)) in zip(gaps, chosen).prefix(8).enumerated() {
            // The time between connections holds the delay (never less); on top
            // of it, noticing the close and connecting again, which a loaded
            // 2-core machine can stretch (5.3 s seen with three builds beside
            // the suite): the upper bound only catches a lost reconnect.
            #expect(gap >= delay - 1 && gap <= delay + 10_000, "gap \(n): \(gap) ms for a delay of \(delay) ms")
        }
        // Full jitter: not every delay sits at its ceiling.
        #expect(chosen.prefix(8).enumerated().contains { $1 < 0.8 * min(160, 40 * Double(1 << $0)) }, "\(chosen)")
        #expect(status["Reconnects"]?.uintValue ?? 0 >= 8, "\(status)")
        let lastError = status["LastError"]?.stringValue ?? ""
        #expect(lastError == "the peer closed the connection" || lastError == "the peer reset the connection", "\(status)")
    }

    /// What the server sends reaches the on_data hook on its stdin; the pong
    /// does not.
    @Test func serverDataReachesTheOnDataHook() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("voip-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let out = dir.appendingPathComponent("incoming").path
        let server = try LoopbackServer(greeting: Array("INVITE sip:alice@example.org SIP/2.0\r\n".utf8))
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("10s"), "expect": .string("\r\n"),
            "on_data": strings(["sh", "-c", "cat >> \(out); echo \" [$VIGIL_EVENT $VIGIL_BYTES]\" >> \(out)"]),
            "on_data_timeout": .string("5s"),
        ])
        #expect(await h.waitForEvent("data"))
        await h.supervisor.stopAll()
        let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        #expect(text == "INVITE sip:alice@example.org SIP/2.0\r\n [data 38]\n", "\(text.debugDescription)")
        #expect(h.recorded("data").first?["exit"] == "exited with status 0")
    }

    /// Traffic from the server proves the link alive: no ping is needed.
    @Test func trafficSkipsThePing() async throws {
        // The server talks every 100 ms from its own thread: a stall of the
        // tests' tasks (the rest of the suite on two cores) cannot make a
        // silence the strategy would rightly fill with a ping.
        let server = try LoopbackServer(chatter: (Array("NOTIFY\r\n".utf8), .milliseconds(100)))
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("300ms"), "expect": .string("\r\n"),
            "handler_timeout": .string("200ms"),
        ])
        #expect(await server.count(.accepted, atLeast: 1))
        let status = await h.waitForStatus { $0["SkippedPings"]?.uintValue ?? 0 >= 2 }
        await h.supervisor.stopAll()
        #expect(server.all(.ping).count <= 1, "pings despite traffic: \(server.all(.ping).count), accepted \(server.all(.accepted).count); \(h.logs.entries)")
        #expect(status["SkippedPings"]?.uintValue ?? 0 >= 2, "\(status)")
    }

    /// TCP keepalive options reach the socket (ss shows the keepalive timer).
    @Test func tcpKeepaliveIsSetOnTheSocket() async throws {
        let server = try LoopbackServer()
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("10m"),
            "tcp_keepalive": .table(["idle": .string("42s"), "interval": .string("5s"), "count": .integer(4)]),
        ])
        let status = await h.waitForStatus { $0["State"]?.stringValue == "up" }
        let local = status["Local"]?.stringValue ?? ""
        let ss = try runProcess("/usr/bin/ss", ["-tno", "state", "established", "src", local])
        await h.supervisor.stopAll()
        // 42 s idle, counting down from when the link went quiet (the
        // kernel's default would show about 120min).
        let left = ss.range(of: #"timer:\(keepalive,(\d+)sec"#, options: .regularExpression).flatMap { match in
            Int(ss[match].drop { !$0.isNumber }.prefix { $0.isNumber })
        }
        #expect(left.map { (1...42).contains($0) } == true, "\(ss)")
    }

    /// Bad address, unresolvable name, refused connection: clear errors,
    /// and retries that back off instead of spinning.
    @Test func failuresGiveClearErrorsAndBackOff() async throws {
        // A bound socket that does not listen: connecting to it is refused,
        // and no other test's server can take its port meanwhile.
        let reserved = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(reserved) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(reserved, $0, length) == 0 && getsockname(reserved, $0, &length) == 0 }
        }
        #expect(bound)
        let port = UInt16(bigEndian: address.sin_port)
        let h = try VoipHarness()
        let backoff: ConfigValue = .table(["initial": .string("100ms"), "max": .string("400ms")])
        try await h.start(["connect": .string("127.0.0.1:\(port)"), "reconnect": backoff], name: "refused")
        try await h.start(["connect": .string("no-such-host.invalid:5060"), "reconnect": backoff, "connect_timeout": .string("2s")], name: "unresolvable")
        // A multicast group is no TCP peer: the kernel refuses at once.
        try await h.start(["connect": .string("224.0.0.1:5060"), "reconnect": backoff], name: "unreachable")
        let window = ContinuousClock.now
        // Each gives up and tries again: wait (bounded) for a second attempt at
        // every remote. A name the resolver cannot answer may take the whole
        // connect_timeout per attempt, where DNS times out instead of saying NXDOMAIN.
        let remotes = ["127.0.0.1:\(port)", "no-such-host.invalid:5060", "224.0.0.1:5060"]
        let retried = await h.events.wait(timeout: .seconds(20)) { all in
            let failed = all.filter { $0.name == "connect-failed" }
            return remotes.allSatisfy { remote in failed.filter { $0.fields["remote"] == remote }.count >= 2 }
        }
        let failures = h.recorded("connect-failed")
        let elapsed = (ContinuousClock.now - window).seconds
        // A status goes to the registry after its event, through the
        // plugin's publisher (gathered for 25 ms): the two can race.
        let failed: @Sendable ([String: StatusValue]) -> Bool = { !($0["LastError"]?.stringValue ?? "").isEmpty }
        let refused = await h.waitForStatus("refused") { failed($0) && $0["Reconnects"]?.uintValue ?? 0 >= 1 }
        let unresolvable = await h.waitForStatus("unresolvable", failed)
        let unreachable = await h.waitForStatus("unreachable", failed)
        await h.supervisor.stopAll()
        let byRemote = Dictionary(grouping: failures, by: { $0["remote"] ?? "" })
        #expect(retried, "\(byRemote.mapValues(\.count)) in \(elapsed) s")
        #expect(Set(byRemote.keys) == Set(remotes), "\(byRemote.keys)")
        for (remote, list) in byRemote {
            // Delays average 50, 100, 200, 200... ms: at most one try per 50 ms,
            // a dozen in the first 2 s. A busy loop makes thousands.
            #expect(list.count >= 2 && Double(list.count) <= 4 + elapsed * 20, "\(remote): \(list.count) attempts in \(elapsed) s")
        }
        #expect(refused["LastError"]?.stringValue.contains("connect to 127.0.0.1:\(port) failed: Connection refused") == true, "\(refused)")
        let resolveError = unresolvable["LastError"]?.stringValue ?? ""
        #expect(resolveError.contains("cannot resolve \"no-such-host.invalid\"") || resolveError.contains("timed out after 2s"), "\(resolveError)")
        let unreachableError = unreachable["LastError"]?.stringValue ?? ""
        #expect(unreachableError.contains("connect to 224.0.0.1:5060 failed: Network is unreachable"), "\(unreachableError)")
        #expect(["backoff", "connecting"].contains(refused["State"]?.stringValue ?? ""))
        #expect(refused["Reconnects"]?.uintValue ?? 0 >= 1)
    }
}

func runProcess(_ path: String, _ arguments: [String]) throws -> String {
    try ProcessRunner.run(path, arguments).output
}

/// How the plugin hands statuses to the host.
@Suite struct VoipSocketStatusBatchTests {
    /// Many connections' statuses reach the host in batches, one call for
    /// many leases: while the first call into the lease status sink is held,
    /// the other connections' changes queue up and go together after it, and
    /// every connection's status still lands in the registry.
    @Test func statusesOfManyConnectionsGoToTheHostInBatches() async throws {
        let server = try LoopbackServer()
        defer { server.stop() }
        let clock = SystemClock()
        let registry = LeaseRegistry(clock: clock)
        let sink = GatedStatusSink(registry: registry)
        // However the test ends, the plugin's one publisher goes on (other
        // tests in this process share it).
        defer { sink.open() }
        let scheduler = try WakeScheduler.system(clock: clock)
        let logs = WaitableLog<LogLine>()
        let n = 8
        let stream = await registry.events()
        let strategies = try (0..<n).map { i -> (String, any KeepAliveStrategy) in
            ("voip\(i)", try VoipSocketPlugin.make([
                "connect": .string(server.address), "keepalive_interval": .string("500ms"),
                "handler_timeout": .string("400ms"), "expect": .string("\r\n"),
            ]))
        }
        let running = Task {
            await withTaskGroup(of: Void.self) { group in
                for (name, strategy) in strategies {
                    let log = logs.logger(name)
                    let context = StrategyContext(
                        name: name, kind: "voip-socket", log: log,
                        leases: GatedLeases(inner: StrategyLeases(registry: registry, strategy: name), sink: sink),
                        scheduler: scheduler, hooks: HookRunner(strategy: name, log: log), clock: clock, events: RecordingEvents())
                    group.addTask { try? await strategy.run(in: context) }
                }
            }
        }
        defer { running.cancel() }
        // Every connection changed its status (connecting, up) while the
        // first call was held.
        #expect(await server.count(.accepted, atLeast: n))
        sink.open()
        let answered = Task { () -> Set<String> in
            var pinged: Set<String> = []
            for await event in stream where event.kind == .status && (event.lease.status["Pings"]?.uintValue ?? 0) >= 1 {
                pinged.insert(event.lease.strategy)
                if pinged.count == n { break }
            }
            return pinged
        }
        let timer = Task { try? await Task.sleep(for: .seconds(20)); answered.cancel() }
        defer { timer.cancel() }
        let pinged = await answered.value
        #expect(pinged.count == n, "statuses with a ping answered: \(pinged.sorted()); \(logs.entries)")
        #expect((sink.batchSizes.max() ?? 0) >= 2, "calls into the sink carried \(sink.batchSizes) statuses")
        running.cancel()
        await running.value
    }
}

/// A round of more connections than the plugin pops one by one (64): the
/// schedule and the handler deadlines take the rest in one pass, and the
/// socket event thread sends the round's pings
/// (`KeepAliveSchedule.roundToEventThread`, `SocketEventLoop.run`: with one
/// ping of the round dropped there, this test fails).
@Suite struct VoipSocketManyConnectionsTests {
    /// 150 connections on the test clock, one window: every one pings in the
    /// wake, once; answered, none is cut off at the deadline; unanswered,
    /// every one is cut off at its deadline exactly, not before.
    @Test func aRoundOfManyConnectionsPingsEachOnceAndCutsEachOff() async throws {
        let n = 150
        let clock = ManualClock()
        let server = try LoopbackServer()
        defer { server.stop() }
        let h = try VoipHarness(testClock: clock)
        let names = (0..<n).map { "voip\($0)" }
        for name in names {
            try await h.start([
                "connect": .string(server.address), "keepalive_interval": .string("60s"), "jitter": .integer(0),
                "handler_timeout": .string("10s"), "expect": .string("\r\n"), "reconnect": .table(["initial": .string("1h")]),
            ], name: name)
        }
        #expect(await h.waitForAll(names) { $0["State"]?.stringValue == "up" })
        try await h.armed()

        // Answered: one wake pings all, each once.
        await clock.advance(by: .seconds(60))
        #expect(await server.count(.ping, atLeast: n))
        #expect(await h.waitForAll(names) { $0["Pings"]?.uintValue == 1 })
        try await h.armed()
        await clock.advance(by: .seconds(10))
        await clock.settle()
        #expect(server.all(.ping).count == n)
        #expect(server.all(.closedByClient).isEmpty)

        // Unanswered: all ping again; a millisecond before the deadline none
        // is cut off, at the deadline every one is.
        server.answering = false
        await clock.advance(by: .seconds(50))
        #expect(await server.count(.ping, atLeast: 2 * n))
        await clock.advance(by: .seconds(10) - .milliseconds(1))
        await clock.settle()
        #expect(server.all(.closedByClient).isEmpty)
        await clock.advance(by: .milliseconds(1))
        #expect(await server.count(.closedByClient, atLeast: n))
        #expect(await h.waitForAll(names) { $0["Overruns"]?.uintValue == 1 })
        #expect(server.all(.ping).count == 2 * n)
        await h.supervisor.stopAll()
    }
}

/// A lease status sink that holds its first call until `open()`, counts the
/// statuses each call carries and hands them to the registry.
final class GatedStatusSink: LeaseStatusSink {
    private struct State {
        var isOpen = false
        var waiting: [CheckedContinuation<Void, Never>] = []
        var sizes: [Int] = []
    }

    let registry: LeaseRegistry
    private let state = Lock(State())

    init(registry: LeaseRegistry) { self.registry = registry }

    var batchSizes: [Int] { state.withLock { $0.sizes } }

    func open() {
        let waiting = state.withLock { s in
            s.isOpen = true
            defer { s.waiting = [] }
            return s.waiting
        }
        for continuation in waiting { continuation.resume() }
    }

    func setStatuses(_ updates: [(lease: LeaseID, status: [String: StatusValue])]) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let go = state.withLock { s in
                s.sizes.append(updates.count)
                if !s.isOpen { s.waiting.append(continuation) }
                return s.isOpen
            }
            if go { continuation.resume() }
        }
        await registry.setStatuses(updates)
    }
}

/// The registry's leases, with their statuses going through `sink`.
struct GatedLeases: LeaseProvider {
    let inner: StrategyLeases
    let sink: GatedStatusSink

    func acquire(_ request: LeaseRequest) async throws -> any LeaseHandle {
        GatedLease(inner: try await inner.acquire(request), statusSink: sink)
    }
}

struct GatedLease: BatchableLeaseHandle {
    let inner: any LeaseHandle
    let statusSink: any LeaseStatusSink
    var id: LeaseID { inner.id }
    func setStatus(_ status: [String: StatusValue]) async { await inner.setStatus(status) }
    func renew(budget: Duration?) async throws { try await inner.renew(budget: budget) }
    func release() async { await inner.release() }
    var state: LeaseState { get async { await inner.state } }
}

/// A frozen SIGSTOP-ed peer in the raw protocol, and every other fault for
/// every protocol, are in ``VoipSocketFaultTests``.
@Suite struct VoipSocketBlackHoleTests {
    /// A frozen peer whose receive window is full: the ping cannot even be
    /// delivered, and TCP_USER_TIMEOUT ends the connection long before the
    /// handler timeout (and hours before the kernel's default).
    @Test func fullWindowPeerIsDetectedByTCPUserTimeout() async throws {
        let dir = try makeTemporaryDirectory("voip-full-window")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (server, port) = try TestPongServer.start(in: dir, rcvbuf: 2048)
        defer { server.freeze(false); server.stop() }
        let h = try VoipHarness()
        // A 4 MiB ping fills every buffer between the two ends.
        try await h.start([
            "connect": .string("127.0.0.1:\(port)"), "keepalive_interval": .string("3s"), "jitter": .integer(0),
            "handler_timeout": .string("2500ms"), "user_timeout": .string("300ms"),
            "ping": .string(String(repeating: "x", count: 4 << 20)),
            "reconnect": .table(["initial": .string("10s")]),
        ])
        let up = await h.waitForStatus { $0["State"]?.stringValue == "up" }
        #expect(up["State"]?.stringValue == "up")
        await server.freezeUntilStopped()
        let frozenAt = ContinuousClock.now
        let status = await h.waitForStatus { $0["State"]?.stringValue == "backoff" }
        let detected = ContinuousClock.now - frozenAt
        await h.supervisor.stopAll()
        #expect(status["LastError"]?.stringValue.contains("Connection timed out") == true, "\(status)")
        #expect(status["Overruns"]?.uintValue == 0, "the handler timeout, not TCP_USER_TIMEOUT, ended it: \(status)")
        // The ping goes out 3 s after connecting; the timeout follows within
        // about a second on an idle machine. The bound only says "soon" (CI
        // met 7.0 s under the suite's load): what proves TCP_USER_TIMEOUT is
        // the error and no overrun above, since without it the kernel waits
        // some 15 minutes and the 2.5 s handler timeout would end it.
        #expect(detected < .seconds(3) + .seconds(9), "detected after \(detected)")
    }
}
