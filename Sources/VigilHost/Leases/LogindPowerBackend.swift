import Foundation
import VigilDBus
import VigilKit

/// Holds the system with logind inhibitors
/// (`org.freedesktop.login1.Manager.Inhibit(what, who, why, mode) → h`, see
/// the org.freedesktop.login1(5) man page). The lease is the returned fd:
/// closing every copy releases it, so a host killed with `kill -9` cannot
/// leak an inhibitor.
public struct LogindPowerBackend: PowerBackend {
    public static let busName = "org.freedesktop.login1"
    public static let path = "/org/freedesktop/login1"
    public static let interface = "org.freedesktop.login1.Manager"

    /// A connection to the system bus.
    public let connection: DBusConnection
    public let reason: String
    public var name: String { "logind" }

    public init(connection: DBusConnection, reason: String = "configured") {
        self.connection = connection
        self.reason = reason
    }

    /// Whether logind's name has an owner on `connection`'s bus.
    public static func isAvailable(on connection: DBusConnection) async -> Bool {
        let reply = try? await connection.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameHasOwner", arguments: [.string(busName)]
        )
        return (try? reply?.argument(0, as: Bool.self)) == true
    }

    /// Whether logind refuses this process the inhibitors its leases take
    /// (a `sleep`/`block` inhibitor, taken and closed at once): the refusal
    /// (`AccessDenied`, from polkit or its absence), or nil when logind
    /// grants it or refuses for a passing reason.
    public func refusesInhibitors() async -> String? {
        do {
            let fd = try await inhibit(PowerHold(what: ["sleep"], mode: "block"), who: "vigild", why: "checking that logind grants vigild's leases")
            fd.close()
            return nil
        } catch let error as PowerBackendError where error.description.contains(DBusError.Name.accessDenied) {
            return error.description
        } catch {
            return nil
        }
    }

    public func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken {
        let fd = try await inhibit(hold, who: who, why: why)
        return LogindToken(backend: self, hold: hold, who: who, why: why, fd: fd)
    }

    /// logind's answer to Inhibit while its own sleep (or shutdown)
    /// operation is still finishing: right after a resume, until the
    /// suspend job is done (`m->action_what` in logind-dbus.c). Not a
    /// failure of the caller: the same call succeeds a moment later.
    public static let operationInProgress = "org.freedesktop.login1.OperationInProgress"

    /// How long Inhibit is retried while logind says its sleep operation is
    /// in progress, and the longest pause between tries. logind finishes the
    /// operation when the resume is complete, normally well within a second;
    /// the bound only stops a stuck logind from holding a caller forever.
    /// It is awake time (``AwakeClock``): a try that meets a suspend just
    /// starting waits through the whole sleep, and on the boottime clock a
    /// minute asleep used up the bound, so the first answer after the
    /// resume failed the lease (seen in the systemd guest under load).
    public static let busyRetryBound: Duration = .seconds(30)
    static let busyRetryPause: Duration = .milliseconds(100)

    func inhibit(_ hold: PowerHold, who: String, why: String) async throws -> BusFileDescriptor {
        let reply: DBusMessage
        let arguments: [BusValue] = [.string(hold.what.joined(separator: ":")), .string(who), .string(why), .string(hold.mode)]
        let clock = AwakeClock()
        let started = clock.now
        let giveUp = started + Self.busyRetryBound
        var pause: Duration = .milliseconds(20)
        var tries = 0
        while true {
            do {
                tries += 1
                reply = try await connection.call(
                    destination: Self.busName, path: Self.path, interface: Self.interface, member: "Inhibit", arguments: arguments)
                break
            } catch let error as DBusError where error.name == Self.operationInProgress && clock.now + pause < giveUp {
                // Sleep in progress: wait for logind to finish it, a short
                // while at a time, rather than fail the lease.
                try await clock.sleep(for: pause)
                pause = min(pause * 2, Self.busyRetryPause)
            } catch {
                let after = tries > 1 ? " (after \(tries) tries over \((clock.now - started).vigilDescription))" : ""
                throw PowerBackendError("logind refused Inhibit(\(hold.what.joined(separator: ":")), \(hold.mode))\(after): \(error)")
            }
        }
        guard let first = reply.body.first, let fd = try? BusFileDescriptor.decode(first) else {
            throw PowerBackendError("logind's Inhibit reply carried no file descriptor (signature \(reply.body.map(\.signature).joined()))")
        }
        return fd
    }
}

/// One inhibitor. Renewal takes a fresh inhibitor before closing the old one,
/// so there is never a moment without a hold.
actor LogindToken: PowerToken {
    let backend: LogindPowerBackend
    let hold: PowerHold
    let who: String
    let why: String
    private var fd: BusFileDescriptor?

    init(backend: LogindPowerBackend, hold: PowerHold, who: String, why: String, fd: BusFileDescriptor) {
        self.backend = backend
        self.hold = hold
        self.who = who
        self.why = why
        self.fd = fd
    }

    nonisolated var description: String { "logind inhibitor \(hold.what.joined(separator: ":"))/\(hold.mode)" }

    func renew(budget: Duration?) async throws {
        guard fd != nil else { throw PowerBackendError("the inhibitor was already released") }
        let fresh = try await backend.inhibit(hold, who: who, why: why)
        let old = fd
        fd = fresh
        old?.close()  // only now that the new inhibitor exists
    }

    func release() async {
        fd?.close()
        fd = nil
    }
}

extension LogindPowerBackend {
    /// Runs `onSleep` before every system sleep, under a logind delay lock.
    ///
    /// A `sleep`/`delay` inhibitor is held while the system is up. When logind
    /// announces `PrepareForSleep(true)`, `onSleep` runs and the inhibitor is
    /// closed afterwards, which lets the sleep proceed (logind waits at most
    /// `InhibitDelayMaxUSec`). `PrepareForSleep(false)` after resume takes a
    /// new delay lock and runs `onResume`. Cancel the returned task to stop
    /// watching.
    public func watchSleep(
        who: String, why: String = "run on_sleep hooks before the system sleeps",
        onSleep: @escaping @Sendable () async -> Void, onResume: @escaping @Sendable () async -> Void = {}
    ) async throws -> Task<Void, Never> {
        let signals = try await connection.signals(matching: DBusMatchRule(
            sender: Self.busName, path: Self.path, interface: Self.interface, member: "PrepareForSleep"))
        let delay = PowerHold(what: ["sleep"], mode: "delay")
        var lock: BusFileDescriptor? = try await inhibit(delay, who: who, why: why)
        // Unstructured task: returned; the caller cancels it to stop watching (see above).
        return Task {
            for await signal in signals {
                guard let starting = try? signal.argument(0, as: Bool.self) else { continue }
                if starting {
                    await onSleep()
                    lock?.close()
                    lock = nil
                } else if lock == nil {
                    lock = try? await inhibit(delay, who: who, why: why)
                    await onResume()
                }
            }
            lock?.close()
        }
    }
}
