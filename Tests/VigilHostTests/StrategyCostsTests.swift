import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// ``StrategyCosts`` fed by the real scheduler, registry and hook runner.
@Suite("Strategy costs")
struct StrategyCostsTests {
    /// One expiration that fires requests of two strategies (and one of
    /// the host's) counts once for each strategy and once for the machine,
    /// as the scheduler counts its own expirations.
    @Test func aCoalescedExpirationCountsForEachStrategyAndOnceForTheMachine() async throws {
        let clock = ManualClock()
        let timer = ClockDrivenWakeTimer(clock: clock)
        let scheduler = WakeScheduler(clock: clock, timer: timer)
        let costs = StrategyCosts(clock: clock)
        await scheduler.observeExpirations { costs.timerExpired(firing: $0) }
        let at = clock.now + .seconds(60)
        let window = WakeRequest(earliest: at - .seconds(10), latest: at, label: "w")
        async let a = WakeOwner.$current.withValue(WakeOwner(strategy: "a", kind: "periodic-wake")) { try await scheduler.wake(window) }
        async let a2 = WakeOwner.$current.withValue(WakeOwner(strategy: "a", kind: "periodic-wake")) { try await scheduler.wake(window) }
        async let b = WakeOwner.$current.withValue(WakeOwner(strategy: "b", kind: "voip-socket")) { try await scheduler.wake(window) }
        async let host = scheduler.wake(window)
        await WakeTesting.quiesce(scheduler, clock, timers: [timer], pending: 4)
        await WakeTesting.advance(clock, to: at + .seconds(1), timers: [timer])
        let batch = try await [a, a2, b, host].map(\.batchSize)
        #expect(batch == [4, 4, 4, 4])
        #expect(await scheduler.statistics.timerExpirations == 1)
        #expect(costs.cost(of: "a").wakeups == 1)
        #expect(costs.cost(of: "b").wakeups == 1)
        #expect(costs.machineWakeups == 1)
        #expect(costs.all().keys.sorted() == ["a", "b"])
    }

    /// Held time per kind of hold: block holds of sleep and idle from
    /// acquisition to the end, active leases up to now; a delay hold or a
    /// tracked-only lease holds nothing off.
    @Test func leasesHoldSleepAndIdleOffUntilTheyEnd() async throws {
        let clock = ManualClock()
        let registry = LeaseRegistry(clock: clock)
        let costs = StrategyCosts(clock: clock)
        await registry.observe(costs)
        let both = try await registry.acquire(strategy: "s", LeaseRequest(holds: "x", reason: "r", power: PowerHold(what: ["sleep", "idle"])))
        _ = try await registry.acquire(strategy: "s", LeaseRequest(holds: "y", reason: "r", power: PowerHold(what: ["sleep"], mode: "delay")))
        _ = try await registry.acquire(strategy: "s", LeaseRequest(holds: "z", reason: "r"))
        let idle = try await registry.acquire(strategy: "t", LeaseRequest(holds: "w", reason: "r", power: PowerHold(what: ["idle"])))
        await clock.advance(by: .seconds(3))
        await registry.release(both)
        await clock.advance(by: .seconds(2))
        #expect(costs.cost(of: "s") == StrategyCostRow(sleepHeldUsec: 3_000_000, idleHeldUsec: 3_000_000))
        // Still active: counted up to now, and on.
        #expect(costs.cost(of: "t") == StrategyCostRow(idleHeldUsec: 5_000_000))
        await clock.advance(by: .seconds(1))
        await registry.release(idle)
        await clock.advance(by: .seconds(10))
        #expect(costs.all()["t"] == StrategyCostRow(idleHeldUsec: 6_000_000))
    }

    /// A command's CPU, from its rusage, goes to its strategy.
    @Test func aCommandsCPUGoesToItsStrategy() async throws {
        let costs = StrategyCosts(clock: ManualClock())
        let runner = HookRunner(strategy: "burn", log: WaitableLog<LogLine>().logger("test"), costs: costs)
        let result = await runner.run(HookCommand(argv: ["/usr/bin/python3", "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"], timeout: .seconds(30)),
                                      event: "test", variables: [:])
        #expect(result.exit == .exited(0))
        #expect(result.cpuTime >= .milliseconds(200), "\(result.cpuTime)")
        #expect(costs.cost(of: "burn").childCPUUsec == UInt64(result.cpuTime.microseconds))
        costs.networkBytes(sent: 3, received: 4, of: "burn")
        costs.recorder(for: "burn").networkBytes(sent: 1, received: 0)
        #expect(costs.cost(of: "burn").bytesSent == 4 && costs.cost(of: "burn").bytesReceived == 4)
    }
}
