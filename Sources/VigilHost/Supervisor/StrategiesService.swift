import ServiceLifecycle
import VigilKit

/// The strategies as a service: ``run()`` starts the client leases, the
/// apps' inhibits and the configured strategies (once the sleep cycle
/// watches, ``after``), says so (``started``: the bus waits for it, so a
/// client that sees vigild's name sees the strategies), and, at the
/// group's graceful shutdown, stops the strategies in reverse start order
/// (each given its stop timeout), the conditions, and releases every
/// lease, the client leases and the apps' inhibits too. Then no strategy
/// status or lease change follows: their streams end, so the bus, which
/// stops next, shows the last of them before it closes.
public struct StrategiesService: Service {
    /// The host's parts this service starts and stops.
    struct Parts: Sendable {
        var supervisor: Supervisor
        var registry: LeaseRegistry
        var conditions: ConditionMonitor
        var clientLeases: ClientLeases
        var inhibits: ForeignInhibits
    }

    let parts: Parts
    /// The configured strategies, in start order.
    let strategies: [SupervisedStrategy]
    /// Started before the strategies start; nil: nothing to wait for.
    let after: Started?
    /// Logs the start of the run (what runs, the power backend).
    let announce: @Sendable () -> Void
    let log: Logger
    /// Set once the strategies are started.
    public let started = Started()

    public func run() async {
        if let after, await !after.waitUnlessShutDown() { return }
        let parts = self.parts
        await withTaskGroup(of: Void.self) { group in
            // Strategies' LastError includes their leases' (the registry
            // shows the supervisor's errors each lease error from the start).
            group.addTask { await parts.supervisor.followErrors() }
            await parts.clientLeases.start()
            await parts.inhibits.start()
            await parts.supervisor.start(strategies)
            announce()
            await started.set(true)
            try? await gracefulShutdown()
            await stop()
            group.cancelAll()
        }
    }

    private func stop() async {
        log.notice("shutting down")
        await parts.clientLeases.refuseNewLeases()
        await parts.supervisor.stopAll()
        await parts.supervisor.endChanges()
        await parts.conditions.stop()
        await parts.registry.releaseEverything(detail: "host shutting down")
        await parts.clientLeases.stop()
        await parts.inhibits.stop()
        await parts.registry.endChanges()
    }
}
