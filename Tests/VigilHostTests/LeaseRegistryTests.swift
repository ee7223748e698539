import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// Collects registry events as they are published.
actor EventLog {
    private(set) var events: [LeaseEvent] = []
    func append(_ e: LeaseEvent) { events.append(e) }
    var kinds: [LeaseEvent.Kind] { events.map(\.kind) }
}

/// Counts calls from concurrent code.
actor Counter {
    private(set) var value = 0
    func increment() { value += 1 }
}

func observe(_ registry: LeaseRegistry) async -> (EventLog, Task<Void, Never>) {
    let log = EventLog()
    let stream = await registry.events()
    let task = Task { for await e in stream { await log.append(e) } }
    return (log, task)
}

@Suite struct LeaseRegistryTests {
    @Test func renewalBeforeDeadlineKeepsTheLease() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let (log, task) = await observe(registry)
        defer { task.cancel() }
        let id = try await registry.acquire(strategy: "focus", LeaseRequest(holds: "test", reason: "r", budget: .seconds(60)))
        // Renew every 25 s for 10 minutes: the lease must never expire.
        for _ in 0..<24 {
            await clock.advance(by: .seconds(25))
            try await registry.renew(id)
        }
        await clock.advance(by: .seconds(59))
        #expect(await registry.lease(id)?.state == .active)
        #expect(await registry.lease(id)?.renewals == 24)
        // The events reach the log through the observer's task.
        try await clock.settle(until: "25 events observed") { await log.events.count >= 25 }
        #expect(await log.kinds == [.acquired] + Array(repeating: .renewed, count: 24))
    }

    /// Budgets count awake time: the boottime clock jumps over a suspend
    /// while the budget clock (CLOCK_MONOTONIC in vigild) stands still, so a
    /// lease with budget left survives a suspend far longer than its
    /// budget, and its deadline's wall time moves by the time slept.
    @Test func aSuspendDoesNotEatTheBudget() async throws {
        let boottime = ManualClock()
        let awake = ManualClock()
        let registry = LeaseRegistry(clock: boottime, budgetClock: awake)
        let id = try await registry.acquire(strategy: "hold", LeaseRequest(holds: "test", reason: "r", budget: .seconds(60)))
        let wallBefore = try #require(await registry.lease(id)?.deadlineWallMicros)
        await awake.advance(by: .seconds(45))
        await boottime.advance(by: .seconds(45))
        // Ten minutes asleep: only boottime moves.
        await boottime.jump(by: .seconds(600))
        await registry.systemResumed()
        #expect(await registry.lease(id)?.state == .active)
        let wallAfter = try #require(await registry.lease(id)?.deadlineWallMicros)
        #expect(wallAfter - wallBefore == 600_000_000)
        // Awake again: the 15 s left run out on awake time.
        await awake.advance(by: .seconds(14))
        #expect(await registry.lease(id)?.state == .active)
        try await registry.renew(id)
        await awake.advance(by: .seconds(59))
        #expect(await registry.lease(id)?.state == .active)
        await awake.advance(by: .seconds(2))
        try await awake.settle(until: "the lease expired") { await registry.state(of: id) == .expired }
    }

    /// A renewal asked for in time keeps the lease while the power backend
    /// takes its time: logind answers OperationInProgress until its sleep
    /// operation is over, and the deadline passed meanwhile in the systemd
    /// guest ("ran out of budget" with the renewal waiting). Its answer
    /// decides: a new deadline, or the end when it fails.
    @Test func aDeadlinePassingDuringARenewalWaitsForItsAnswer() async throws {
        let clock = ManualClock()
        let backend = SlowRenewBackend()
        let registry = LeaseRegistry(clock: clock, backend: backend)
        let id = try await registry.acquire(strategy: "hold", LeaseRequest(holds: "sleep", reason: "r", budget: .seconds(20), power: PowerHold()))
        await clock.advance(by: .seconds(15))
        let renewal = Task { try await registry.renew(id) }
        await backend.renewStarted.wait()
        // The old deadline passes while the backend has not answered.
        await clock.advance(by: .seconds(10))
        #expect(await registry.lease(id)?.state == .active)
        backend.answer(.success(()))
        let renewed = try await renewal.value
        #expect(renewed.state == .active && renewed.renewals == 1)
        await clock.advance(by: .seconds(19))
        #expect(await registry.lease(id)?.state == .active)
        // A renewal that fails ends the lease when it fails.
        let failing = Task { try await registry.renew(id) }
        await backend.renewStarted.wait()
        await clock.advance(by: .seconds(5))
        #expect(await registry.lease(id)?.state == .active)
        backend.answer(.failure(PowerBackendError("logind refused Inhibit")))
        await #expect(throws: LeaseError.self) { try await failing.value }
        #expect(await registry.state(of: id) == .expired)
    }

    @Test func missedRenewalRunsTheExpirationHandler() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let (log, task) = await observe(registry)
        defer { task.cancel() }
        let handled = Counter()
        let id = try await registry.acquire(strategy: "s", LeaseRequest(
            holds: "test", reason: "r", budget: .seconds(30), grace: .seconds(5),
            onExpire: { expiry in
                await handled.increment()
            }
        ))
        await clock.advance(by: .seconds(29))
        #expect(await registry.lease(id)?.state == .active)
        await clock.advance(by: .seconds(1))
        // The deadline's watch runs the handler, then ends the lease.
        try await clock.settle(until: "the handler ran and the lease ended") {
            let (ran, lease, observed) = (await handled.value, await registry.lease(id), await log.events.count)
            return ran == 1 && lease == nil && observed >= 3
        }
        let events = await log.events
        #expect(events.map(\.kind) == [.acquired, .expiring, .expired])
        #expect(events.last?.forced == false)
        #expect(events[1].at == events[0].at + .seconds(30))
        #expect(await registry.state(of: id) == .expired)
    }

    /// One watch serves every lease's deadline: leases acquired out of
    /// order, renewed, ended, or due at the same instant each expire at
    /// their own deadline exactly, and their handlers run side by side.
    @Test func everyLeaseExpiresAtItsOwnDeadline() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        // Many leases begun and ended first leave stale deadlines behind.
        for _ in 0..<300 {
            let id = try await registry.acquire(strategy: "churn", LeaseRequest(holds: "t", reason: "r", budget: .seconds(100)))
            await registry.release(id)
        }
        let (log, task) = await observe(registry)
        defer { task.cancel() }
        let handled = Counter()
        func lease(_ seconds: Int64, handler: Bool = false) async throws -> LeaseID {
            var onExpire: (@Sendable (LeaseExpiry) async -> Void)?
            if handler {
                onExpire = { _ in
                    do { try await clock.sleep(for: .seconds(2)) } catch {}
                    await handled.increment()
                }
            }
            return try await registry.acquire(strategy: "s", LeaseRequest(
                holds: "t", reason: "r", budget: .seconds(seconds), grace: .seconds(5), onExpire: onExpire))
        }
        let a = try await lease(50)               // earlier than the churn's stale deadlines
        let f = try await lease(15)               // earlier again
        let b = try await lease(20)
        let c = try await lease(30, handler: true)
        let d = try await lease(30, handler: true)  // due with c
        let e = try await lease(40)
        await registry.release(e)
        await clock.advance(by: .seconds(10))
        try await registry.renew(b, budget: .seconds(35))  // now due at 45 s
        await clock.advance(by: .seconds(5))
        try await clock.settle(until: "f ended at 15 s") { await registry.lease(f) == nil }
        await clock.advance(by: .seconds(15) - .milliseconds(1))
        try await clock.settle(until: "f's expiring event observed") { await log.kinds.contains(.expiring) }
        #expect(await log.kinds.filter { $0 == .expiring }.count == 1)
        await clock.advance(by: .milliseconds(1))
        // Both handlers run at once, each sleeping 2 s on the clock: wait
        // for both sleeps before moving time.
        let handlersDue = clock.now + .seconds(2)
        try await clock.settle(until: "c and d expiring, their handlers asleep") {
            let (cState, dState) = (await registry.lease(c)?.state, await registry.lease(d)?.state)
            return cState == .expiring && dState == .expiring && clock.sleeperCount(dueBy: handlersDue) == 2
        }
        // Both finish 2 s later.
        await clock.advance(by: .seconds(2))
        try await clock.settle(until: "both handlers finished and c and d ended") {
            let (ran, cLease, dLease) = (await handled.value, await registry.lease(c), await registry.lease(d))
            return ran == 2 && cLease == nil && dLease == nil
        }
        await clock.advance(by: .seconds(13))  // 45 s
        try await clock.settle(until: "b ended at 45 s") { await registry.lease(b) == nil }
        #expect(await registry.lease(a)?.state == .active)
        await clock.advance(by: .seconds(5))   // 50 s
        try await clock.settle(until: "a ended at 50 s") { await registry.lease(a) == nil }
        try await clock.settle(until: "five expired events observed") { await log.kinds.count { $0 == .expired } == 5 }
        let start = await log.events.first { $0.kind == .acquired }?.at
        let expiring = await log.events.filter { $0.kind == .expiring }
        #expect(expiring.map(\.lease.id).sorted() == [a, b, c, d, f].sorted())
        let due: [LeaseID: Duration] = [a: .seconds(50), b: .seconds(45), c: .seconds(30), d: .seconds(30), f: .seconds(15)]
        for event in expiring {
            #expect(start.map { event.at - $0 } == due[event.lease.id], "lease \(event.lease.id)")
        }
        #expect(await log.events.filter { $0.kind == .expired }.allSatisfy { !$0.forced })
        #expect(await !log.events.contains { $0.lease.id == e && $0.kind == .expiring })
    }

    @Test func overrunningHandlerIsCutOffAndTheLeaseForceReleased() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let (log, task) = await observe(registry)
        defer { task.cancel() }
        let cancelled = Counter()
        let id = try await registry.acquire(strategy: "s", LeaseRequest(
            holds: "test", reason: "r", budget: .seconds(10), grace: .seconds(3),
            onExpire: { _ in
                // A handler that never finishes on its own.
                do { try await clock.sleep(for: .seconds(3600)) } catch {
                    await cancelled.increment()
                }
            }
        ))
        await clock.advance(by: .seconds(10))
        // The expiry's work runs on other threads: wait for its state.
        try await clock.settle(until: "the lease is expiring") { await registry.lease(id)?.state == .expiring }
        await clock.advance(by: .seconds(2))
        #expect(await registry.lease(id)?.state == .expiring)
        await clock.advance(by: .seconds(1))
        try await clock.settle(until: "the lease ended and its handler was cancelled") {
            let (lease, cancels, observed) = (await registry.lease(id), await cancelled.value, await log.events.count)
            return lease == nil && cancels == 1 && observed >= 3
        }
        let events = await log.events
        #expect(events.map(\.kind) == [.acquired, .expiring, .expired])
        #expect(events.last?.forced == true)
        #expect(events.last.map { $0.at - events[1].at } == .seconds(3))
    }

    @Test func renewAfterEndAndBadBudgetsAreErrors() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        await #expect(throws: LeaseError.self) {
            try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r", budget: .zero))
        }
        let id = try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r", budget: .seconds(1)))
        await registry.release(id)
        await #expect(throws: LeaseError.self) { try await registry.renew(id) }
        #expect(await registry.state(of: id) == .released)
        #expect(await registry.active.isEmpty)
    }

    @Test func releaseAllEndsOnlyThatStrategysLeases() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        try await registry.acquire(strategy: "a", LeaseRequest(holds: "1", reason: "r"))
        try await registry.acquire(strategy: "a", LeaseRequest(holds: "2", reason: "r"))
        let b = try await registry.acquire(strategy: "b", LeaseRequest(holds: "3", reason: "r"))
        await registry.releaseAll(strategy: "a", detail: "strategy stopped")
        #expect(await registry.active.map(\.id) == [b])
    }

    /// A holder's ids are kept inline while it has one lease, in a set
    /// while it has more: releaseAll finds what is left after some ended.
    @Test func releaseAllEndsTheLeasesLeftAfterSomeEnded() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let a1 = try await registry.acquire(strategy: "a", LeaseRequest(holds: "1", reason: "r"))
        let a2 = try await registry.acquire(strategy: "a", LeaseRequest(holds: "2", reason: "r"))
        let a3 = try await registry.acquire(strategy: "a", LeaseRequest(holds: "3", reason: "r"))
        let b = try await registry.acquire(strategy: "b", LeaseRequest(holds: "4", reason: "r"))
        await registry.release(a1)
        await registry.release(a3)
        await registry.releaseAll(strategy: "a", detail: "strategy stopped")
        #expect(await registry.active.map(\.id) == [b])
        #expect(await registry.state(of: a2) == .released)

        // After all of a holder's leases ended, its next one is found too.
        let a4 = try await registry.acquire(strategy: "a", LeaseRequest(holds: "5", reason: "r"))
        let a5 = try await registry.acquire(strategy: "a", LeaseRequest(holds: "6", reason: "r"))
        await registry.release(a4)
        await registry.releaseAll(strategy: "a", detail: "strategy stopped")
        #expect(await registry.active.map(\.id) == [b])
        #expect(await registry.state(of: a5) == .released)
    }

    @Test func historyIsBoundedByBytesAsWellAsByCount() async throws {
        let limit = 256 << 10
        let registry = LeaseRegistry(clock: ManualClock(), historyLimit: 1_000, historyByteLimit: limit)
        let huge = String(repeating: "x", count: 64 << 10)
        var last: LeaseID?
        for _ in 0..<20 {
            let id = try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: huge))
            await registry.release(id)
            last = id
        }
        let history = await registry.history
        // 40 events of ~64 KiB each would be 2.5 MiB: only the newest few fit.
        #expect(await registry.historyByteCount <= limit)
        #expect(history.reduce(0) { $0 + $1.retainedBytes } == (await registry.historyByteCount))
        #expect(history.count < 8 && history.count >= 2)
        #expect(history.last?.lease.id == last && history.last?.kind == .released)

        // Small events after the big ones were dropped: all kept, in order.
        let small = try await Self.beginAndEnd(30, on: registry)
        let after = await registry.history
        #expect(after.count == history.count + 60)
        #expect(after.suffix(60).map(\.lease.id) == small.flatMap { [$0, $0] })
        #expect(after.prefix(history.count).map(\.lease.id) == history.map(\.lease.id))
        #expect(after.reduce(0) { $0 + $1.retainedBytes } == (await registry.historyByteCount))

        // Ordinary events are still bounded by count alone: the newest ten, in order.
        let bounded = LeaseRegistry(clock: ManualClock(), historyLimit: 10)
        let ids = try await Self.beginAndEnd(23, on: bounded)
        let kept = await bounded.history
        #expect(kept.count == 10)
        #expect(kept.map(\.lease.id) == Array(ids.flatMap { [$0, $0] }.suffix(10)))
        #expect(kept.map(\.kind) == Array(repeating: [LeaseEvent.Kind.acquired, .released], count: 5).flatMap { $0 })
        #expect(await bounded.state(of: ids[22]) == .released)
        #expect(await bounded.state(of: ids[0]) == nil)
    }

    /// Acquires and releases `count` small leases one after the other; their ids.
    static func beginAndEnd(_ count: Int, on registry: LeaseRegistry) async throws -> [LeaseID] {
        var ids: [LeaseID] = []
        for _ in 0..<count {
            let id = try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r"))
            await registry.release(id)
            ids.append(id)
        }
        return ids
    }

    /// Statuses set in one batch (the voip-socket plugin's way) land like
    /// single calls, in order: an unchanged status and an unknown or ended
    /// lease publish nothing, and each change is one `status` event that
    /// stays out of the history.
    @Test func batchedStatusesArePublishedInOrderLikeSingleOnes() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let stream = await registry.events()
        let handle = try await StrategyLeases(registry: registry, strategy: "a").acquire(LeaseRequest(holds: "1", reason: "r"))
        let a = handle.id
        let b = try await registry.acquire(strategy: "b", LeaseRequest(holds: "2", reason: "r"))
        let ended = try await registry.acquire(strategy: "c", LeaseRequest(holds: "3", reason: "r"))
        await registry.release(ended)
        // The handle names its registry as the sink, so a strategy batches there.
        let sink = try #require((handle as? any BatchableLeaseHandle)?.statusSink)
        #expect(sink === registry)
        let updates: [(lease: LeaseID, status: [String: StatusValue])] = [
            (a, ["Pings": .uint(1)]), (b, ["Pings": .uint(7)]), (a, ["Pings": .uint(2)]),
            (a, ["Pings": .uint(2)]), (ended, ["Pings": .uint(9)]), (LeaseID(99), ["Pings": .uint(9)]),
        ]
        await sink.setStatuses(updates)
        await registry.setStatus(b, ["Pings": .uint(7)])
        #expect(await registry.lease(a)?.status == ["Pings": .uint(2)])
        #expect(await registry.lease(b)?.status == ["Pings": .uint(7)])
        // Events are published before the calls return: this release marks
        // the end of what the calls above published.
        await registry.release(b)
        var seen: [LeaseEvent] = []
        for await event in stream {
            seen.append(event)
            if event.kind == .released && event.lease.id == b { break }
        }
        let statuses = seen.filter { $0.kind == .status }
        #expect(statuses.map(\.lease.id) == [a, b, a])
        let pings: [StatusValue?] = statuses.map { $0.lease.status["Pings"] }
        #expect(pings == [.uint(1), .uint(7), .uint(2)])
        #expect(await registry.history.allSatisfy { $0.kind != .status })
    }

    /// `changes()` carries the same history with statuses batched: a
    /// setStatuses call is one element holding each changed lease's id and
    /// status in order (nothing for an unchanged status or an unknown or
    /// ended lease), a single setStatus is a batch of one, and life-cycle
    /// events come one by one in their place between the batches.
    @Test func changesBatchEachSetStatusesCall() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let stream = await registry.changes()
        let a = try await registry.acquire(strategy: "a", LeaseRequest(holds: "1", reason: "r"))
        let b = try await registry.acquire(strategy: "b", LeaseRequest(holds: "2", reason: "r"))
        let ended = try await registry.acquire(strategy: "c", LeaseRequest(holds: "3", reason: "r"))
        await registry.release(ended)
        await registry.setStatuses([
            (a, ["Pings": .uint(1)]), (b, ["Pings": .uint(7)]), (a, ["Pings": .uint(2)]),
            (a, ["Pings": .uint(2)]), (ended, ["Pings": .uint(9)]), (LeaseID(99), ["Pings": .uint(9)]),
        ])
        await registry.setStatuses([(b, ["Pings": .uint(7)])])  // unchanged: no element
        await registry.setStatus(b, ["Pings": .uint(8)])
        await registry.release(b)
        var seen: [LeaseChange] = []
        for await change in stream {
            seen.append(change)
            if case .event(let event) = change, event.kind == .released, event.lease.id == b { break }
        }
        let expected: [LeaseChange] = [
            .statuses([
                LeaseStatusChange(lease: a, status: ["Pings": .uint(1)]), LeaseStatusChange(lease: b, status: ["Pings": .uint(7)]),
                LeaseStatusChange(lease: a, status: ["Pings": .uint(2)]),
            ]),
            .statuses([LeaseStatusChange(lease: b, status: ["Pings": .uint(8)])]),
        ]
        let batches = seen.filter { if case .statuses = $0 { return true } else { return false } }
        #expect(batches == expected)
        let events: [(LeaseEvent.Kind, LeaseID)] = seen.compactMap { if case .event(let e) = $0 { return (e.kind, e.lease.id) } else { return nil } }
        #expect(events.map(\.0) == [.acquired, .acquired, .acquired, .released, .released])
        #expect(events.map(\.1) == [a, b, ended, ended, b])
        // The batches sit between the life-cycle events they came between.
        guard seen.count == 7, case .statuses = seen[4], case .statuses = seen[5] else {
            Issue.record("order: \(seen)")
            return
        }
    }

    /// A status is stored (and shown to observers) only when it differs:
    /// the same pairs in any key order are no change; a value changed at
    /// any key, a key renamed or added is one. Dictionaries built in
    /// different orders and capacities walk their keys in different orders,
    /// so both the side-by-side and the hashed comparison are exercised.
    @Test func aStatusCountsAsChangedExactlyWhenItsPairsDiffer() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let seen = RecordingObserver()
        await registry.observe(seen)
        let lease = try await registry.acquire(strategy: "s", LeaseRequest(holds: "a", reason: "r"))
        let keys = (0..<24).map { "Key\($0)" }
        var base: [String: StatusValue] = [:]
        for (i, key) in keys.enumerated() { base[key] = .uint(UInt64(i)) }
        await registry.setStatus(lease, base)
        var reordered = [String: StatusValue](minimumCapacity: 200)
        for (i, key) in keys.enumerated().reversed() { reordered[key] = .uint(UInt64(i)) }
        #expect(Array(reordered.keys) != Array(base.keys), "the test needs another key order")
        await registry.setStatus(lease, reordered)  // same pairs
        var samePairsCopy = base
        samePairsCopy["Key3"] = .uint(3)  // a copy with a value set to what it was
        await registry.setStatus(lease, samePairsCopy)
        let unchanged = seen.log.filter { $0.hasPrefix("status") }.count
        var changes = 0
        for key in [keys.first!, keys[11], keys.last!] {  // one value changed, in place
            var changed = base
            changed[key] = .string("x")
            await registry.setStatus(lease, changed)
            await registry.setStatus(lease, base)
            changes += 2
        }
        var renamed = base
        renamed["Key5"] = nil
        renamed["Other"] = .uint(5)
        await registry.setStatus(lease, renamed)
        var grown = base
        grown["Extra"] = .bool(true)
        await registry.setStatus(lease, grown)
        var reorderedChanged = reordered
        reorderedChanged["Key7"] = .int(7)  // same number, another type
        await registry.setStatus(lease, reorderedChanged)
        changes += 3
        #expect(unchanged == 1)
        #expect(seen.log.filter { $0.hasPrefix("status") }.count == 1 + changes)
        let stored = await registry.active.first?.status
        #expect(stored == reorderedChanged)
    }

    /// A filtered subscriber gets only the events its filter takes, in
    /// order; the statuses and the other strategy's events never reach it.
    /// An observer sees every event and each status, on the registry.
    @Test func filteredSubscribersAndObserversSeeWhatTheyAskFor() async throws {
        let registry = LeaseRegistry(clock: ManualClock())
        let endings = await registry.events(LeaseEventFilter(kinds: LeaseEventFilter.endings, strategy: "client"))
        let seen = RecordingObserver()
        await registry.observe(seen)
        let other = try await registry.acquire(strategy: "focus", LeaseRequest(holds: "a", reason: "r", budget: .seconds(60)))
        let mine = try await registry.acquire(strategy: "client", LeaseRequest(holds: "b", reason: "r", budget: .seconds(60)))
        await registry.setStatus(mine, ["Progress": .uint(1)])
        await registry.setStatus(other, ["Progress": .uint(2)])
        await registry.release(other)
        await registry.release(mine, detail: "done")
        var iterator = endings.makeAsyncIterator()
        let first = await iterator.next()
        #expect(first?.kind == .released && first?.lease.id == mine && first?.detail == "done")
        #expect(seen.log == ["acquired \(other)", "acquired \(mine)", "status \(mine) client", "status \(other) focus",
                             "released \(other)", "released \(mine)"])
    }
}

