import VigilDBus
import VigilKit

/// The freedesktop names, paths and interfaces vigild serves for apps that
/// ask the desktop to keep the machine awake (docs/desktop-integration.md).
public enum InhibitBusNames {
    public static let powerManagement = "org.freedesktop.PowerManagement"
    public static let powerManagementInterface = "org.freedesktop.PowerManagement.Inhibit"
    /// The standard path, and KDE's.
    public static let powerManagementPaths = ["/org/freedesktop/PowerManagement/Inhibit", "/org/freedesktop/PowerManagement"]
    public static let screenSaver = "org.freedesktop.ScreenSaver"
    public static let screenSaverInterface = "org.freedesktop.ScreenSaver"
    public static let screenSaverPaths = ["/org/freedesktop/ScreenSaver", "/ScreenSaver"]
    /// The portal backend's bus name (Configs/portal/vigil.portal).
    public static let portalBackend = "org.freedesktop.impl.portal.desktop.vigil"
    public static let portalPath = "/org/freedesktop/portal/desktop"
    public static let portalInterface = "org.freedesktop.impl.portal.Inhibit"
    public static let requestInterface = "org.freedesktop.impl.portal.Request"
    public static let sessionInterface = "org.freedesktop.impl.portal.Session"

    /// Every name, in the order they are requested.
    public static let names = [powerManagement, screenSaver, portalBackend]
}

