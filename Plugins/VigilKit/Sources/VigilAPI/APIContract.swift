/// The `org.vigil.Vigil1` D-Bus API, declared once (docs/dbus-api.md): the
/// bus name, the object paths, every interface vigild exports (its own and
/// the ones built-in strategies add) and the rows its methods return
/// (APIRows.swift). vigild exports these declarations, vigilctl and the
/// tests read them, and docs/org.vigil.Vigil1.xml is generated from them.
public enum VigilAPI {
    /// The bus name vigild owns.
    public static let busName = "org.vigil.Vigil1"
    /// The root object: the host, and the ObjectManager for everything below.
    public static let rootPath = "/org/vigil/Vigil1"
    /// The prefix of the API's own error names.
    public static let errorPrefix = busName + ".Error."
    /// A client lease's End or Renew after it ended (docs/dbus-api.md).
    public static let leaseEndedError = errorPrefix + "LeaseEnded"
    /// `DownloadSession.Enqueue` to a destination outside the strategy's `dir`.
    public static let destinationRefusedError = errorPrefix + "DestinationRefused"
    public static let propertiesInterface = "org.freedesktop.DBus.Properties"
    public static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"

    public static var hostInterface: String { host.name }
    public static var strategyInterface: String { strategy.name }
    public static var leaseInterface: String { lease.name }
    public static var clientLeaseInterface: String { clientLease.name }
    public static var downloadSessionInterface: String { downloadSession.name }
    public static var downloadInterface: String { download.name }

    // MARK: paths

    /// `/org/vigil/Vigil1/Strategy/<escaped name>`.
    public static func strategyPath(_ name: String) -> String {
        strategyPathPrefix + escapePathElement(name)
    }

    private static let strategyPathPrefix = rootPath + "/Strategy/"

    /// `/org/vigil/Vigil1/Lease/<id in decimal>`.
    public static func leasePath(_ id: LeaseID) -> String {
        leasePathPrefix + String(id.rawValue)
    }

    private static let leasePathPrefix = rootPath + "/Lease/"

    /// The id of the lease whose object is at `path` (``leasePath(_:)``);
    /// nil for any other path.
    public static func leaseID(path: String) -> LeaseID? {
        // One pass over the bytes: every property read of a lease object
        // parses its path (InterfacesAdded reads fourteen).
        var bytes = path.utf8.makeIterator()
        for expected in leasePathPrefix.utf8 {
            guard bytes.next() == expected else { return nil }
        }
        // Decimal as leasePath writes it: digits only (no sign), no leading
        // zero, within UInt64.
        var id: UInt64 = 0
        var digits = 0
        while let byte = bytes.next() {
            guard UInt8(ascii: "0")...UInt8(ascii: "9") ~= byte, digits == 0 || id != 0 else { return nil }
            let (tens, overflowed) = id.multipliedReportingOverflow(by: 10)
            let (sum, carried) = tens.addingReportingOverflow(UInt64(byte - UInt8(ascii: "0")))
            guard !overflowed, !carried else { return nil }
            id = sum
            digits += 1
        }
        return digits > 0 ? LeaseID(id) : nil
    }

    /// `Download/<id>`: a download's object below its strategy's object.
    public static func downloadRelativePath(_ id: UInt64) -> String {
        "Download/" + String(id)
    }

    /// The id of the download at `path` below the strategy object
    /// `strategyPath`; nil for any other path.
    public static func downloadID(path: String, strategyPath: String) -> UInt64? {
        let prefix = strategyPath + "/" + downloadRelativePath(0).dropLast()
        guard path.hasPrefix(prefix) else { return nil }
        return UInt64(path.dropFirst(prefix.count))
    }

