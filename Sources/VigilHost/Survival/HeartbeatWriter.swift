import ServiceLifecycle
import VigilKit

/// Writes the survival heartbeat every `[host] survival_interval`: the
/// clocks, the active leases and what each strategy has cost.
///
/// Each heartbeat is a wake request like any other, on a fixed grid from the
/// start of ``run()`` (`[slot - min(interval/10, 5s), slot]`), so it
/// coalesces with strategy wakes and never drifts; after a stall or a
/// suspend it continues with the next future slot. A store that cannot be
/// written (a full disk) is reported once per outage, and once more when it
/// is writable again; events lost while heartbeats still fit are reported at
/// most once a minute.
///
/// A `Service`: it runs until cancelled or until a graceful shutdown; the
/// final heartbeat of a run is written by ``SurvivalStore/endRun(reason:readings:costs:)``.
public struct HeartbeatWriter: Service {
    /// What the writer reads from and tells the rest of the host.
    public struct Sources: Sendable {
        /// The leases active now, as stored in a heartbeat.
        public var activeLeases: @Sendable () async -> [HeartbeatLease]
        /// What each strategy has cost so far (stored with each heartbeat).
        public var costs: @Sendable () -> [String: StrategyCostRow]
        /// Each app's refusals and expiries so far (stored with each heartbeat).
        public var apps: @Sendable () async -> [String: AppRequestCount]
        /// The store stopped or started being writable.
        public var healthChanged: @Sendable () async -> Void
        /// Runs after each heartbeat, written or not; `first` for the first of the run.
        public var afterBeat: @Sendable (_ first: Bool) async -> Void

        public init(
            activeLeases: @escaping @Sendable () async -> [HeartbeatLease],
            costs: @escaping @Sendable () -> [String: StrategyCostRow] = { [:] },
            apps: @escaping @Sendable () async -> [String: AppRequestCount] = { [:] },
            healthChanged: @escaping @Sendable () async -> Void = {},
            afterBeat: @escaping @Sendable (_ first: Bool) async -> Void = { _ in }
        ) {
            self.activeLeases = activeLeases
            self.costs = costs
            self.apps = apps
            self.healthChanged = healthChanged
            self.afterBeat = afterBeat
        }
    }

    let store: SurvivalStore
    let interval: Duration
    let scheduler: any WakeScheduling
    let clock: any VigilClock
    let readings: @Sendable () -> ClockReadings
    let log: Logger
    let sources: Sources

    public init(store: SurvivalStore, interval: Duration, scheduler: any WakeScheduling, clock: any VigilClock,
                readings: @escaping @Sendable () -> ClockReadings, log: Logger, sources: Sources) {
        self.store = store
        self.interval = interval
        self.scheduler = scheduler
        self.clock = clock
        self.readings = readings
        self.log = log
        self.sources = sources
    }

    /// Writes heartbeats until the task is cancelled or shut down gracefully.
    public func run() async {
        await cancelWhenGracefulShutdown { await self.beat() }
    }

    private func beat() async {
        let start = clock.now
        var k: Int64 = 1
        var outageReported = false
        var eventsLost = 0
        var lastEventLossNotice: VigilInstant?
        let tolerance = min(interval / 10, .seconds(5))
        while !Task.isCancelled {
            let target = start + interval * Int(k)
            do {
                _ = try await scheduler.wake(WakeRequest(earliest: target - tolerance, latest: target, label: "survival heartbeat"))
            } catch { return }
            let leases = await sources.activeLeases()
            let apps = await sources.apps()
            do {
                let now = readings()
                let written = try await store.writeHeartbeat(now, leases: leases, costs: sources.costs(), apps: apps)
                let outage = written.endedOutage
                // The sequence, not the slot k: slots skip across a suspend.
                log.debug("heartbeat \(written.sequence) written (\(leases.count) active lease\(leases.count == 1 ? "" : "s"))")
                outageReported = false
                if let outage, outage.failedHeartbeats > 0 {
                    await sources.healthChanged()
                    let seconds = Duration.microseconds(now.monotonicMicros - outage.lastWritten.monotonicMicros)
                    log.notice("survival store writable again after \(seconds.vigilDescription) (\(outage.failedWrites) writes lost); the gap is recorded as store-unwritable")
                } else if let outage {
                    // Only events were lost (the WAL's checkpoint gave
                    // heartbeats room again): no hole in the timeline.
                    // Said at most once a minute, as it can repeat at
                    // every heartbeat while the disk stays nearly full.
                    eventsLost += outage.failedWrites
                    if lastEventLossNotice.map({ clock.now - $0 >= .seconds(60) }) ?? true {
                        log.notice("survival store nearly full: \(eventsLost) event write\(eventsLost == 1 ? "" : "s") lost; heartbeats were not interrupted")
                        lastEventLossNotice = clock.now
                        eventsLost = 0
                    }
                }
            } catch let error as SurvivalStoreError where error.code == .unwritable {
                // Once per outage: it lasts until space is freed.
                if !outageReported {
                    log.error("\(error); heartbeats resume when it is writable again")
                    await sources.healthChanged()
                }
                outageReported = true
            } catch {
                log.error("cannot write heartbeat: \(error)")
            }
            await sources.afterBeat(k == 1)
            let elapsed = clock.now - start
            k = max(k + 1, Int64(elapsed / interval) + 1)
        }
    }
}
