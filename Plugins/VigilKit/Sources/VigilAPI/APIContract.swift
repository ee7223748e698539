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
        Host.name,
        objects: rootPath + " (with Properties, Introspectable, Peer and ObjectManager)",
        methods: [Host.listLeases.declaration, Host.listStrategies.declaration, Host.survival.declaration,
                  Host.beginBackgroundTask.declaration, Host.reload.declaration, Host.appPolicy.declaration,
                  Host.denyApp.declaration, Host.allowApp.declaration, Host.releaseLease.declaration],
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
        signals: [Host.leaseAcquired.declaration, Host.leaseRenewed.declaration, Host.leaseExpiring.declaration,
                  Host.leaseExpired.declaration, Host.leaseReleased.declaration, Host.strategyStateChanged.declaration,
                  Host.sleepBrokeLease.declaration]
    )

    /// `org.vigil.Vigil1.Host`'s methods and signals, each declared once
    /// with its Swift types.
    public enum Host {
        public static let name = "org.vigil.Vigil1.Host"

        public static let listLeases = Method(name, "ListLeases", out: Arg("leases", [LeaseRow].self))
        public static let listStrategies = Method(name, "ListStrategies", out: Arg("strategies", [StrategyRow].self))
        public static let survival = Method(name, "Survival", in: Arg("since_usec", UInt64.self), out: Arg("runs", [RunRow].self))
        public static let beginBackgroundTask = Method(
            name, "BeginBackgroundTask", in: Arg("name", String.self), Arg("reason", String.self), Arg("budget_usec", UInt64.self),
            out: Arg("lease", ObjectPath.self), Arg("fd", BusFileDescriptor.self))
        public static let reload = Method(name, "Reload", reply: ReloadReply.self)
        public static let appPolicy = Method(name, "AppPolicy", reply: AppPolicyReply.self)
        public static let denyApp = Method(name, "DenyApp", in: Arg("pattern", String.self), Arg("for_usec", UInt64.self),
                                           out: Arg("released", UInt32.self))
        public static let allowApp = Method(name, "AllowApp", in: Arg("pattern", String.self), out: Arg("lifted", Bool.self))
        public static let releaseLease = Method(name, "ReleaseLease", in: Arg("lease", UInt64.self))

        public static let leaseAcquired = Signal(name, "LeaseAcquired", LeaseAcquiredSignal.self)
        public static let leaseRenewed = Signal(name, "LeaseRenewed", LeaseRenewedSignal.self)
        public static let leaseExpiring = Signal(name, "LeaseExpiring", LeaseExpiringSignal.self)
        public static let leaseExpired = Signal(name, "LeaseExpired", LeaseExpiredSignal.self)
        public static let leaseReleased = Signal(name, "LeaseReleased", LeaseReleasedSignal.self)
        public static let strategyStateChanged = Signal(name, "StrategyStateChanged", StrategyStateChangedSignal.self)
        public static let sleepBrokeLease = Signal(name, "SleepBrokeLease", SleepBrokeLeaseSignal.self)
    }

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
        ClientLease.name,
        objects: rootPath + "/Lease/<id>, besides Lease, when a D-Bus client began the lease (BeginBackgroundTask)",
        methods: [ClientLease.end.declaration, ClientLease.renew.declaration],
        properties: [
            APIProperty("Owner", "s", emitsChange: .const),
            APIProperty("Uid", "u", emitsChange: .const),
            APIProperty("Pid", "u", emitsChange: .const),
            APIProperty("Name", "s", emitsChange: .const),
        ],
        signals: [ClientLease.expiring.declaration, ClientLease.expired.declaration]
    )

    /// `org.vigil.Vigil1.ClientLease`'s methods and signals.
    public enum ClientLease {
        public static let name = "org.vigil.Vigil1.ClientLease"

        public static let end = Method(name, "End")
        public static let renew = Method(name, "Renew", in: Arg("budget_usec", UInt64.self))

        public static let expiring = Signal(name, "Expiring", Arg("remaining_usec", UInt64.self))
        public static let expired = Signal(name, "Expired")
    }

    public static let downloadSession = APIInterface(
        DownloadSession.name,
        objects: rootPath + "/Strategy/<escaped name>, besides Strategy, of a download-session strategy",
        methods: [DownloadSession.enqueue.declaration, DownloadSession.cancel.declaration,
                  DownloadSession.pause.declaration, DownloadSession.resume.declaration]
    )

    /// `org.vigil.Vigil1.DownloadSession`'s methods, which the
    /// download-session strategy binds.
    public enum DownloadSession {
        public static let name = "org.vigil.Vigil1.DownloadSession"

        public static let enqueue = Method(
            name, "Enqueue", in: Arg("url", String.self), Arg("dest", String.self), Arg("options", [String: BusValue].self),
            out: Arg("download", ObjectPath.self))
        public static let cancel = Method(name, "Cancel", in: Arg("download", ObjectPath.self))
        public static let pause = Method(name, "Pause", in: Arg("download", ObjectPath.self))
        public static let resume = Method(name, "Resume", in: Arg("download", ObjectPath.self))
    }

    /// Its properties are the fields of ``DownloadRow``.
    public static let download = APIInterface(
        "org.vigil.Vigil1.Download",
        objects: rootPath + "/Strategy/<escaped name>/Download/<id>",
        properties: DownloadRow.fields.map { field in
            APIProperty(field.name, field.signature, emitsChange: DownloadRow.constant.contains(field.name) ? .const : .true)
        }
    )
}
