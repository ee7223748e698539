import Foundation
import Glibc
import VigilCommon
import VigilDBus
import VigilKit

/// The host's side of ``BusLocator``: finding, or starting, the bus vigild
/// serves on. The client's side (VigilCommon) is shared with vigilctl.
extension BusLocator {
    /// The bus vigild serves on, and the private daemon it started, if any.
    public struct HostBus: Sendable {
        /// What to pass to `DBusConnection.connect(to:)`.
        public var bus: DBusConnection.Bus
        /// Where the bus came from, for messages ("the session bus
        /// (DBUS_SESSION_BUS_ADDRESS)", "vigild's private bus", ...).
        public var origin: String
        /// The daemon vigild started; stop it on shutdown (nil otherwise).
        public var privateBus: PrivateBus?
        /// The address file this bus was read from, when it is a private
        /// bus an earlier vigild started: whoever then owns the name takes
        /// the daemon over (see ``PrivateBus/adopt(pid:address:addressFile:log:)``).
        public var reusedAddressFile: String?

        public init(bus: DBusConnection.Bus, origin: String, privateBus: PrivateBus? = nil, reusedAddressFile: String? = nil) {
            self.bus = bus
            self.origin = origin
            self.privateBus = privateBus
            self.reusedAddressFile = reusedAddressFile
        }

        /// How a person looks at the host on this bus, short enough for
        /// the start-up line: `vigilctl status` finds the session, system
        /// and private buses by itself; a bus named in the config needs
        /// busctl with its address.
        public var lookCommand: String {
            switch bus {
            case .session: return "vigilctl status, or busctl --user tree org.vigil.Vigil1"
            case .system: return "vigilctl status, or busctl --system tree org.vigil.Vigil1"
            case .address: return privateBus != nil || reusedAddressFile != nil ? "vigilctl status" : busctlCommand
            }
        }

        /// A `busctl` command line that reaches this bus.
        public var busctlCommand: String {
            switch bus {
            case .session: return "busctl --user tree org.vigil.Vigil1"
            case .system: return "busctl --system tree org.vigil.Vigil1"
            case let .address(address): return "busctl --address=\(shellQuoted(address)) tree org.vigil.Vigil1"
            }
        }
    }

    /// Finds (or, for a missing session bus, starts) the bus vigild serves on.
    ///
    /// For `.session` without `DBUS_SESSION_BUS_ADDRESS` or a
    /// `$XDG_RUNTIME_DIR/bus` socket: if the address file names a bus that
    /// still accepts connections (a private bus another vigild started),
    /// that bus is used, so a second vigild meets the first one's name
    /// instead of hiding behind a bus of its own. Otherwise a stale file is
    /// replaced: a private `dbus-daemon` is started in the address file's
    /// directory, its address written to the file, and the `busctl` command
    /// to reach it logged.
    ///
    /// - Throws: ``PrivateBus/StartError`` when a private bus is needed and
    ///   cannot be started.
    public static func hostBus(
        selection: BusSelection, stateDir: String,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        log: Logger
    ) throws -> HostBus {
        switch selection {
        case .system:
            let bus = clientBus(selection: .system, stateDir: stateDir, environment: environment) ?? .system
            return HostBus(bus: bus, origin: "the system bus", privateBus: nil)
        case let .address(address):
            return HostBus(bus: .address(address), origin: "the bus at \(address) ([host] bus)", privateBus: nil)
        case .session:
            if let bus = existingSessionBus(environment) {
                let origin = environment["DBUS_SESSION_BUS_ADDRESS"].map { !$0.isEmpty } == true
                    ? "the session bus (DBUS_SESSION_BUS_ADDRESS)" : "the user bus ($XDG_RUNTIME_DIR/bus)"
                return HostBus(bus: bus, origin: origin, privateBus: nil)
            }
            let file = addressFile(stateDir: stateDir, environment: environment)
            if let address = readAddressFile(file) {
                if acceptsConnections(address) {
                    log.info("no session bus; using the private bus named in \(file): \(address)")
                    return HostBus(bus: .address(address), origin: "the private bus named in \(file)", reusedAddressFile: file)
                }
                log.notice("replacing \(file): its bus \(address) is gone (the vigild that started it did not stop cleanly)")
            }
            let directory = (file as NSString).deletingLastPathComponent
            let started = try PrivateBus.start(socketDirectory: directory, addressFile: file, environment: environment, log: log)
            let host = HostBus(bus: .address(started.address), origin: "vigild's private bus", privateBus: started)
            log.notice("no session bus: started a private dbus-daemon (pid \(started.pid)); its address is in \(file)")
            if getuid() == 0, environment["INVOCATION_ID"] != nil {
                log.warning("running as a system service with [host] bus = \"session\": only clients that read \(file) can reach this host; set bus = \"system\" (docs/deployment.md)")
            }
            return host
        }
    }
}

/// `text` as one shell word: unchanged when it holds only safe characters,
/// else in single quotes.
private func shellQuoted(_ text: String) -> String {
    let safe = text.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "-_=:,./@%+".contains($0)) }
    return safe ? text : "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
}
