import Foundation
import VigilDBus
import VigilKit

/// vigild's presence on its message bus: the bus found (or private bus
/// started) by ``BusLocator``, the connection, the exported objects, and
/// the well-known name `org.vigil.Vigil1`, requested only after the objects
/// are exported so a client that sees the name finds them.
///
/// ``stop()`` undoes it in reverse: releases the name, closes the
/// connection, and stops the private bus vigild started (removing its
/// address file). vigild's `BusPresenceService` starts and stops it inside
/// its `run()`; what the objects show of the host is ``HostBusParts``.
public actor BusPresence {
    /// The well-known name vigild owns.
    public static let wellKnownName = VigilAPI.busName

    /// The bus in use and where it came from.
    public private(set) var hostBus: BusLocator.HostBus
    /// The connection the objects are exported on (a new one after a reconnect).
    public private(set) var connection: DBusConnection
    /// Whatever `export` returned: kept alive as long as the presence.
    private var exported: (any Sendable)?
    /// The private bus to stop on shutdown: started by this vigild, or
    /// adopted from one that was killed.
    private var privateBus: PrivateBus?
    private let log: Logger
    private var stopped = false
    /// What reconnecting needs: how the bus was found and how to export.
    private let setup: Setup
    /// Waits for the connection to go away, then reconnects.
    private var watcher: Task<Void, Never>?
    /// Told when the connection is lost and when it is back (vigild sends it as STATUS=).
    private var onChange: (@Sendable (String?) -> Void)?
    /// Non-nil while the bus is lost: what happened, for STATUS= and status.
    public private(set) var trouble: String?

    /// The backoff between reconnect attempts: doubles from `initial` to `maximum`.
    public struct ReconnectBackoff: Sendable {
        public var initial: Duration
        public var maximum: Duration
        public init(initial: Duration = .milliseconds(250), maximum: Duration = .seconds(30)) {
            self.initial = initial
            self.maximum = maximum
        }
    }

    private struct Setup: Sendable {
        var selection: BusSelection
        var stateDir: String
        var environment: [String: String]
        var backoff: ReconnectBackoff
        var export: @Sendable (DBusConnection) async throws -> (any Sendable)?
    }

    /// Why vigild could not get onto its bus.
    public enum StartError: Error, CustomStringConvertible {
        /// A private bus was needed and could not be started.
        case noBus(String)
        /// The bus did not accept a connection.
        case unreachable(bus: String, reason: String)
        /// Exporting the objects failed.
        case exportFailed(String)
        /// Another connection owns `org.vigil.Vigil1` on this bus.
        case nameOwned(name: String, owner: String?, bus: String)
        /// The bus refused the name for another reason (policy, ...).
        case nameRefused(name: String, bus: String, reason: String)

        public var description: String {
            switch self {
            case let .noBus(reason): reason
            case let .unreachable(bus, reason): "cannot connect to \(bus): \(reason)"
            case let .exportFailed(reason): "cannot export the D-Bus objects: \(reason)"
            case let .nameOwned(name, owner, bus): "\(name) is already owned by \(owner ?? "another connection") on \(bus): is another vigild running?"
            case let .nameRefused(name, bus, reason): "cannot own \(name) on \(bus): \(reason)"
            }
        }
    }

    private init(hostBus: BusLocator.HostBus, connection: DBusConnection, exported: (any Sendable)?, privateBus: PrivateBus?, log: Logger, setup: Setup) {
        self.hostBus = hostBus
        self.privateBus = privateBus
        self.connection = connection
        self.exported = exported
        self.log = log
        self.setup = setup
    }

    /// Finds or starts the bus for `selection`, connects, runs `export`
    /// (which exports the objects on the connection and returns whatever
    /// must stay alive with them), then requests `org.vigil.Vigil1`.
    ///
    /// When the connection is later lost (the bus daemon went away), the
    /// presence logs it at error level and reconnects with `backoff`: it
    /// finds the bus again (restarting its own private bus at the same
    /// address file), runs `export` again on the new connection and
    /// re-requests the name.
    ///
    /// On failure everything started so far is undone (connection closed,
    /// private bus stopped) before the error is thrown.
    public static func start(
        selection: BusSelection, stateDir: String,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        backoff: ReconnectBackoff = ReconnectBackoff(),
        log: Logger,
        export: @escaping @Sendable (DBusConnection) async throws -> (any Sendable)?
    ) async throws(StartError) -> BusPresence {
        let setup = Setup(selection: selection, stateDir: stateDir, environment: environment, backoff: backoff, export: export)
        let (hostBus, connection, exported, privateBus) = try await connect(setup, log: log, again: false)
        let presence = BusPresence(hostBus: hostBus, connection: connection, exported: exported, privateBus: privateBus, log: log, setup: setup)
        await presence.watchConnection()
        return presence
    }

    /// One attempt: bus, connection, export, name. Undoes what it did on failure.
    private static func connect(_ setup: Setup, log: Logger, again: Bool) async throws(StartError)
        -> (BusLocator.HostBus, DBusConnection, (any Sendable)?, PrivateBus?) {
        let hostBus: BusLocator.HostBus
        do {
            hostBus = try BusLocator.hostBus(selection: setup.selection, stateDir: setup.stateDir, environment: setup.environment, log: log)
        } catch {
            throw .noBus("\(error)")
        }
        let busName = describe(hostBus)
        let connection: DBusConnection
        do {
            connection = try await DBusConnection.connect(to: hostBus.bus)
        } catch {
            await hostBus.privateBus?.stop()
            throw .unreachable(bus: busName, reason: "\(error)")
        }
        let exported: (any Sendable)?
        do {
            exported = try await setup.export(connection)
        } catch {
            await connection.close()
            await hostBus.privateBus?.stop()
            throw .exportFailed("\(error)")
        }
        do {
            try await connection.requestName(wellKnownName)
        } catch {
            if let api = exported as? HostBusAPI { await api.connectionLost() }
            await connection.close()
            await hostBus.privateBus?.stop()
            switch error {
            case let .alreadyOwned(name, owner): throw .nameOwned(name: name, owner: owner, bus: busName)
            case let .queued(name): throw .nameOwned(name: name, owner: nil, bus: busName)
            default: throw .nameRefused(name: wellKnownName, bus: busName, reason: "\(error)")
            }
        }
        let uniqueName = await connection.uniqueName
        // The address goes to the debug level: a private bus's is long, and
        // vigilctl finds it in the address file.
        log.notice("serving \(wellKnownName)\(again ? " again" : "") as \(uniqueName) on \(hostBus.origin); look at it with: \(hostBus.lookCommand)")
        log.debug("bus: \(busName); busctl: \(hostBus.busctlCommand)")
        var privateBus = hostBus.privateBus
        if let file = hostBus.reusedAddressFile, case let .address(address) = hostBus.bus {
            privateBus = await adoptPrivateBus(connection: connection, address: address, addressFile: file, log: log)
        }
        return (hostBus, connection, exported, privateBus)
    }

    /// Calls `body` with a description of the trouble when the bus is lost,
    /// and with nil when vigild is back on a bus.
    public func onChange(_ body: @escaping @Sendable (String?) -> Void) {
        onChange = body
    }

    private func watchConnection() {
        let connection = self.connection
        // Unstructured task: cancelled by stop(); otherwise it ends when the connection is lost.
        watcher = Task { [weak self] in
            await connection.disconnected()
            await self?.connectionLost(connection)
        }
    }

    /// The bus went away: end what lived on it, then reconnect with backoff
    /// until it works or the presence is stopped.
    private func connectionLost(_ lost: DBusConnection) async {
        guard !stopped, lost === connection else { return }
        let busName = Self.describe(hostBus)
        let backoff = setup.backoff
        log.error("lost the connection to \(busName); reconnecting (every \(backoff.initial) at first, at most every \(backoff.maximum))")
        trouble = "bus connection lost; reconnecting"
        onChange?(trouble)
        if let api = exported as? HostBusAPI { await api.connectionLost() }
        exported = nil
        await lost.close()
        // Our own private bus: stopped if it died (reaped, address file
        // removed), so finding the bus again starts a new one at that file.
        if let privateBus, !privateBus.isRunning {
            await privateBus.stop()
            log.notice("the private dbus-daemon (pid \(privateBus.pid)) is gone; starting a new one")
            self.privateBus = nil
        }
        var delay = backoff.initial
        var lastFailure = ""
        var attempts = 0
        while !stopped {
            // On the host's own boottime timer, not Task.sleep
            // (docs/architecture.md, "No polling").
            do { try await SystemClock().sleep(for: delay) } catch { return }
            guard !stopped else { return }
            attempts += 1
            do {
                let (hostBus, connection, exported, privateBus) = try await Self.connect(setup, log: log, again: true)
                guard !stopped else {
                    if let api = exported as? HostBusAPI { await api.stop() }
                    await connection.close()
                    return
                }
                self.hostBus = hostBus
                self.connection = connection
                self.exported = exported
                if let privateBus { self.privateBus = privateBus }
                log.notice("reconnected after \(attempts) attempt\(attempts == 1 ? "" : "s")")
                trouble = nil
                onChange?(nil)
                watchConnection()
                return
            } catch {
                // Each new reason once; the same one again is not repeated.
                if "\(error)" != lastFailure {
                    lastFailure = "\(error)"
                    log.warning("cannot reconnect yet: \(error); retrying")
                }
                trouble = "bus connection lost; reconnecting: \(error)"
                delay = min(delay * 2, backoff.maximum)
            }
        }
    }

    /// Shows the host's last changes (``HostBusAPI/drain()``), releases the
    /// name, closes the connection and stops a private bus vigild started.
    /// Idempotent.
    public func stop() async {
        guard !stopped else { return }
        stopped = true
        watcher?.cancel()
        if let api = exported as? HostBusAPI {
            // What the host published as it stopped (strategies stopped,
            // leases released) goes out before the connection closes.
            await api.drain()
            await api.stop()
        }
        if await connection.isConnected {
            do { try await connection.releaseName(Self.wellKnownName) } catch {
                log.debug("cannot release \(Self.wellKnownName): \(error)")
            }
        }
        await connection.close()
        if let privateBus {
            await privateBus.stop()
            log.info("stopped the private dbus-daemon (pid \(privateBus.pid)) and removed \(privateBus.addressFile)")
        }
        _ = exported
    }

    /// Takes over a private bus whose vigild was killed: we own the name
    /// on it now, so we stop it when we stop.
    private static func adoptPrivateBus(connection: DBusConnection, address: String, addressFile: String, log: Logger) async -> PrivateBus? {
        do {
            // The bus driver reports the daemon's own pid for its own name.
            let pid = try await connection.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "GetConnectionUnixProcessID", arguments: ["org.freedesktop.DBus"], returning: UInt32.self)
            if let adopted = PrivateBus.adopt(pid: pid_t(bitPattern: pid), address: address, addressFile: addressFile, log: log) {
                log.info("took over the private dbus-daemon (pid \(pid)) left by an earlier vigild; it stops with this one")
                return adopted
            }
            log.info("the private bus in \(addressFile) is served by pid \(pid), which this vigild cannot take over; leaving it running")
        } catch {
            log.info("cannot ask the private bus for its pid (\(error)); leaving it running")
        }
        return nil
    }

    /// "the session bus (unix:path=...)" and the like, for messages.
    private static func describe(_ hostBus: BusLocator.HostBus) -> String {
        let address = (try? DBusConnection.address(of: hostBus.bus)) ?? "?"
        return hostBus.origin.contains(address) ? hostBus.origin : "\(hostBus.origin) (\(address))"
    }
}
