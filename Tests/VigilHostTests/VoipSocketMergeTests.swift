import Testing
import VigilHost
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// Aligned keep-alive rounds that came apart (connections up more than the
/// window's width apart, as a slow start of many does) merge into one batch
/// again, and no ping ever goes outside its window (`KeepAliveSchedule`,
/// its leader and the batch that catches up; docs/benchmarks.md, "The
/// spread is the start's wall time"). On the test clock, with the host's
/// wake scheduler and real sockets: the pongs come back before the clock
/// moves on, so a round's base is its ping's instant.
@Suite struct VoipSocketMergeTests {
    /// Two connections up at once, two more `apart` later: 10 s interval,
    /// 20 % jitter, aligned to 10 s slots. Before the change the two pairs
    /// pinged 1.5 to 2.2 s apart every round, for good.
    @Test(arguments: [1.5, 1.9, 5.0])
    func phasesApartPingInOneBatchAgain(apart: Double) async throws {
        let clock = ManualClock()
        let server = try LoopbackServer(clock: clock)
        defer { server.stop() }
        let h = try VoipHarness(testClock: clock)
        let options: [String: ConfigValue] = [
            "connect": .string(server.address), "keepalive_interval": .string("10s"), "jitter": .float(0.2),
            "align": .boolean(true), "handler_timeout": .string("2s"), "ping": .string("\\r\\n\\r\\n"),
            "expect": .string("\r\n"), "skip_ping_on_traffic": .boolean(false),
            "reconnect": .table(["initial": .string("1h")]),
        ]
        let names = ["a1", "a2", "b1", "b2"]
        var connectedAt: [String: VigilInstant] = [:]
        for name in names {
            if name == "b1" {
                try await h.armed()
                await clock.advance(by: .milliseconds(Int64(apart * 1000)))
            }
            try await h.start(options, name: name)
            #expect(await h.waitForStatus(name) { $0["State"]?.stringValue == "up" }["State"]?.stringValue == "up")
            connectedAt[name] = clock.now
        }
        #expect(await server.count(.accepted, atLeast: names.count))
        // The server numbers its connections in the order they came.
        let accepted = server.all(.accepted).map(\.connection)
        #expect(accepted.count == names.count)
        let nameOf = Dictionary(uniqueKeysWithValues: zip(accepted, names))
        let start = clock.now

        // 16 rounds at most 10 s apart, in steps of 100 ms; after each step
        // every ping the server saw has had its pong (counted in the lease)
        // before time moves on. (The server answers before it records a
        // ping: the lease may count one more than the server shows.)
        //
        // Time never passes a connection's window end before its ping has
        // come: the step stops at the end, and there the test waits (real
        // time, bounded, once per window) for the ping. On a busy machine a
        // ping that is due may still be on its way when the test moves on;
        // the server would then stamp it with a later instant, a lateness of
        // the test's, not of the schedule (the VoipSocket suites beside a
        // release build saw gaps of 10.4 to 12.7 s). A schedule that waits
        // past the end still sends no ping there, so its gap still fails below.
        let end = start + .seconds(160)
        let window = Duration.seconds(10)
        var waited: [String: VigilInstant] = [:]
        func base(_ name: String, _ pings: [ServerEvent]) -> VigilInstant {
            pings.filter { nameOf[$0.connection] == name }.map(\.at).max() ?? connectedAt[name]!
        }
        while clock.now < end {
            let before = server.all(.ping)
            let windowEnds = names.map { base($0, before) + window }.filter { $0 > clock.now }
            let target = windowEnds.reduce(clock.now + .milliseconds(100), min)
            // The scheduler's wake within this step, if any: it sends the
            // pings of every connection whose window has opened by then.
            let firing = h.testWake?.timer.armedDeadline.flatMap { $0 <= target ? $0 : nil }
            await clock.advance(to: target)
            if let firing {
                // The server stamps a ping with the clock when it reads it:
                // time does not move on before it has read each one, or a
                // ping the plugin sent at the wake would carry a later step's
                // instant: a batch that looks split, the likely cause of one
                // failure beside other suites under load.
                let due = Dictionary(uniqueKeysWithValues: names.map { ($0, base($0, before)) }
                    .filter { $0.1 + window * 0.8 <= firing })
                _ = await server.wait(timeout: .seconds(5)) { events in
                    due.allSatisfy { name, last in
                        events.contains { $0.kind == .ping && nameOf[$0.connection] == name && $0.at > last }
                    }
                }
            }
            for name in names {
                let last = base(name, server.all(.ping))
                guard last + window <= clock.now, waited[name] != last else { continue }
                waited[name] = last
                _ = await server.wait(timeout: .seconds(5)) { events in
                    events.contains { $0.kind == .ping && nameOf[$0.connection] == name && $0.at > last }
                }
            }
            let pings = server.all(.ping)
            for name in names {
                let sent = pings.filter { nameOf[$0.connection] == name }.count
                let status = await h.waitForStatus(name) { $0["Pings"]?.uintValue ?? 0 >= UInt64(sent) }
                #expect(status["Pings"]?.uintValue ?? 0 >= UInt64(sent), "\(name): \(status)")
            }
            // Each pong put its connection's next round on the schedule
            // before its status counted it; its wake request reaches the
            // scheduler from a task of its own, which time must not pass.
            try await h.armed()
        }
        let pings = server.all(.ping)
        var late: [String: UInt64] = [:]  // max: no figure
        for name in names { late[name] = await h.status(name)["LatePings"]?.uintValue ?? .max }
        await h.supervisor.stopAll()

        // Never outside the window: each ping at least 8 s after the last
        // pong, which came at its ping's instant or, on a busy machine, up
        // to a step (100 ms) later: the last ping's instant is a lower
        // bound of the base, so a gap is at least 8 s and at most 10.1 s.
        // The exact end is the plugin's own count (LatePings: started
        // after base + interval).
        for name in names {
            let times = pings.filter { nameOf[$0.connection] == name }.map(\.at)
            #expect(times.count >= 15, "\(name): \(times.count) pings")
            let bases = [connectedAt[name]!] + times.dropLast()
            for (base, ping) in zip(bases, times) {
                let after = (ping - base).seconds
                #expect(after >= 8 && after <= 10.1, "\(name) pinged \(after) s after its last ping")
            }
            #expect(late[name] == 0, "\(name): \(late[name] ?? 0) late pings")
        }
        // Merged: over the last 40 s (four rounds or more), every instant a
        // ping went at carries all four connections' pings.
        let last = pings.filter { $0.at > end - .seconds(40) }
        let instants = Dictionary(grouping: last, by: \.at).mapValues { Set($0.map(\.connection)).count }
        #expect(instants.count >= 4, "\(instants)")
        #expect(instants.values.allSatisfy { $0 == names.count }, "batches of the last rounds: \(instants.sorted { $0.key < $1.key }.map { "\(($0.key - start).seconds) s: \($0.value)" })")
    }
}