    /// The strategy and id of the download object at `path`; nil for any
    /// other path.
    public static func download(at path: String) -> (strategy: String, id: UInt64)? {
        guard path.hasPrefix(strategyPathPrefix),
              let element = path.dropFirst(strategyPathPrefix.count).split(separator: "/").first,
              let strategy = unescapePathElement(String(element)),
              let id = downloadID(path: path, strategyPath: strategyPath(strategy)) else { return nil }
        return (strategy, id)
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

    // MARK: interfaces

    /// Every interface vigild can export, in the order of the XML.
    public static var interfaces: [APIInterface] { [host, strategy, lease, clientLease, downloadSession, download] }

    /// The declaration of the interface `name`, if the contract has one.
    public static func interface(named name: String) -> APIInterface? {
        interfaces.first { $0.name == name }
    }

    public static let host = APIInterface(
        "org.vigil.Vigil1.Host",
        objects: rootPath + " (with Properties, Introspectable, Peer and ObjectManager)",
        methods: [
            APIMethod("ListLeases", out: [BusArgument("leases", LeaseRow.arraySignature)]),
            APIMethod("ListStrategies", out: [BusArgument("strategies", StrategyRow.arraySignature)]),
            APIMethod("Survival", in: [BusArgument("since_usec", "t")], out: [BusArgument("runs", RunRow.arraySignature)]),
            APIMethod("BeginBackgroundTask", in: [BusArgument("name", "s"), BusArgument("reason", "s"), BusArgument("budget_usec", "t")],
                      out: [BusArgument("lease", "o"), BusArgument("fd", "h")]),
            APIMethod("Reload", out: [BusArgument("applied", "b"), BusArgument("messages", "as")]),
            APIMethod("AppPolicy", out: AppPolicyReply.fields.map { BusArgument($0.name, $0.signature) }),
            APIMethod("DenyApp", in: [BusArgument("pattern", "s"), BusArgument("for_usec", "t")], out: [BusArgument("released", "u")]),
            APIMethod("AllowApp", in: [BusArgument("pattern", "s")], out: [BusArgument("lifted", "b")]),
            APIMethod("ReleaseLease", in: [BusArgument("lease", "t")]),
        ],
        properties: [
            APIProperty("Version", "s", emitsChange: .const),
            APIProperty("RunId", "s", emitsChange: .const),
            APIProperty("StartedAt", "t", emitsChange: .const),
            APIProperty("SurvivalSeconds", "t", emitsChange: .false),
            APIProperty("PowerBackend", "s", emitsChange: .const),
            APIProperty("PowerBackendReason", "s", emitsChange: .const),
            APIProperty("WakeClock", "s", emitsChange: .const),
            APIProperty("WakeClockReason", "s", emitsChange: .const),
            APIProperty("CanWakeSystem", "b", emitsChange: .const),
            APIProperty("ConfigPath", "s", emitsChange: .const),
            APIProperty("StoreWritable", "b", emitsChange: .false),
            APIProperty("DroppedLogLines", "t", emitsChange: .false),
            APIProperty("Strategies", "ao", emitsChange: .true),
            APIProperty("Leases", "ao", emitsChange: .true),
        ],
        signals: [
            APISignal("LeaseAcquired", [BusArgument("lease", "o"), BusArgument("strategy", "s"), BusArgument("holds", "s")]),
            APISignal("LeaseRenewed", [BusArgument("lease", "o"), BusArgument("deadline", "t")]),
            APISignal("LeaseExpiring", [BusArgument("lease", "o"), BusArgument("remaining_usec", "t")]),
            APISignal("LeaseExpired", [BusArgument("lease", "o"), BusArgument("forced", "b")]),
            APISignal("LeaseReleased", [BusArgument("lease", "o"), BusArgument("reason", "s")]),
            APISignal("StrategyStateChanged", [BusArgument("strategy", "o"), BusArgument("state", "s"), BusArgument("last_error", "s")]),
            APISignal("SleepBrokeLease", [BusArgument("lease", "o"), BusArgument("holder", "s"), BusArgument("name", "s"),
                                          BusArgument("slept_usec", "t"), BusArgument("wake_cause", "s")]),
        ]
    )

    public static let strategy = APIInterface(
        "org.vigil.Vigil1.Strategy",
        objects: rootPath + "/Strategy/<escaped name>",
        properties: [
            APIProperty("Name", "s", emitsChange: .const),
            APIProperty("Kind", "s", emitsChange: .const),
            APIProperty("State", "s", emitsChange: .true),
            APIProperty("Restarts", "u", emitsChange: .true),
            APIProperty("LastError", "s", emitsChange: .true),
            APIProperty("LastErrorAt", "t", emitsChange: .true),
            APIProperty("WaitingFor", "s", emitsChange: .true),
            APIProperty("Config", "a{sv}", emitsChange: .const),
        ] + StrategyCostRow.fields.map {
            // Counters read when asked: a signal per change would wake the
            // bus for every wake, lease end and command (docs/dbus-api.md).
            APIProperty($0.name, $0.signature, emitsChange: .false)
        }
    )

    public static let lease = APIInterface(
        "org.vigil.Vigil1.Lease",
        objects: rootPath + "/Lease/<id>",
        properties: [
            APIProperty("Id", "t", emitsChange: .const),
            APIProperty("Strategy", "s", emitsChange: .const),
            APIProperty("Kind", "s", emitsChange: .const),
            APIProperty("Holds", "s", emitsChange: .const),
            APIProperty("Reason", "s", emitsChange: .const),
            APIProperty("AcquiredAt", "t", emitsChange: .const),
            APIProperty("Deadline", "t", emitsChange: .true),
            APIProperty("Renewals", "u", emitsChange: .true),
            APIProperty("State", "s", emitsChange: .true),
            APIProperty("Status", "a{sv}", emitsChange: .true),
        ]
    )

    public static let clientLease = APIInterface(
        "org.vigil.Vigil1.ClientLease",
        objects: rootPath + "/Lease/<id>, besides Lease, when a D-Bus client began the lease (BeginBackgroundTask)",
        methods: [
            APIMethod("End"),
            APIMethod("Renew", in: [BusArgument("budget_usec", "t")]),
        ],
        properties: [
            APIProperty("Owner", "s", emitsChange: .const),
            APIProperty("Uid", "u", emitsChange: .const),
            APIProperty("Pid", "u", emitsChange: .const),
            APIProperty("Name", "s", emitsChange: .const),
        ],
        signals: [
            APISignal("Expiring", [BusArgument("remaining_usec", "t")]),
            APISignal("Expired"),
        ]
    )

    public static let downloadSession = APIInterface(
        "org.vigil.Vigil1.DownloadSession",
        objects: rootPath + "/Strategy/<escaped name>, besides Strategy, of a download-session strategy",
        methods: [
            APIMethod("Enqueue", in: [BusArgument("url", "s"), BusArgument("dest", "s"), BusArgument("options", "a{sv}")],
                      out: [BusArgument("download", "o")]),
            APIMethod("Cancel", in: [BusArgument("download", "o")]),
            APIMethod("Pause", in: [BusArgument("download", "o")]),
            APIMethod("Resume", in: [BusArgument("download", "o")]),
        ]
    )

    /// Its properties are the fields of ``DownloadRow``.
    public static let download = APIInterface(
        "org.vigil.Vigil1.Download",
        objects: rootPath + "/Strategy/<escaped name>/Download/<id>",
        properties: DownloadRow.fields.map { field in
            APIProperty(field.name, field.signature, emitsChange: DownloadRow.constant.contains(field.name) ? .const : .true)
        }
    )
}
