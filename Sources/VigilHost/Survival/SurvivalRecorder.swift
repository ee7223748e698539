import ServiceLifecycle
import VigilKit

/// The service that owns the run's record in the survival store: it writes
/// the lease events (``LeaseEventWriter``) and the heartbeat
/// (``HeartbeatWriter``) while the run lasts and, as it stops, the end of
/// the run: the final heartbeat, the reason (``RunOutcome``: `stopped`, or
/// `failed` when a service failed), and the last metrics textfile.
///
/// First in the group, so it stops last: the lease events and costs of the
/// stopping strategies, and what the bus showed of them, are written before
/// the end.
public struct SurvivalRecorder: Service {
    /// What the end of the run records besides the clocks.
    struct RunEnd: Sendable {
        /// What each strategy has cost in this run.
        var costs: @Sendable () -> [String: StrategyCostRow]
        /// Each app's refusals and expiries in this run.
        var apps: @Sendable () async -> [String: AppRequestCount]
        /// Log lines that could not be written (stderr full or closed).
        var droppedLogLines: @Sendable () -> Int
        /// Runs once the end is written (the last metrics textfile).
        var afterEnd: @Sendable () async -> Void
    }

    let store: SurvivalStore
    let runId: String
    let leaseEvents: LeaseEventWriter
    let heartbeat: HeartbeatWriter
    let outcome: RunOutcome
    let end: RunEnd
    let readings: @Sendable () -> ClockReadings
    let log: Logger

    /// Writes lease events and heartbeats until the group shuts down (the
    /// heartbeat may end earlier, when the wake scheduler fails: the host
    /// runs on, as a missing heartbeat is what the log is there to show),
    /// then the lease events still waiting, then the end of the run.
    public func run() async {
        let leaseEvents = self.leaseEvents, heartbeat = self.heartbeat
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await leaseEvents.run() }
            group.addTask { await heartbeat.run() }
        }
        // Cancelled rather than shut down gracefully: the group was
        // cancelled because a service failed or ended unexpectedly.
        if Task.isCancelled { outcome.fail("the services were cancelled") }
        await endRun(reason: outcome.reason)
    }

    /// Counts the log lines that could not be written, writes the final
    /// heartbeat and the end of the run, and a last metrics textfile.
    private func endRun(reason: RunEndReason) async {
        // Log lines that could not be written (stderr full or closed) are
        // counted in the survival log, which outlives the lost lines.
        let dropped = end.droppedLogLines()
        if dropped > 0 {
            try? await store.recordEvent("log-lines-dropped", strategy: nil, fields: ["count": String(dropped)], readings: readings())
        }
        let apps = await end.apps()
        do { try await store.endRun(reason: reason, readings: readings(), costs: end.costs(), apps: apps) } catch {
            log.error("cannot record the end of run \(runId): \(error)")
        }
        // The last textfile says the run stopped.
        await end.afterEnd()
        log.notice("run \(runId) ended: \(reason.rawValue)")
    }
}
