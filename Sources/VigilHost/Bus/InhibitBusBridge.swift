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

/// The members of the freedesktop inhibit interfaces, each declared once
/// with its Swift types (as VigilAPI declares vigild's own): the bridge
/// binds typed handlers to them and the XML is generated from them.
enum InhibitMembers {
    enum PowerManagement {
        static let name = InhibitBusNames.powerManagementInterface
        static let inhibit = Method(name, "Inhibit", in: Arg("application", String.self), Arg("reason", String.self),
                                    out: Arg("cookie", UInt32.self))
        static let unInhibit = Method(name, "UnInhibit", in: Arg("cookie", UInt32.self))
        static let hasInhibit = Method(name, "HasInhibit", out: Arg("has_inhibit", Bool.self))
        static let hasInhibitChanged = Signal(name, "HasInhibitChanged", Arg("has_inhibit", Bool.self))
    }

    enum ScreenSaver {
        static let name = InhibitBusNames.screenSaverInterface
        static let inhibit = Method(name, "Inhibit", in: Arg("application_name", String.self), Arg("reason_for_inhibit", String.self),
                                    out: Arg("cookie", UInt32.self))
        static let unInhibit = Method(name, "UnInhibit", in: Arg("cookie", UInt32.self))
        static let lock = Method(name, "Lock")
        static let simulateUserActivity = Method(name, "SimulateUserActivity")
        static let getActive = Method(name, "GetActive", out: Arg("active", Bool.self))
        static let getActiveTime = Method(name, "GetActiveTime", out: Arg("seconds", UInt32.self))
        static let getSessionIdleTime = Method(name, "GetSessionIdleTime", out: Arg("seconds", UInt32.self))
        static let setActive = Method(name, "SetActive", in: Arg("active", Bool.self), out: Arg("activated", Bool.self))
        static let throttle = Method(name, "Throttle", in: Arg("application_name", String.self), Arg("reason_for_inhibit", String.self),
                                     out: Arg("cookie", UInt32.self))
        static let unThrottle = Method(name, "UnThrottle", in: Arg("cookie", UInt32.self))
        static let activeChanged = Signal(name, "ActiveChanged", Arg("active", Bool.self))
    }

    enum Portal {
        static let name = InhibitBusNames.portalInterface
        static let inhibit = Method(name, "Inhibit", in: Arg("handle", ObjectPath.self), Arg("app_id", String.self), Arg("window", String.self),
                                    Arg("flags", UInt32.self), Arg("options", [String: BusValue].self))
        static let createMonitor = Method(name, "CreateMonitor", in: Arg("handle", ObjectPath.self), Arg("session_handle", ObjectPath.self),
                                          Arg("app_id", String.self), Arg("window", String.self), out: Arg("response", UInt32.self))
        static let queryEndResponse = Method(name, "QueryEndResponse", in: Arg("session_handle", ObjectPath.self))
        static let stateChanged = Signal(name, "StateChanged", Arg("session_handle", ObjectPath.self), Arg("state", [String: BusValue].self))
    }

    enum Request {
        static let close = Method(InhibitBusNames.requestInterface, "Close")
    }

    enum Session {
        static let close = Method(InhibitBusNames.sessionInterface, "Close")
        static let closed = Signal(InhibitBusNames.sessionInterface, "Closed")
    }
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
                        try await server.emit(InhibitMembers.PowerManagement.hasInhibitChanged, at: path, BusTuple(has))
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

    func inhibit(_ call: DBusMethodCall, source: InhibitSource, what: [String], app: String, reason: String) async throws -> BusTuple<UInt32> {
        do {
            let granted = try await inhibits.inhibit(source: source, app: app, reason: reason, what: what, caller: try await caller(call))
            await shown(granted.lease)
            return BusTuple(granted.cookie)
        } catch let error as ClientLeaseError {
            throw error.dbusError
        }
    }

    func uninhibit(_ call: DBusMethodCall, cookie: UInt32) async throws -> BusTuple< > {
        do {
            try await inhibits.uninhibit(cookie, caller: call.sender)
        } catch let error as ClientLeaseError {
            throw error.dbusError
        }
        return BusTuple()
    }

    /// The portal backend's Inhibit: flags 4 (suspend) hold `sleep`, 8
    /// (idle) hold `idle`; 1 (logout) and 2 (user switch) are recorded (no
    /// service here could block them). The Request object at `handle` ends it.
    func portalInhibit(_ call: DBusMethodCall, handle: ObjectPath, appID: String, flags: UInt32,
                       options: [String: BusValue]) async throws -> BusTuple< > {
        let handle = handle.rawValue
        guard flags & ~0xF == 0 else {
            throw DBusError.invalidArgs("flags \(flags) has bits other than 1 (logout), 2 (user switch), 4 (suspend) and 8 (idle)")
        }
        guard requests[handle] == nil, sessions[handle] == nil, !handlesBeingGranted.contains(handle),
              handle.hasPrefix("/org/freedesktop/portal/desktop/request/") else {
            throw DBusError.invalidArgs("the request handle must be a new path under /org/freedesktop/portal/desktop/request/")
        }
        let reason = options["reason"].flatMap { if case .string(let text) = $0 { text } else { nil } } ?? ""
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
        return BusTuple()
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
    func createMonitor(_ call: DBusMethodCall, session: ObjectPath) async throws -> BusTuple<UInt32> {
        let session = session.rawValue
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
            try? await server.emit(InhibitMembers.Portal.stateChanged, at: InhibitBusNames.portalPath, BusTuple(
                ObjectPath(session), ["screensaver-active": .bool(false), "session-state": .uint32(1)]))
        }
        return BusTuple(0)
    }

