import Foundation
import VigilDBus

/// The `[host] power` setting.
public enum PowerChoice: String, CaseIterable, Sendable, Equatable {
    /// logind if its name has an owner on the system bus, else a kernel wake
    /// lock if `wake_lock` is writable, else none.
    case auto
    case logind
    case wakelock
    case none
}

extension PowerChoice {
    /// Picks the backend and says why. `systemBus` connects to the system bus
    /// (`DBUS_SYSTEM_BUS_ADDRESS` is honoured, so tests can stand one in).
    /// An explicit choice that cannot work is an error; `auto` falls through.
    public func select(
        wakelockDir: String, probeTimeout: Duration = .seconds(3),
        systemBus: @escaping @Sendable () async throws -> DBusConnection
    ) async throws -> any PowerBackend {
        switch self {
        case .none:
            return NoPowerBackend(reason: "power = \"none\" in [host]")
        case .wakelock:
            guard WakelockPowerBackend.isUsable(directory: wakelockDir) else {
                throw PowerBackendError("power = \"wakelock\", but \(wakelockDir)/wake_lock is missing or not writable (kernel without CONFIG_PM_WAKELOCKS, or not root)")
            }
            return WakelockPowerBackend(directory: wakelockDir, reason: "power = \"wakelock\" in [host]")
        case .logind:
            let bus: DBusConnection
            do { bus = try await systemBus() } catch {
                throw PowerBackendError("power = \"logind\", but the system bus is unreachable: \(error)")
            }
            guard await LogindPowerBackend.isAvailable(on: bus) else {
                throw PowerBackendError("power = \"logind\", but org.freedesktop.login1 has no owner on the system bus")
            }
            return LogindPowerBackend(connection: bus, reason: "power = \"logind\" in [host]")
        case .auto:
            var why: [String] = []
            if let bus = await Self.answering(within: probeTimeout, systemBus) {
                if await LogindPowerBackend.isAvailable(on: bus) {
                    let logind = LogindPowerBackend(connection: bus, reason: "auto: org.freedesktop.login1 owns its name on the system bus and grants this user's inhibitors")
                    // logind answers, but may refuse this uid its leases
                    // (a user service without polkit's consent): then it
                    // is not a backend that works.
                    if let refusal = await logind.refusesInhibitors() {
                        why.append("logind refuses this user's inhibitors (\(refusal))")
                    } else {
                        return logind
                    }
                } else {
                    why.append("logind is not on the system bus")
                }
            } else {
                why.append("no system bus (none, or no answer within \(probeTimeout.vigilDescription))")
            }
            if WakelockPowerBackend.isUsable(directory: wakelockDir) {
                return WakelockPowerBackend(directory: wakelockDir, reason: "auto: \(why.joined(separator: ", ")); \(wakelockDir)/wake_lock is writable")
            }
            why.append("\(wakelockDir)/wake_lock is not writable")
            return NoPowerBackend(reason: "auto: \(why.joined(separator: ", ")); leases are tracked only")
        }
    }
}

extension PowerChoice {
    /// The system bus if it connects within `timeout`: `auto` must not hold
    /// up start-up on a bus that does not answer.
    static func answering(
        within timeout: Duration, _ systemBus: @escaping @Sendable () async throws -> DBusConnection
    ) async -> DBusConnection? {
        await withTaskGroup(of: DBusConnection?.self) { group in
            group.addTask { try? await systemBus() }
            group.addTask {
                try? await SystemClock().sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }
}
