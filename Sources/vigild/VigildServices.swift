import Foundation
import Glibc
import ServiceLifecycle
import VigilDBus
import VigilHost
import VigilKit

// vigild's own services, beside those the host makes of its parts (the
// survival record, the metrics endpoint, the sleep cycle, the strategies):
// the bus, the sleep hooks, the systemd watchdog, the service manager's
// READY/STATUS/STOPPING, the reload signal and the signals that stop it.
// Vigild.swift lists them in one ServiceGroup; their order there is their
// stop order, reversed.

/// How the bus came up: the one fact the service-manager notifications wait for.
enum BusOutcome: Sendable {
    case started(BusPresence)
    case failed(String)
}

/// Runs vigild's presence on its bus (``BusPresence``): starts once the
/// strategies have (so a client that sees the name sees them), stopped
/// after them, so the strategies' last states and the ends of their leases
/// are shown and announced before the connection closes. A bus that cannot
/// be started fails the run (``RunOutcome``) and the service, and the group
/// stops everything else gracefully.
struct BusPresenceService: Service {
    let parts: HostBusParts
    let settings: HostSettings
    /// Set once the strategies are started.
    let after: Started
    /// How the bus came up, for the service manager.
    let busOutcome: OneShot<BusOutcome>
    let runOutcome: RunOutcome
    let log: Logger

    func run() async throws {
        guard await after.waitUnlessShutDown() else { return }
        let bus: BusPresence
        do {
            bus = try await BusPresence.start(parts: parts, selection: settings.bus, stateDir: settings.stateDir, log: log)
        } catch {
            runOutcome.fail("\(error)")
            await busOutcome.set(.failed("\(error)"))
            throw error
        }
        await busOutcome.set(.started(bus))
        try? await gracefulShutdown()
        await bus.stop()
    }
}

/// The service manager's side (`NOTIFY_SOCKET`): READY=1 once vigild owns
/// its bus name, STATUS= when leases, the store's health or the bus change,
/// and STOPPING=1 as soon as vigild starts to stop (it stops first).
struct ServiceManagerService: Service {
    /// What the STATUS= line reads of the host, and what says it may have changed.
    struct HostStatus: Sendable {
        let registry: LeaseRegistry
        let strategyCount: @Sendable () async -> Int
        let health: @Sendable () async -> HostHealth
        let healthChanges: @Sendable () async -> AsyncStream<HostHealth>
    }

    let notifier: SystemdNotifier?
    let host: HostStatus
    let bus: OneShot<BusOutcome>
    let log: Logger

    func run() async {
        let outcome = bus
        switch await cancelWhenGracefulShutdown({ await outcome.wait() }) {
        case .started(let bus)?:
            notifier?.ready(status: await Self.statusLine(host, bus: bus))
            if let notifier {
                let host = self.host
                await cancelWhenGracefulShutdown { await Self.sendStatusUpdates(notifier, host: host, bus: bus) }
            } else {
                try? await gracefulShutdown()
            }
            notifier?.stopping()
        case .failed(let reason)?:
            notifier?.stopping(status: reason)
            // The bus service's failure shuts the group down; returning
            // before that would be a service ending on its own.
            try? await gracefulShutdown()
        case nil:
            notifier?.stopping()
        }
    }

    /// The one-line state sent as systemd's STATUS=.
    static func statusLine(_ host: HostStatus, bus: BusPresence) async -> String {
        let strategies = await host.strategyCount()
        let leases = await host.registry.activeCount
        let line = "\(strategies) strateg\(strategies == 1 ? "y" : "ies"), \(leases) active lease\(leases == 1 ? "" : "s")"
        let troubles = [await bus.trouble, await host.health().summary].compactMap { $0 }
        return ([line] + troubles).joined(separator: "; ")
    }

    /// Sends a STATUS= update whenever a lease changes, when the survival
    /// store stops or starts being writable and when the bus is lost or
    /// back (no timer: idle hosts send nothing), until cancelled.
    static func sendStatusUpdates(_ notifier: SystemdNotifier, host: HostStatus, bus: BusPresence) async {
        let (busChanges, busChanged) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        await bus.onChange { _ in busChanged.yield() }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                // The line counts leases: only their coming and going changes it.
                let comings = LeaseEventFilter(kinds: LeaseEventFilter.endings.union([.acquired]))
                for await _ in await host.registry.events(comings) { notifier.status(await statusLine(host, bus: bus)) }
            }
            group.addTask {
                for await _ in await host.healthChanges() { notifier.status(await statusLine(host, bus: bus)) }
            }
            group.addTask {
                for await _ in busChanges { notifier.status(await statusLine(host, bus: bus)) }
            }
        }
    }
}

/// Waits for SIGTERM or SIGINT, logs which, and returns: the group is
/// configured to shut down gracefully when this service returns. The
/// signals are handled here rather than by the group's
/// `gracefulShutdownSignals` so that the log names the signal
/// (`received SIGTERM`), as it always has.
struct StopSignalService: Service {
    let signals: AsyncStream<Int32>
    let log: Logger

    func run() async {
        let signals = self.signals
        guard let signal = await cancelWhenGracefulShutdown({ await signals.next() }) else { return }
        log.notice("received \(signal == SIGINT ? "SIGINT" : "SIGTERM")")
    }
}

/// SIGHUP re-reads the config, as `Host.Reload` does (``HostRuntime/reload()``,
/// which logs what changed, or the problems and that nothing changed): what a
/// daemon's SIGHUP is for. Until this service runs, a SIGHUP waits in the
/// stream (the signal is ignored from the start, so it never kills vigild).
struct ReloadSignalService: Service {
    let signals: AsyncStream<Int32>
    let reload: @Sendable () async -> ReloadResult
    let log: Logger

    func run() async {
        for await _ in signals.cancelOnGracefulShutdown() {
            log.notice("received SIGHUP: reloading the config")
            _ = await reload()
        }
    }
}

/// `[host] on_sleep` (``SleepHooks``): watches for sleep from the start of
/// the group until it stops; ends at once when there is nothing to watch.
struct SleepHooksService: Service {
    let settings: HostSettings
    let power: any PowerBackend
    let log: Logger
    let events: any EventRecording

    func run() async {
        guard let watch = await SleepHooks.start(settings: settings, backend: power, log: log, events: events) else { return }
        try? await gracefulShutdown()
        watch.cancel()
        await watch.value
    }
}

/// WATCHDOG=1 to the service manager (``SystemdNotifier/startWatchdog``);
/// ends at once when no watchdog was asked for.
struct WatchdogService: Service {
    let notifier: SystemdNotifier?
    let scheduler: any WakeScheduling
    let clock: any VigilClock
    let log: Logger

    func run() async {
        guard let watchdog = notifier?.startWatchdog(scheduler: scheduler, clock: clock, log: log) else { return }
        try? await gracefulShutdown()
        watchdog.cancel()
        await watchdog.value
    }
}
