import VigilKit

/// Names and object paths of the `org.vigil.Vigil1` API (docs/dbus-api.md).
public enum HostBusNames {
    /// The bus name vigild owns.
    public static let busName = "org.vigil.Vigil1"
    /// The root object: the host, and the ObjectManager for everything below.
    public static let rootPath = "/org/vigil/Vigil1"
    public static let hostInterface = "org.vigil.Vigil1.Host"
    public static let strategyInterface = "org.vigil.Vigil1.Strategy"
    public static let leaseInterface = "org.vigil.Vigil1.Lease"
    public static let propertiesInterface = "org.freedesktop.DBus.Properties"
    public static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"

    /// `/org/vigil/Vigil1/Strategy/<escaped name>`.
    public static func strategyPath(_ name: String) -> String {
        rootPath + "/Strategy/" + escapePathElement(name)
    }

    /// `/org/vigil/Vigil1/Lease/<id in decimal>`.
    public static func leasePath(_ id: LeaseID) -> String {
        rootPath + "/Lease/" + String(id.rawValue)
    }

    /// Escapes a name into one object-path element the way systemd escapes
    /// unit names: every byte of the UTF-8 encoding outside `[A-Za-z0-9]`
    /// becomes `_` and two lowercase hex digits (`mail-sync` →
    /// `mail_2dsync`); the empty name is `_`. The mapping is one-to-one, so
    /// two strategies never share a path.
    public static func escapePathElement(_ name: String) -> String {
        guard !name.isEmpty else { return "_" }
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(name.utf8.count)
        for byte in name.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                out.append(byte)
            default:
                out += [UInt8(ascii: "_"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The name an escaped element stands for; nil if `element` is not
    /// something ``escapePathElement(_:)`` produces.
    public static func unescapePathElement(_ element: String) -> String? {
        if element == "_" { return "" }
        var bytes: [UInt8] = []
        var iterator = element.utf8.makeIterator()
        func hexValue(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        while let c = iterator.next() {
            if c == UInt8(ascii: "_") {
                guard let h = iterator.next().flatMap(hexValue), let l = iterator.next().flatMap(hexValue) else { return nil }
                bytes.append(h << 4 | l)
            } else {
                bytes.append(c)
            }
        }
        guard let name = String(validating: bytes, as: UTF8.self), escapePathElement(name) == element else { return nil }
        return name
    }
}
