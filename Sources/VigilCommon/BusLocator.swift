import Foundation
import Glibc
import VigilDBus
import VigilKit

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

    /// True when some `unix:path=` or `unix:abstract=` entry of `address`
    /// accepts a connection right now, or the address uses another
    /// transport (left to the D-Bus connection to judge).
    public static func acceptsConnections(_ address: String) -> Bool {
        var sawUnix = false
        for entry in address.split(separator: ";") {
            guard entry.hasPrefix("unix:") else { return true }
            var path: String?
            var abstract: String?
            for pair in entry.dropFirst(5).split(separator: ",") {
                if pair.hasPrefix("path=") { path = unescapeAddressValue(pair.dropFirst(5)) }
                if pair.hasPrefix("abstract=") { abstract = unescapeAddressValue(pair.dropFirst(9)) }
            }
            if let path {
                sawUnix = true
                if connectUnix(Array(path.utf8)) { return true }
            } else if let abstract {
                sawUnix = true
                if connectUnix([0] + Array(abstract.utf8)) { return true }
            }
        }
        return !sawUnix
    }

    // MARK: - Shared pieces

    /// A session bus that exists without vigild's help:
    /// `DBUS_SESSION_BUS_ADDRESS`, else the user bus socket.
    package static func existingSessionBus(_ environment: [String: String]) -> DBusConnection.Bus? {
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
    package static func runtimeDirectory(_ environment: [String: String]) -> String? {
        guard let dir = environment["XDG_RUNTIME_DIR"], dir.hasPrefix("/") else { return nil }
        return dir
    }

    /// Connects a stream socket to `sun_path` bytes; true on success.
    private static func connectUnix(_ pathBytes: [UInt8]) -> Bool {
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard pathBytes.count < capacity else { return false }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, byte) in pathBytes.enumerated() { raw[i] = byte }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count + (pathBytes.first == 0 ? 0 : 1))
        let result = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, length) }
        }
        return result == 0
    }

    /// Undoes D-Bus address escaping (`%xx`).
    private static func unescapeAddressValue(_ value: Substring) -> String {
        var bytes: [UInt8] = []
        var iterator = Array(value.utf8).makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%"), let high = iterator.next(), let low = iterator.next(),
               let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16) {
                bytes.append(value)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The first line of an address file, or nil if missing or empty.
    package static func readAddressFile(_ path: String) -> String? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let line = text.split(whereSeparator: \.isNewline).first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? ""
        return line.isEmpty ? nil : line
    }
}
