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

    /// The name of the strategy whose object is at `path`
    /// (``strategyPath(_:)``); nil for any other path (a child object
    /// below a strategy's object too).
    public static func strategyName(path: String) -> String? {
        guard path.hasPrefix(strategyPathPrefix) else { return nil }
        let element = path.dropFirst(strategyPathPrefix.count)
        guard !element.contains("/") else { return nil }
        return unescapePathElement(String(element))
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
        Host.interface,
        objects: rootPath + " (with Properties, Introspectable, Peer and ObjectManager)",
        methods: [Host.listLeases.declaration, Host.listStrategies.declaration, Host.survival.declaration,
                  Host.beginBackgroundTask.declaration, Host.reload.declaration, Host.appPolicy.declaration,
                  Host.denyApp.declaration, Host.allowApp.declaration, Host.releaseLease.declaration],
        properties: [Host.version.declaration, Host.runId.declaration, Host.startedAt.declaration, Host.survivalSeconds.declaration,
                     Host.powerBackend.declaration, Host.powerBackendReason.declaration, Host.wakeClock.declaration,
                     Host.wakeClockReason.declaration, Host.canWakeSystem.declaration, Host.configPath.declaration,
                     Host.storeWritable.declaration, Host.droppedLogLines.declaration, Host.strategies.declaration,
                     Host.leases.declaration],
        signals: [Host.leaseAcquired.declaration, Host.leaseRenewed.declaration, Host.leaseExpiring.declaration,
                  Host.leaseExpired.declaration, Host.leaseReleased.declaration, Host.strategyStateChanged.declaration,
                  Host.sleepBrokeLease.declaration]
    )

    /// `org.vigil.Vigil1.Host`'s methods and signals, each declared once
    /// with its Swift types.
    public enum Host {
        public static let interface = "org.vigil.Vigil1.Host"

        public static let listLeases = Method(interface, "ListLeases", out: Arg("leases", [LeaseRow].self))
        public static let listStrategies = Method(interface, "ListStrategies", out: Arg("strategies", [StrategyRow].self))
        public static let survival = Method(interface, "Survival", in: Arg("since_usec", UInt64.self), out: Arg("runs", [RunRow].self))
        public static let beginBackgroundTask = Method(
            interface, "BeginBackgroundTask", in: Arg("name", String.self), Arg("reason", String.self), Arg("budget_usec", UInt64.self),
            out: Arg("lease", ObjectPath.self), Arg("fd", BusFileDescriptor.self))
        public static let reload = Method(interface, "Reload", reply: ReloadReply.self)
        public static let appPolicy = Method(interface, "AppPolicy", reply: AppPolicyReply.self)
        public static let denyApp = Method(interface, "DenyApp", in: Arg("pattern", String.self), Arg("for_usec", UInt64.self),
                                           out: Arg("released", UInt32.self))
        public static let allowApp = Method(interface, "AllowApp", in: Arg("pattern", String.self), out: Arg("lifted", Bool.self))
        public static let releaseLease = Method(interface, "ReleaseLease", in: Arg("lease", UInt64.self))

        public static let leaseAcquired = Signal(interface, "LeaseAcquired", LeaseAcquiredSignal.self)
        public static let leaseRenewed = Signal(interface, "LeaseRenewed", LeaseRenewedSignal.self)
        public static let leaseExpiring = Signal(interface, "LeaseExpiring", LeaseExpiringSignal.self)
        public static let leaseExpired = Signal(interface, "LeaseExpired", LeaseExpiredSignal.self)
        public static let leaseReleased = Signal(interface, "LeaseReleased", LeaseReleasedSignal.self)
        public static let strategyStateChanged = Signal(interface, "StrategyStateChanged", StrategyStateChangedSignal.self)
        public static let sleepBrokeLease = Signal(interface, "SleepBrokeLease", SleepBrokeLeaseSignal.self)

        public static let version = Property(interface, "Version", String.self, emitsChange: .const)
        public static let runId = Property(interface, "RunId", String.self, emitsChange: .const)
        public static let startedAt = Property(interface, "StartedAt", UInt64.self, emitsChange: .const)
        public static let survivalSeconds = Property(interface, "SurvivalSeconds", UInt64.self, emitsChange: .false)
        public static let powerBackend = Property(interface, "PowerBackend", String.self, emitsChange: .const)
        public static let powerBackendReason = Property(interface, "PowerBackendReason", String.self, emitsChange: .const)
        public static let wakeClock = Property(interface, "WakeClock", String.self, emitsChange: .const)
        public static let wakeClockReason = Property(interface, "WakeClockReason", String.self, emitsChange: .const)
        public static let canWakeSystem = Property(interface, "CanWakeSystem", Bool.self, emitsChange: .const)
        public static let configPath = Property(interface, "ConfigPath", String.self, emitsChange: .const)
        public static let storeWritable = Property(interface, "StoreWritable", Bool.self, emitsChange: .false)
        public static let droppedLogLines = Property(interface, "DroppedLogLines", UInt64.self, emitsChange: .false)
        public static let strategies = Property(interface, "Strategies", [ObjectPath].self, emitsChange: .true)
        public static let leases = Property(interface, "Leases", [ObjectPath].self, emitsChange: .true)
    }

    public static let strategy = APIInterface(
        Strategy.interface,
        objects: rootPath + "/Strategy/<escaped name>",
        properties: [
            Strategy.name.declaration, Strategy.kind.declaration, Strategy.state.declaration, Strategy.restarts.declaration,
            Strategy.lastError.declaration, Strategy.lastErrorAt.declaration, Strategy.waitingFor.declaration,
            Strategy.config.declaration,
        ] + StrategyCostRow.fields.map {
            // Counters read when asked: a signal per change would wake the
            // bus for every wake, lease end and command (docs/dbus-api.md).
            APIProperty($0.name, $0.signature, emitsChange: .false)
        }
    )

    /// `org.vigil.Vigil1.Strategy`'s properties (and the fields of
    /// ``StrategyCostRow``, its cost counters).
    public enum Strategy {
        public static let interface = "org.vigil.Vigil1.Strategy"

        public static let name = Property(interface, "Name", String.self, emitsChange: .const)
        public static let kind = Property(interface, "Kind", String.self, emitsChange: .const)
        public static let state = Property(interface, "State", String.self, emitsChange: .true)
        public static let restarts = Property(interface, "Restarts", UInt32.self, emitsChange: .true)
        public static let lastError = Property(interface, "LastError", String.self, emitsChange: .true)
        public static let lastErrorAt = Property(interface, "LastErrorAt", UInt64.self, emitsChange: .true)
        public static let waitingFor = Property(interface, "WaitingFor", String.self, emitsChange: .true)
        public static let config = Property(interface, "Config", [String: BusValue].self, emitsChange: .const)
    }

    public static let lease = APIInterface(
        Lease.interface,
        objects: rootPath + "/Lease/<id>",
        properties: [
            Lease.id.declaration, Lease.strategy.declaration, Lease.kind.declaration, Lease.holds.declaration,
            Lease.reason.declaration, Lease.acquiredAt.declaration, Lease.deadline.declaration, Lease.renewals.declaration,
            Lease.state.declaration, Lease.status.declaration,
        ]
    )

    /// `org.vigil.Vigil1.Lease`'s properties.
    public enum Lease {
        public static let interface = "org.vigil.Vigil1.Lease"

        public static let id = Property(interface, "Id", UInt64.self, emitsChange: .const)
        public static let strategy = Property(interface, "Strategy", String.self, emitsChange: .const)
        public static let kind = Property(interface, "Kind", String.self, emitsChange: .const)
        public static let holds = Property(interface, "Holds", String.self, emitsChange: .const)
        public static let reason = Property(interface, "Reason", String.self, emitsChange: .const)
        public static let acquiredAt = Property(interface, "AcquiredAt", UInt64.self, emitsChange: .const)
        public static let deadline = Property(interface, "Deadline", UInt64.self, emitsChange: .true)
        public static let renewals = Property(interface, "Renewals", UInt32.self, emitsChange: .true)
        public static let state = Property(interface, "State", String.self, emitsChange: .true)
        public static let status = Property(interface, "Status", [String: BusValue].self, emitsChange: .true)
    }

    public static let clientLease = APIInterface(
        ClientLease.interface,
        objects: rootPath + "/Lease/<id>, besides Lease, when a D-Bus client began the lease (BeginBackgroundTask)",
        methods: [ClientLease.end.declaration, ClientLease.renew.declaration],
        properties: [ClientLease.owner.declaration, ClientLease.uid.declaration, ClientLease.pid.declaration,
                     ClientLease.name.declaration],
        signals: [ClientLease.expiring.declaration, ClientLease.expired.declaration]
    )

    /// `org.vigil.Vigil1.ClientLease`'s methods and signals.
    public enum ClientLease {
        public static let interface = "org.vigil.Vigil1.ClientLease"

        public static let end = Method(interface, "End")
        public static let renew = Method(interface, "Renew", in: Arg("budget_usec", UInt64.self))

        public static let expiring = Signal(interface, "Expiring", Arg("remaining_usec", UInt64.self))
        public static let expired = Signal(interface, "Expired")

        public static let owner = Property(interface, "Owner", String.self, emitsChange: .const)
        public static let uid = Property(interface, "Uid", UInt32.self, emitsChange: .const)
        public static let pid = Property(interface, "Pid", UInt32.self, emitsChange: .const)
        public static let name = Property(interface, "Name", String.self, emitsChange: .const)
    }

    public static let downloadSession = APIInterface(
        DownloadSession.interface,
        objects: rootPath + "/Strategy/<escaped name>, besides Strategy, of a download-session strategy",
        methods: [DownloadSession.enqueue.declaration, DownloadSession.cancel.declaration,
                  DownloadSession.pause.declaration, DownloadSession.resume.declaration]
    )

    /// `org.vigil.Vigil1.DownloadSession`'s methods, which the
    /// download-session strategy binds.
    public enum DownloadSession {
        public static let interface = "org.vigil.Vigil1.DownloadSession"

        public static let enqueue = Method(
            interface, "Enqueue", in: Arg("url", String.self), Arg("dest", String.self), Arg("options", [String: BusValue].self),
            out: Arg("download", ObjectPath.self))
        public static let cancel = Method(interface, "Cancel", in: Arg("download", ObjectPath.self))
        public static let pause = Method(interface, "Pause", in: Arg("download", ObjectPath.self))
        public static let resume = Method(interface, "Resume", in: Arg("download", ObjectPath.self))
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