/// Serves ``ForeignInhibits`` on vigild's (session) bus: the
/// `org.freedesktop.PowerManagement.Inhibit` and `org.freedesktop.ScreenSaver`
/// interfaces at all their usual paths, and the Inhibit portal backend with
/// its Request and Session objects. Each name is taken only if nobody owns
/// it, and may be replaced: a desktop's own power manager takes over, and
/// what was already granted stays until it is released.
actor InhibitBusBridge {
    typealias Credentials = @Sendable (DBusMethodCall) async throws -> (uid: UInt32, pid: UInt32)
    typealias Shown = @Sendable (LeaseID) async -> Void

    private let server: DBusObjectServer
    private let connection: DBusConnection
    private let inhibits: ForeignInhibits
    private let credentials: Credentials
    /// Returns once a lease's object is exported: the reply to an Inhibit
    /// comes after it, so the caller finds its lease on the bus at once.
    private let shown: Shown
    private let log: Logger
    /// Portal Request objects: handle path → (cookie, owner).
    private var requests: [String: (cookie: UInt32, owner: String)] = [:]
    /// Portal monitor Session objects: path → owner.
    private var sessions: [String: String] = [:]
    /// Request handles whose Inhibit is being granted.
    private var handlesBeingGranted: Set<String> = []

    init(server: DBusObjectServer, connection: DBusConnection, inhibits: ForeignInhibits, log: Logger,
         credentials: @escaping Credentials, shown: @escaping Shown) {
        self.server = server
        self.connection = connection
        self.inhibits = inhibits
        self.log = log
        self.credentials = credentials
        self.shown = shown
    }

    /// Exports the objects, then asks for each name that nobody owns.
    func export() async throws {
        for path in InhibitBusNames.powerManagementPaths {
            try await server.export(path, interfaces: [Self.powerManagement(self)])
        }
        for path in InhibitBusNames.screenSaverPaths {
            try await server.export(path, interfaces: [Self.screenSaver(self)])
        }
        try await server.export(InhibitBusNames.portalPath, interfaces: [Self.portal(self)])
        let server = self.server
        let log = self.log
        await inhibits.onHasInhibitChanged { has in
            // Unstructured task: not cancelled: one signal per path, from a synchronous callback;
            // it ends when the emits return.
            Task {
                for path in InhibitBusNames.powerManagementPaths {
                    do {
                        try await server.emit(path: path, interface: InhibitBusNames.powerManagementInterface, signal: "HasInhibitChanged", arguments: [.bool(has)])
                    } catch {
                        log.debug("cannot emit HasInhibitChanged: \(error)")
                    }
                }
            }
        }
        for name in InhibitBusNames.names {
            do {
                try await connection.requestName(name, flags: [.allowReplacement, .doNotQueue])
                log.info("serving \(name) for apps that keep the machine awake")
            } catch {
                switch error {
                case let .alreadyOwned(_, owner):
                    log.info("\(name) is already served by \(owner ?? "another connection") (a desktop's power manager?); leaving it to it")
                default:
                    log.notice("cannot own \(name): \(error)")
                }
            }
        }
    }

    // MARK: the calls

    private func caller(_ call: DBusMethodCall) async throws -> InhibitCaller {
        let (uid, pid) = try await credentials(call)
        return InhibitCaller(owner: call.sender, uid: uid, pid: pid, executable: InhibitCaller.executable(of: pid))
    }

    func inhibit(_ call: DBusMethodCall, source: InhibitSource, what: [String]) async throws -> [BusValue] {
        let app = try call.argument(0, as: String.self)
        let reason = try call.argument(1, as: String.self)
        do {
            let granted = try await inhibits.inhibit(source: source, app: app, reason: reason, what: what, caller: try await caller(call))
            await shown(granted.lease)
            return [.uint32(granted.cookie)]
        } catch let error as ClientLeaseError {
            throw error.dbusError
        }
    }

    func uninhibit(_ call: DBusMethodCall) async throws -> [BusValue] {
        do {
            try await inhibits.uninhibit(try call.argument(0, as: UInt32.self), caller: call.sender)
        } catch let error as ClientLeaseError {
            throw error.dbusError
        }
        return []
    }

    /// The portal backend's Inhibit: flags 4 (suspend) hold `sleep`, 8
    /// (idle) hold `idle`; 1 (logout) and 2 (user switch) are recorded (no
    /// service here could block them). The Request object at `handle` ends it.
    func portalInhibit(_ call: DBusMethodCall) async throws -> [BusValue] {
        guard case .objectPath(let handle) = call.arguments[0] else { throw DBusError.invalidArgs("handle must be an object path") }
        let appID = try call.argument(1, as: String.self)
        let flags = try call.argument(3, as: UInt32.self)
        guard flags & ~0xF == 0 else {
            throw DBusError.invalidArgs("flags \(flags) has bits other than 1 (logout), 2 (user switch), 4 (suspend) and 8 (idle)")
        }
        guard requests[handle] == nil, sessions[handle] == nil, !handlesBeingGranted.contains(handle),
              handle.hasPrefix("/org/freedesktop/portal/desktop/request/") else {
            throw DBusError.invalidArgs("the request handle must be a new path under /org/freedesktop/portal/desktop/request/")
        }
        var reason = ""
        if case .dict(_, _, let entries) = call.arguments[4] {
            for entry in entries {
                if case .string("reason") = entry.key, case .variant(.string(let text)) = entry.value { reason = text }
            }
        }
        var what: [String] = []
        if flags & 4 != 0 { what.append("sleep") }
        if flags & 8 != 0 { what.append("idle") }
        // The handle is taken from before the first suspension point: a
        // second Inhibit with it, meanwhile, is refused.
        handlesBeingGranted.insert(handle)
        defer { handlesBeingGranted.remove(handle) }
        let granted: (cookie: UInt32, lease: LeaseID)
        do {
            granted = try await inhibits.inhibit(source: .portal, app: appID, reason: reason, what: what, caller: try await caller(call))
        } catch let error as ClientLeaseError {
            throw error.dbusError
        }
        requests[handle] = (granted.cookie, call.sender)
        await shown(granted.lease)
        try await server.export(handle, interfaces: [Self.request(self, handle: handle)])
        return []
    }

    /// Request.Close: ends the inhibit (if it still runs) and removes the object.
    func closeRequest(_ handle: String, _ call: DBusMethodCall) async throws {
        guard let request = requests[handle], request.owner == call.sender else {
            throw DBusError.accessDenied("only the connection that made this request may close it")
        }
        requests[handle] = nil
        try? await inhibits.uninhibit(request.cookie, caller: call.sender)
        try? await server.unexport(handle)
    }

    /// CreateMonitor: a Session that reports the session running and the
    /// screensaver inactive once; vigild has no session state to change.
    func createMonitor(_ call: DBusMethodCall) async throws -> [BusValue] {
        guard case .objectPath(let session) = call.arguments[1] else { throw DBusError.invalidArgs("session_handle must be an object path") }
        guard sessions[session] == nil, requests[session] == nil, session.hasPrefix("/org/freedesktop/portal/desktop/session/") else {
            throw DBusError.invalidArgs("the session handle must be a new path under /org/freedesktop/portal/desktop/session/")
        }
        guard sessions.values.filter({ $0 == call.sender }).count < InhibitSettings.maxPerUID else {
            throw DBusError.limitsExceeded("this connection has \(InhibitSettings.maxPerUID) monitor sessions; close one first")
        }
        sessions[session] = call.sender
        do {
            try await server.export(session, interfaces: [Self.session(self, path: session)])
        } catch {
            sessions[session] = nil
            throw error
        }
        let server = self.server
        // Unstructured task: not cancelled: one signal, sent after the reply that created the
        // session; it ends when the emit returns.
        Task {
            try? await server.emit(path: InhibitBusNames.portalPath, interface: InhibitBusNames.portalInterface, signal: "StateChanged", arguments: [
                .objectPath(session),
                .dict(keySignature: "s", valueSignature: "v", [
                    BusDictEntry(key: .string("screensaver-active"), value: .variant(.bool(false))),
                    BusDictEntry(key: .string("session-state"), value: .variant(.uint32(1))),
                ]),
            ])
        }
        return [.uint32(0)]
    }

    func closeSession(_ path: String, _ call: DBusMethodCall) async throws {
        guard sessions[path] == call.sender else {
            throw DBusError.accessDenied("only the connection that created this session may close it")
        }
        sessions[path] = nil
        try? await server.emit(path: path, interface: InhibitBusNames.sessionInterface, signal: "Closed")
        try? await server.unexport(path)
    }

    /// A connection left the bus: its requests and sessions go (its
    /// inhibits are ended by ``ForeignInhibits/ownerVanished(_:)``).
    func ownerVanished(_ owner: String) async {
        for (path, request) in requests where request.owner == owner {
            requests[path] = nil
            try? await server.unexport(path)
        }
        for (path, sessionOwner) in sessions where sessionOwner == owner {
            sessions[path] = nil
            try? await server.unexport(path)
        }
    }

    // MARK: declarations

    /// The introspection XML of the freedesktop interfaces vigild serves
    /// for apps' inhibits, generated from the declarations it exports
    /// (docs/freedesktop-inhibit.xml, `vigild --print-inhibit-introspection`).
    static func introspectionXML() -> String {
        let n = InhibitBusNames.self
        let places = [
            (n.powerManagementInterface, "\(n.powerManagementPaths.joined(separator: ", ")) on \(n.powerManagement)"),
            (n.screenSaverInterface, "\(n.screenSaverPaths.joined(separator: ", ")) on \(n.screenSaver)"),
            (n.portalInterface, "\(n.portalPath) on \(n.portalBackend)"),
            (n.requestInterface, "the request handle xdg-desktop-portal passes to Inhibit"),
            (n.sessionInterface, "the session handle xdg-desktop-portal passes to CreateMonitor"),
        ]
        return HostBusInterfaces.document(
            [powerManagement(nil), screenSaver(nil), portal(nil), request(nil, handle: ""), session(nil, path: "")],
            isObjectManager: false, comment: """
            The freedesktop inhibit interfaces vigild serves for apps (see
                 docs/desktop-integration.md). Generated from the declarations vigild
                 exports, by its print-inhibit-introspection option; do not edit.
                 Where each interface lives:

            """ + places.map { "     \($0.0): \($0.1)\n" }.joined())
    }


    private static func gone() -> DBusError { .failed("vigild's D-Bus API is shutting down") }

    private static func notSupported(_ name: String, in inArguments: [DBusArgument] = [], out: [DBusArgument] = [], interface: String) -> DBusMethod {
        DBusMethod(name, in: inArguments, out: out) { _ in
            throw DBusError.notSupported("\(interface).\(name) is not implemented by vigild, which only keeps the machine awake (docs/desktop-integration.md)")
        }
    }

    static func powerManagement(_ bridge: InhibitBusBridge?) -> DBusInterface {
        DBusInterface(
            InhibitBusNames.powerManagementInterface,
            methods: [
                DBusMethod("Inhibit", in: [DBusArgument("application", String.self), DBusArgument("reason", String.self)],
                           out: [DBusArgument("cookie", UInt32.self)]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.inhibit(call, source: .powerManagement, what: ["sleep"])
                },
                DBusMethod("UnInhibit", in: [DBusArgument("cookie", UInt32.self)]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.uninhibit(call)
                },
                DBusMethod("HasInhibit", out: [DBusArgument("has_inhibit", Bool.self)]) { [weak bridge] _ in
                    guard let bridge else { throw gone() }
                    return [.bool(await bridge.inhibits.hasInhibit)]
                },
            ],
            signals: [DBusSignal("HasInhibitChanged", arguments: [DBusArgument("has_inhibit", "b")])]
        )
    }

    static func screenSaver(_ bridge: InhibitBusBridge?) -> DBusInterface {
        let name = InhibitBusNames.screenSaverInterface
        return DBusInterface(
            name,
            methods: [
                DBusMethod("Inhibit", in: [DBusArgument("application_name", String.self), DBusArgument("reason_for_inhibit", String.self)],
                           out: [DBusArgument("cookie", UInt32.self)]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.inhibit(call, source: .screenSaver, what: ["idle"])
                },
                DBusMethod("UnInhibit", in: [DBusArgument("cookie", UInt32.self)]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.uninhibit(call)
                },
                notSupported("Lock", interface: name),
                notSupported("SimulateUserActivity", interface: name),
                notSupported("GetActive", out: [DBusArgument("active", "b")], interface: name),
                notSupported("GetActiveTime", out: [DBusArgument("seconds", "u")], interface: name),
                notSupported("GetSessionIdleTime", out: [DBusArgument("seconds", "u")], interface: name),
                notSupported("SetActive", in: [DBusArgument("active", "b")], out: [DBusArgument("activated", "b")], interface: name),
                notSupported("Throttle", in: [DBusArgument("application_name", "s"), DBusArgument("reason_for_inhibit", "s")],
                             out: [DBusArgument("cookie", "u")], interface: name),
                notSupported("UnThrottle", in: [DBusArgument("cookie", "u")], interface: name),
            ],
            signals: [DBusSignal("ActiveChanged", arguments: [DBusArgument("active", "b")])]
        )
    }

    static func portal(_ bridge: InhibitBusBridge?) -> DBusInterface {
        DBusInterface(
            InhibitBusNames.portalInterface,
            methods: [
                DBusMethod("Inhibit", in: [DBusArgument("handle", "o"), DBusArgument("app_id", "s"), DBusArgument("window", "s"),
                                           DBusArgument("flags", "u"), DBusArgument("options", "a{sv}")]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.portalInhibit(call)
                },
                DBusMethod("CreateMonitor", in: [DBusArgument("handle", "o"), DBusArgument("session_handle", "o"), DBusArgument("app_id", "s"),
                                                 DBusArgument("window", "s")], out: [DBusArgument("response", "u")]) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    return try await bridge.createMonitor(call)
                },
                // Acknowledges a Query End state vigild never sends: nothing to do.
                DBusMethod("QueryEndResponse", in: [DBusArgument("session_handle", "o")]) { _ in [] },
            ],
            signals: [DBusSignal("StateChanged", arguments: [DBusArgument("session_handle", "o"), DBusArgument("state", "a{sv}")])]
        )
    }

    static func request(_ bridge: InhibitBusBridge?, handle: String) -> DBusInterface {
        DBusInterface(InhibitBusNames.requestInterface, methods: [
            DBusMethod("Close") { [weak bridge] call in
                guard let bridge else { throw gone() }
                try await bridge.closeRequest(handle, call)
                return []
            },
        ])
    }

    static func session(_ bridge: InhibitBusBridge?, path: String) -> DBusInterface {
        DBusInterface(
            InhibitBusNames.sessionInterface,
            methods: [
                DBusMethod("Close") { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    try await bridge.closeSession(path, call)
                    return []
                },
            ],
            properties: [.readOnly("version", UInt32.self, emitsChange: .const) { 1 }],
            signals: [DBusSignal("Closed")]
        )
    }
}
