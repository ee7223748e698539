import VigilDBus
import VigilKit

/// The declarations of `org.vigil.Vigil1.Host`, `.Strategy` and `.Lease`
/// (docs/dbus-api.md). The object server exports them and
/// `vigild --print-introspection` prints XML generated from the same values.
///
/// Handlers hold the API weakly: the server keeps the declarations, and the
/// API keeps the server. Built with a nil API (for introspection only), every
/// handler fails.
enum HostBusInterfaces {
    static let leaseRow = "(otssssttus)"
    static let strategyRow = "(osssus)"
    static let runRow = "(sttstttutu)"

    private static func gone() -> DBusError { .failed("vigild's D-Bus API is shutting down") }

    // MARK: Host

    static func host(_ api: HostBusAPI?) -> DBusInterface {
        let runtime = api?.services
        // Reads a constant of the host (or fails when built for introspection).
        func constant<T: DBusEncodable>(_ name: String, _ type: T.Type, emitsChange: DBusProperty.EmitsChange = .const,
                                        _ read: @escaping @Sendable (HostBusServices) async -> T) -> DBusProperty {
            .readOnly(name, type, emitsChange: emitsChange) {
                guard let runtime else { throw gone() }
                return await read(runtime)
            }
        }
        // One read without waiting: answered on the connection's queue.
        func constant<T: DBusEncodable>(_ name: String, _ type: T.Type, emitsChange: DBusProperty.EmitsChange = .const,
                                        _ read: @escaping @Sendable (HostBusServices) -> T) -> DBusProperty {
            DBusProperty(name, signature: T.dbusSignature, emitsChange: emitsChange) {
                guard let runtime else { throw gone() }
                return read(runtime).dbusValue
            }
        }
        return DBusInterface(
            HostBusNames.hostInterface,
            methods: [
                .prepared("ListLeases", out: [DBusArgument("leases", "a" + leaseRow)]) { [weak api] _ in
                    guard let api else { throw gone() }
                    return try api.leaseRows()
                },
                .immediate("ListStrategies", out: [DBusArgument("strategies", "a" + strategyRow)]) { [weak api] _ in
                    guard let api else { throw gone() }
                    return [api.strategyRows()]
                },
                DBusMethod("Survival", in: [DBusArgument("since_usec", UInt64.self)], out: [DBusArgument("runs", "a" + runRow)]) { [weak api] call in
                    guard let api else { throw gone() }
                    return [try api.survivalRows(since: try call.argument(0, as: UInt64.self))]
                },
                beginBackgroundTask(api),
                DBusMethod("Reload", out: [DBusArgument("applied", Bool.self), DBusArgument("messages", [String].self)]) { [weak api] call in
                    guard let api else { throw gone() }
                    let uid = try await api.credentials.of(call.sender).uid
                    try HostBusAPI.requireMayMutate(callerUID: uid, hostUID: api.hostUID, method: "\(HostBusNames.hostInterface).Reload")
                    let result = await api.services.reload()
                    return [.bool(result.applied), result.messages.dbusValue]
                },
            ],
            properties: [
                constant("Version", String.self) { $0.version },
                constant("RunId", String.self) { $0.runId },
                constant("StartedAt", UInt64.self) { UInt64(clamping: $0.startedWallMicros) },
                constant("SurvivalSeconds", UInt64.self, emitsChange: .false) { runtime in
                    UInt64(clamping: max(0, (runtime.clock.now - runtime.startedAt).components.seconds))
                },
                constant("PowerBackend", String.self) { $0.registry.backend.name },
                constant("PowerBackendReason", String.self) { $0.registry.backend.reason },
                constant("WakeClock", String.self) { $0.scheduler.clockInfo.clock },
                constant("WakeClockReason", String.self) { $0.scheduler.clockInfo.reason },
                constant("CanWakeSystem", Bool.self) { $0.scheduler.clockInfo.canWakeSystem },
                constant("ConfigPath", String.self) { $0.configPath },
                constant("StoreWritable", Bool.self, emitsChange: .false) { await $0.store.unwritableState == nil },
                constant("DroppedLogLines", UInt64.self, emitsChange: .false) { UInt64(clamping: await $0.health().droppedLogLines) },
                DBusProperty("Strategies", signature: "ao", emitsChange: .true) { [weak api] in
                    guard let api else { throw gone() }
                    return api.strategyPaths()
                },
                DBusProperty("Leases", signature: "ao", emitsChange: .true) { [weak api] in
                    guard let api else { throw gone() }
                    return api.leasePaths()
                },
            ],
            signals: [
                DBusSignal("LeaseAcquired", arguments: [DBusArgument("lease", "o"), DBusArgument("strategy", "s"), DBusArgument("holds", "s")]),
                DBusSignal("LeaseRenewed", arguments: [DBusArgument("lease", "o"), DBusArgument("deadline", "t")]),
                DBusSignal("LeaseExpiring", arguments: [DBusArgument("lease", "o"), DBusArgument("remaining_usec", "t")]),
                DBusSignal("LeaseExpired", arguments: [DBusArgument("lease", "o"), DBusArgument("forced", "b")]),
                DBusSignal("LeaseReleased", arguments: [DBusArgument("lease", "o"), DBusArgument("reason", "s")]),
                DBusSignal("StrategyStateChanged", arguments: [DBusArgument("strategy", "o"), DBusArgument("state", "s"), DBusArgument("last_error", "s")]),
            ]
        )
    }

