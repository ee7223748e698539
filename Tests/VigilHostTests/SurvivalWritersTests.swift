import Foundation
import ServiceLifecycle
import Testing
@testable import VigilHost
import VigilKit
import VigilKitTesting

/// The survival log's writers as services on their own (issue 38): the
/// heartbeat on its grid until the group shuts down, and the lease events,
/// whose last batch is written at the shutdown.
@Suite("Survival writers")
struct SurvivalWritersTests {
    static func group(_ services: [any Service]) -> (ServiceGroup, Task<Void, any Error>) {
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: services.map { .init(service: $0, successTerminationBehavior: .ignore) },
            logger: WaitableLog<LogLine>().logger("test")))
        return (group, Task { try await group.run() })
    }

    @Test func theHeartbeatBeatsOnItsGridUntilTheGroupShutsDown() async throws {
        let dir = try SurvivalTempDir()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart("beats", at: ClockReadings.now()))
        let clock = ManualClock()
        let scheduler = WakeScheduler(clock: clock, timer: ClockDrivenWakeTimer(clock: clock))
        let (beats, beat) = AsyncStream.makeStream(of: Bool.self)
        let writer = HeartbeatWriter(
            store: store, interval: .seconds(60), scheduler: scheduler, clock: clock, readings: { ClockReadings.now() },
            log: WaitableLog<LogLine>().logger("test"),
            sources: HeartbeatWriter.Sources(
                activeLeases: { [HeartbeatLease(id: 7, strategy: "sync", holds: "sleep", state: "active")] },
                afterBeat: { first in beat.yield(first) }))
        let start = clock.now
        let (group, running) = Self.group([writer])
        var firsts: [Bool] = []
        var iterator = beats.makeAsyncIterator()
        for _ in 0..<2 {
            // The writer's wake request is the only sleeper on the clock:
            // its deadline is the next slot of the grid.
            let deadline = try #require(await Self.nextDeadline(of: clock))
            #expect(deadline == start + .seconds(60) * (firsts.count + 1))
            await clock.advance(to: deadline)
            firsts.append(try #require(await iterator.next()))
        }
        #expect(firsts == [true, false])
        await group.triggerGracefulShutdown()
        try await running.value
        let written = try SurvivalReport.heartbeats(path: dir.store, runId: "beats")
        // The run's first heartbeat (beginRun's), then the writer's two.
        #expect(written.map { $0.leases.map(\.id) } == [[], [7], [7]])
    }

    @Test func leaseEventsWaitingAtTheShutdownAreWritten() async throws {
        let dir = try SurvivalTempDir()
        let store = try SurvivalStore(path: dir.store)
        _ = try await store.beginRun(runStart("events", at: ClockReadings.now()))
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let writer = LeaseEventWriter(store: store, readings: { ClockReadings.now() })
        await registry.observe(writer.observer)
        let (group, running) = Self.group([writer])
        let id = try await registry.acquire(strategy: "sync", LeaseRequest(holds: "sleep", reason: "a sync"))
        await registry.release(id)
        await group.triggerGracefulShutdown()
        try await running.value
        let names = try SurvivalReport.events(path: dir.store, runId: "events").map(\.name)
        #expect(names == ["lease-acquired", "lease-released"])
    }

    /// The end of the run is written by the service that owns the store
    /// (the survival record) as it stops, with the run's outcome: nothing
    /// after the group writes it, so without it the run would stay
    /// `running`. A graceful stop ends the run `stopped`; a run a service
    /// failed (vigild's bus, say) ends `failed`.
    @Test(arguments: [false, true]) func theRecordWritesTheEndOfTheRunAsItStops(failed: Bool) async throws {
        let dir = try SurvivalTempDir()
        var runId = ""
        try await HostBusFixture.with(strategies: "", stateDir: dir.path + "/state") { fixture in
            runId = fixture.runtime.runId
            if failed { fixture.services.outcome.fail("the bus could not be started") }
        }
        let run = try #require(try SurvivalReport.load(path: dir.store, runs: 1, sinceWallMicros: nil).first)
        #expect(run.runId == runId)
        #expect(run.endReason == (failed ? .failed : .stopped))
    }

    /// The next deadline a task sleeps until on `clock`, once one does (a
    /// bound of 10 s for a broken run).
    static func nextDeadline(of clock: ManualClock) async -> VigilInstant? {
        for _ in 0..<10_000 {
            if let next = clock.nextDeadline { return next }
            await Task.yield()
            try? await Task.sleep(for: .milliseconds(1))
        }
        return nil
    }
}