    func closeSession(_ path: String, _ call: DBusMethodCall) async throws {
        guard sessions[path] == call.sender else {
            throw DBusError.accessDenied("only the connection that created this session may close it")
        }
        sessions[path] = nil
        try? await server.emit(InhibitMembers.Session.closed, at: path, BusTuple())
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

    /// A method vigild declares (so apps find the whole interface) but
    /// does not implement: every call is answered NotSupported.
    private static func notSupported<each In, Out>(_ method: Method<repeat each In, Out>) -> DBusMethod {
        DBusMethod(method.name, in: method.declaration.inArguments, out: method.declaration.outArguments) { _ in
            throw DBusError.notSupported("\(method.interface).\(method.name) is not implemented by vigild, which only keeps the machine awake (docs/desktop-integration.md)")
        }
    }

    static func powerManagement(_ bridge: InhibitBusBridge?) -> DBusInterface {
        typealias M = InhibitMembers.PowerManagement
        return DBusInterface(
            M.name,
            methods: [
                DBusMethod(M.inhibit) { [weak bridge] call, application, reason in
                    guard let bridge else { throw gone() }
                    return try await bridge.inhibit(call, source: .powerManagement, what: ["sleep"], app: application, reason: reason)
                },
                DBusMethod(M.unInhibit) { [weak bridge] call, cookie in
                    guard let bridge else { throw gone() }
                    return try await bridge.uninhibit(call, cookie: cookie)
                },
                DBusMethod(M.hasInhibit) { [weak bridge] _ in
                    guard let bridge else { throw gone() }
                    return BusTuple(await bridge.inhibits.hasInhibit)
                },
            ],
            signals: [M.hasInhibitChanged.declaration]
        )
    }

    static func screenSaver(_ bridge: InhibitBusBridge?) -> DBusInterface {
        typealias M = InhibitMembers.ScreenSaver
        return DBusInterface(
            M.name,
            methods: [
                DBusMethod(M.inhibit) { [weak bridge] call, application, reason in
                    guard let bridge else { throw gone() }
                    return try await bridge.inhibit(call, source: .screenSaver, what: ["idle"], app: application, reason: reason)
                },
                DBusMethod(M.unInhibit) { [weak bridge] call, cookie in
                    guard let bridge else { throw gone() }
                    return try await bridge.uninhibit(call, cookie: cookie)
                },
                notSupported(M.lock),
                notSupported(M.simulateUserActivity),
                notSupported(M.getActive),
                notSupported(M.getActiveTime),
                notSupported(M.getSessionIdleTime),
                notSupported(M.setActive),
                notSupported(M.throttle),
                notSupported(M.unThrottle),
            ],
            signals: [M.activeChanged.declaration]
        )
    }

    static func portal(_ bridge: InhibitBusBridge?) -> DBusInterface {
        typealias M = InhibitMembers.Portal
        return DBusInterface(
            M.name,
            methods: [
                DBusMethod(M.inhibit) { [weak bridge] call, handle, appID, _, flags, options in
                    guard let bridge else { throw gone() }
                    return try await bridge.portalInhibit(call, handle: handle, appID: appID, flags: flags, options: options)
                },
                DBusMethod(M.createMonitor) { [weak bridge] call, _, session, _, _ in
                    guard let bridge else { throw gone() }
                    return try await bridge.createMonitor(call, session: session)
                },
                // Acknowledges a Query End state vigild never sends: nothing to do.
                DBusMethod(M.queryEndResponse) { _, _ in BusTuple() },
            ],
            signals: [M.stateChanged.declaration]
        )
    }

    static func request(_ bridge: InhibitBusBridge?, handle: String) -> DBusInterface {
        DBusInterface(InhibitBusNames.requestInterface, methods: [
            DBusMethod(InhibitMembers.Request.close) { [weak bridge] call in
                guard let bridge else { throw gone() }
                try await bridge.closeRequest(handle, call)
                return BusTuple()
            },
        ])
    }

    static func session(_ bridge: InhibitBusBridge?, path: String) -> DBusInterface {
        DBusInterface(
            InhibitBusNames.sessionInterface,
            methods: [
                DBusMethod(InhibitMembers.Session.close) { [weak bridge] call in
                    guard let bridge else { throw gone() }
                    try await bridge.closeSession(path, call)
                    return BusTuple()
                },
            ],
            properties: [.readOnly("version", UInt32.self, emitsChange: .const) { 1 }],
            signals: [InhibitMembers.Session.closed.declaration]
        )
    }
}