    // MARK: Strategy

    static func strategy(_ api: HostBusAPI?, name: String) -> DBusInterface {
        func read(_ property: String, _ signature: String, _ emitsChange: DBusProperty.EmitsChange,
                  _ value: @escaping @Sendable (HostBusAPI.StrategyEntry) -> DBusValue) -> DBusProperty {
            DBusProperty(property, signature: signature, emitsChange: emitsChange) { [weak api] in
                guard let api else { throw gone() }
                guard let entry = api.strategy(named: name) else {
                    throw DBusError.unknownObject("strategy \"\(name)\" is no longer configured")
                }
                return value(entry)
            }
        }
        return DBusInterface(
            HostBusNames.strategyInterface,
            properties: [
                read("Name", "s", .const) { .string($0.status.name) },
                read("Kind", "s", .const) { .string($0.status.kind) },
                read("State", "s", .true) { .string($0.status.state.rawValue) },
                read("Restarts", "u", .true) { .uint32(UInt32(clamping: $0.status.restarts)) },
                read("LastError", "s", .true) { .string($0.status.lastError ?? "") },
                read("WaitingFor", "s", .true) { .string($0.status.waitingFor) },
                read("Config", "a{sv}", .const) { HostBusValues.configTable($0.config) },
            ]
        )
    }

    // MARK: Lease

    static func lease(_ api: HostBusAPI?, id: LeaseID) -> DBusInterface {
        func read(_ property: String, _ signature: String, _ emitsChange: DBusProperty.EmitsChange,
                  _ value: @escaping @Sendable (HostBusAPI.LeaseEntry) -> DBusValue) -> DBusProperty {
            DBusProperty(property, signature: signature, emitsChange: emitsChange) { [weak api] in
                guard let api else { throw gone() }
                guard let entry = api.lease(id) else {
                    throw DBusError.unknownObject("lease \(id) has ended")
                }
                return value(entry)
            }
        }
        return DBusInterface(
            HostBusNames.leaseInterface,
            properties: [
                read("Id", "t", .const) { .uint64($0.snapshot.id.rawValue) },
                read("Strategy", "s", .const) { .string($0.snapshot.strategy) },
                read("Kind", "s", .const) { .string($0.kind) },
                read("Holds", "s", .const) { .string($0.snapshot.holds) },
                read("Reason", "s", .const) { .string($0.snapshot.reason) },
                read("AcquiredAt", "t", .const) { .uint64(UInt64(clamping: $0.snapshot.acquiredWallMicros)) },
                read("Deadline", "t", .true) { .uint64(HostBusValues.deadlineWallMicros($0.snapshot)) },
                read("Renewals", "u", .true) { .uint32(UInt32(clamping: $0.snapshot.renewals)) },
                read("State", "s", .true) { .string($0.snapshot.state.rawValue) },
                read("Status", "a{sv}", .true) { HostBusValues.status($0.snapshot.status) },
            ]
        )
    }
}
