import Foundation
import VigilDBus
import VigilKit

// Where the running host meets its D-Bus objects: the one place that knows
// both. The Bus code is given ``HostBusParts``, not the runtime; the
// runtime and its supervisor do not call into the Bus code.

extension HostRuntime {
    /// What the D-Bus objects are given of this host.
    public nonisolated var busParts: HostBusParts {
        var parts = HostBusParts(
            version: version, runId: runId, configPath: configPath, startedAt: startedAt, startedWallMicros: startedWallMicros,
            clock: clock, logging: logging, registry: registry, supervisor: supervisor, scheduler: scheduler, store: store,
            clientLeases: clientLeases, inhibits: inhibits, strategyBus: strategyBus, costs: costs,
            configuredStrategy: { [weak self] name in
                guard let configured = await self?.configuredStrategy(named: name) else { return nil }
                return HostBusParts.StrategyConfig(kind: configured.kind, values: configured.values)
            },
            reload: { [weak self] in
                await self?.reload() ?? ReloadResult(applied: false, messages: ["vigild is shutting down"])
            },
            health: { [weak self] in await self?.health() ?? HostHealth(storeUnwritable: nil, droppedLogLines: 0) },
            servesInhibits: { [weak self] in
                guard let host = await self?.config.host else { return false }
                return host.inhibits.mode == .auto && host.bus != .system
            })
        parts.sleepBreaks = { [weak self] in await self?.sleepBreakStream() ?? AsyncStream { $0.finish() } }
        return parts
    }
}

extension HostBusAPI {
    /// The objects of `runtime`, on `connection`.
    public init(runtime: HostRuntime, connection: DBusConnection, hostUID: UInt32) {
        self.init(parts: runtime.busParts, connection: connection, hostUID: hostUID)
    }
}

extension BusPresence {
    /// Puts the host (`parts`) on its bus: finds or starts the bus for
    /// `[host] bus` (`selection`), exports ``HostBusAPI`` (mutating methods
    /// allowed to root and to this process's uid), then owns
    /// `org.vigil.Vigil1`.
    public static func start(
        parts: HostBusParts, selection: BusSelection, stateDir: String,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        backoff: ReconnectBackoff = ReconnectBackoff(), log: Logger
    ) async throws(StartError) -> BusPresence {
        try await start(selection: selection, stateDir: stateDir, environment: environment, backoff: backoff, log: log) { connection in
            let api = HostBusAPI(parts: parts, connection: connection, hostUID: getuid())
            try await api.export()
            return api
        }
    }
}
