import Foundation
import Glibc
import VigilDBus
import VigilKit

/// ``SleepSystem`` through logind on the system bus
/// (org.freedesktop.login1(5)): `ListInhibitors`, `ListSessions` and each
/// session's `Class`, `IdleHint` and `IdleSinceHintMonotonic`, the
/// Manager's `PreparingForSleep`, and `Suspend(false)` (not interactive: no
/// polkit prompt; root may always suspend, other users as polkit allows).
public struct LogindSleepSystem: SleepSystem {
    public let connection: DBusConnection
    /// vigild's own pid: its inhibitors (its leases, on_sleep's delay lock)
    /// are never another program's.
    public let ownPID: UInt32
    static let timeout: Duration = .seconds(5)

    public init(connection: DBusConnection, ownPID: UInt32 = UInt32(getpid())) {
        self.connection = connection
        self.ownPID = ownPID
    }

    private func manager(_ member: String, _ arguments: [BusValue] = []) async throws -> DBusMessage {
        try await connection.call(
            destination: LogindPowerBackend.busName, path: LogindPowerBackend.path, interface: LogindPowerBackend.interface,
            member: member, arguments: arguments, timeout: Self.timeout)
    }

    private func property(_ path: String, _ interface: String, _ name: String) async throws -> BusValue {
        let reply = try await connection.call(
            destination: LogindPowerBackend.busName, path: path, interface: "org.freedesktop.DBus.Properties",
            member: "Get", arguments: [.string(interface), .string(name)], timeout: Self.timeout)
        guard case .variant(let value)? = reply.body.first else { throw DBusError.failed("logind's \(name) answered \(reply.signature)") }
        return value
    }

    public func sleepBlockers() async throws -> [String] {
        let reply = try await manager("ListInhibitors")
        guard case .array(_, let rows)? = reply.body.first else { throw DBusError.failed("ListInhibitors answered \(reply.signature)") }
        return rows.compactMap { row in
            guard case .structure(let f) = row, f.count == 6, case .string(let what) = f[0], case .string(let who) = f[1],
                  case .string(let why) = f[2], case .string(let mode) = f[3], case .uint32(let pid) = f[5] else { return nil }
            guard mode == "block", what.split(separator: ":").contains("sleep"), pid != ownPID else { return nil }
            return "\(who) (pid \(pid)): \(why)"
        }
    }

    public func busySessions(since resumeMonotonicMicros: Int64) async throws -> [String] {
        let reply = try await manager("ListSessions")
        guard case .array(_, let rows)? = reply.body.first else { throw DBusError.failed("ListSessions answered \(reply.signature)") }
        var busy: [String] = []
        for row in rows.prefix(64) {
            guard case .structure(let f) = row, f.count == 5, case .string(let id) = f[0], case .string(let user) = f[2],
                  case .objectPath(let path) = f[4] else { continue }
            let session = "org.freedesktop.login1.Session"
            // Only a person's sessions: not user@.service's (`manager`) nor
            // greeters, lock screens or background ones.
            guard case .string(let sessionClass)? = try? await property(path, session, "Class"), sessionClass == "user",
                  case .bool(let idle)? = try? await property(path, session, "IdleHint"), !idle else { continue }
            // Not idle since before the suspend (a session left active when
            // the lid closed) is no one at the machine now; 0 is unknown.
            if case .uint64(let since)? = try? await property(path, session, "IdleSinceHintMonotonic"),
               since != 0, Int64(clamping: since) < resumeMonotonicMicros { continue }
            busy.append("session \(id) of \(user)")
        }
        return busy
    }

    public func sleepInProgress() async throws -> Bool {
        guard case .bool(let preparing) = try await property(LogindPowerBackend.path, LogindPowerBackend.interface, "PreparingForSleep") else {
            throw DBusError.failed("logind's PreparingForSleep is not a boolean")
        }
        return preparing
    }

    public func suspend() async throws {
        do {
            _ = try await manager("Suspend", [.bool(false)])
        } catch let error as DBusError where error.name == LogindPowerBackend.operationInProgress {
            throw SleepSystemBusy("\(error)")
        }
    }
}