/// Writes down what a ``LeaseObserver`` is shown.
final class RecordingObserver: LeaseObserver {
    private let entries = Lock<[String]>([])
    var log: [String] { entries.withLock { $0 } }
    func observe(_ event: LeaseEvent) { entries.withLock { $0.append("\(event.kind.rawValue) \(event.lease.id)") } }
    func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {
        entries.withLock { $0.append("status \(lease) \(strategy)") }
    }
}

/// A power backend whose renewals wait for the test's answer.
final class SlowRenewBackend: PowerBackend, Sendable {
    private let waiting = Lock<CheckedContinuation<Void, any Error>?>(nil)
    let renewStarted = AsyncGate()
    let name = "slow"
    let reason = "test"

    func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken { Token(backend: self) }

    func answer(_ result: Result<Void, any Error>) {
        let continuation = waiting.withLock { waiting -> CheckedContinuation<Void, any Error>? in
            defer { waiting = nil }
            return waiting
        }
        continuation?.resume(with: result)
    }

    fileprivate func renew() async throws {
        try await withCheckedThrowingContinuation { continuation in
            waiting.withLock { $0 = continuation }
            renewStarted.open()
        }
    }

    struct Token: PowerToken {
        let backend: SlowRenewBackend
        var description: String { "slow token" }
        func renew(budget: Duration?) async throws { try await backend.renew() }
        func release() async {}
    }
}

/// Opens once per `open()`; each `wait()` takes one opening.
final class AsyncGate: Sendable {
    private let state = Lock((openings: 0, waiters: [CheckedContinuation<Void, Never>]()))

    func open() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty { state.openings += 1; return nil }
            return state.waiters.removeFirst()
        }
        waiter?.resume()
    }

    func wait() async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Bool in
                if state.openings > 0 { state.openings -= 1; return true }
                state.waiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }
}
