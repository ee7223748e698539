import Foundation
import Glibc
import VigilDBus

/// Which message bus vigild serves on: the `[host] bus` key.
public enum BusSelection: Sendable, Equatable, CustomStringConvertible {
    /// The user's session bus (`DBUS_SESSION_BUS_ADDRESS`, else
    /// `$XDG_RUNTIME_DIR/bus`, else a private bus vigild starts itself).
    case session
    /// The system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
    /// `/run/dbus/system_bus_socket`).
    case system
    /// An explicit D-Bus address such as `unix:path=/run/vigil/bus`.
    case address(String)

    /// Parses the `bus` setting: `"session"`, `"system"` or a D-Bus address
    /// (`transport:key=value,...`, several separated by `;`). Returns nil
    /// when the text is none of these.
    public init?(parsing text: String) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        switch trimmed {
        case "session": self = .session
        case "system": self = .system
        default:
            guard BusSelection.isValidAddress(trimmed) else { return nil }
            self = .address(trimmed)
        }
    }

    /// The spelling used in the config file.
    public var description: String {
        switch self {
        case .session: "session"
        case .system: "system"
        case let .address(address): address
        }
    }

    /// True for a D-Bus server address list: one or more
    /// `transport:key=value,key=value` entries separated by `;`, with a
    /// transport of letters, digits and `-`, non-empty keys, and values
    /// without NUL (libdbus would refuse them later with a vaguer message).
    public static func isValidAddress(_ text: String) -> Bool {
        guard !text.isEmpty, !text.utf8.contains(0) else { return false }
        let entries = text.split(separator: ";", omittingEmptySubsequences: true)
        guard !entries.isEmpty else { return false }
        for entry in entries {
            guard let colon = entry.firstIndex(of: ":") else { return false }
            let transport = entry[entry.startIndex..<colon]
            guard !transport.isEmpty, transport.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
                return false
            }
            let pairs = entry[entry.index(after: colon)...]
            if pairs.isEmpty { continue }
            for pair in pairs.split(separator: ",", omittingEmptySubsequences: false) {
                guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else { return false }
                if pair[pair.index(after: equals)...].isEmpty { return false }
            }
        }
        return true
    }
}

/// Finds the message bus for vigild and its clients.
///
/// The rule, the same on both sides (docs/dbus-api.md "Finding the bus"):
///
/// - `bus = "system"`: `DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket.
/// - `bus = "<address>"`: that address.
/// - `bus = "session"` (the default): `DBUS_SESSION_BUS_ADDRESS` if set;
///   else the user bus socket `$XDG_RUNTIME_DIR/bus` if it exists; else the
///   private bus a vigild started, whose address is in the **address file**
///   (``addressFile(stateDir:environment:)``).
public enum BusLocator {
    /// Where a vigild that started its own private bus writes the bus
    /// address: `$XDG_RUNTIME_DIR/vigil/bus`, or `<stateDir>/bus` when
    /// `XDG_RUNTIME_DIR` is unset. The file holds the address on one line,
    /// so `busctl --address=$(cat FILE) tree org.vigil.Vigil1` works.
    public static func addressFile(stateDir: String, environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let runtime = runtimeDirectory(environment) {
            return runtime + "/vigil/bus"
        }
        return (stateDir as NSString).appendingPathComponent("bus")
    }

    /// The bus a client (`vigilctl`, tests) should connect to for
    /// `selection`, or nil when there is none to find.
    ///
    /// - `.system` and `.address` always give a bus (whether anything
    ///   listens there shows when connecting).
    /// - `.session` gives, in order: `DBUS_SESSION_BUS_ADDRESS`; the user
    ///   bus `$XDG_RUNTIME_DIR/bus` if that socket exists; the address in
    ///   ``addressFile(stateDir:environment:)`` if the file exists and is
    ///   not empty. Otherwise nil: no session bus and no private bus from a
    ///   vigild, so no host can be reached (the caller says so).
    ///
    /// The address file is returned as found: if the vigild that wrote it
    /// was killed, connecting fails with the bus's own error. It never
    /// blocks and never connects.
    ///
    /// - Parameters:
    ///   - selection: the `[host] bus` setting of the config in use.
    ///   - stateDir: the `[host] state_dir` in use (the address file lives
    ///     there when `XDG_RUNTIME_DIR` is unset).
    ///   - environment: the process environment (injectable for tests).
    /// - Returns: a bus for `DBusConnection.connect(to:)`; session and
    ///   system buses come back as `.address` when the environment names
    ///   them, so an injected environment is honoured.
    public static func clientBus(
        selection: BusSelection, stateDir: String,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> DBusConnection.Bus? {
        switch selection {
        case .system:
            if let address = environment["DBUS_SYSTEM_BUS_ADDRESS"], !address.isEmpty { return .address(address) }
            return .system
        case let .address(address):
            return .address(address)
        case .session:
            if let bus = existingSessionBus(environment) { return bus }
            if let address = readAddressFile(addressFile(stateDir: stateDir, environment: environment)) {
                return .address(address)
            }
            return nil
        }
    }

    // MARK: - Shared pieces

    /// A session bus that exists without vigild's help:
    /// `DBUS_SESSION_BUS_ADDRESS`, else the user bus socket.
    static func existingSessionBus(_ environment: [String: String]) -> DBusConnection.Bus? {
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return .address(address) }
        if let runtime = runtimeDirectory(environment) {
            let socket = runtime + "/bus"
            var info = stat()
            if stat(socket, &info) == 0, (info.st_mode & S_IFMT) == S_IFSOCK {
                return .address("unix:path=" + socket)
            }
        }
        return nil
    }

    /// `XDG_RUNTIME_DIR` when set to an absolute path.
    static func runtimeDirectory(_ environment: [String: String]) -> String? {
        guard let dir = environment["XDG_RUNTIME_DIR"], dir.hasPrefix("/") else { return nil }
        return dir
    }

    /// The first line of an address file, or nil if missing or empty.
    static func readAddressFile(_ path: String) -> String? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let line = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
        return line.isEmpty ? nil : line
    }
}
