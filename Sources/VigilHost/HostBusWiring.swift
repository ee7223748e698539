import Foundation
import VigilDBus
import VigilKit

// Where the running host meets its D-Bus objects: the one place that knows
// both. The Bus code is given ``HostBusServices``, not the runtime; the
// runtime and its supervisor do not call into the Bus code.

extension HostRuntime {
    /// What the D-Bus objects are given of this host.
    public nonisolated var busServices: HostBusServices {
        var services = HostBusServices(
            version: version, runId: runId, configPath: configPath, startedAt: startedAt, startedWallMicros: startedWallMicros,
            clock: clock, logging: logging, registry: registry, supervisor: supervisor, scheduler: scheduler, store: store,
            clientLeases: clientLeases, inhibits: inhibits, strategyBus: strategyBus, costs: costs,
            configuredStrategy: { [weak self] name in
                guard let configured = await self?.configuredStrategy(named: name) else { return nil }
                return HostBusServices.StrategyConfig(kind: configured.kind, values: configured.values)
            },
            reload: { [weak self] in
                await self?.reload() ?? ReloadResult(applied: false, messages: ["vigild is shutting down"])
            },
            health: { [weak self] in await self?.health() ?? HostHealth(storeUnwritable: nil, droppedLogLines: 0) },
            servesInhibits: { [weak self] in
                guard let host = await self?.config.host else { return false }
                return host.inhibits.mode == .auto && host.bus != .system
            })
        services.sleepBreaks = { [weak self] in await self?.sleepBreakStream() ?? AsyncStream { $0.finish() } }
        return services
    }
}

extension HostBusAPI {
    /// The objects of `runtime`, on `connection`.
    public init(runtime: HostRuntime, connection: DBusConnection, hostUID: UInt32) {
        self.init(services: runtime.busServices, connection: connection, hostUID: hostUID)
    }
}

extension BusService {
    /// Serves `runtime` on its bus: finds or starts the bus for the
    /// runtime's `[host] bus`, exports ``HostBusAPI`` (mutating methods
    /// allowed to root and to this process's uid), then owns
    /// `org.vigil.Vigil1`.
    public static func start(
        runtime: HostRuntime, environment: [String: String] = ProcessInfo.processInfo.environment,
        backoff: ReconnectBackoff = ReconnectBackoff(), log: Logger
    ) async throws(StartError) -> BusService {
        let settings = await runtime.config.host
        return try await start(selection: settings.bus, stateDir: settings.stateDir, environment: environment, backoff: backoff, log: log) { connection in
            let api = HostBusAPI(runtime: runtime, connection: connection, hostUID: getuid())
            try await api.export()
            return api
        }
    }

}
