import VigilDBus

/// A typed client of vigild's `org.vigil.Vigil1` API: the Host object's
/// properties, methods and signals as the contract's rows (``HostRow``,
/// ``LeaseRow``, ``ReloadReply``, ``HostSignal``, ...), so no caller reads a
/// property by its name or a reply by position. vigilctl, vigil-bench and
/// the tests use it; it links VigilDBus and the contract, nothing of vigild.
///
/// Errors: `DBusError` for an error reply, a timeout or a lost connection;
/// ``APIDecodingError`` naming the member when a reply is not what the
/// contract declares (vigild and this client of different versions).
public struct VigilClient: Sendable {
    public let connection: DBusConnection
    /// How long each call waits for its reply.
    public var timeout: Duration
    /// Where calls go: vigild's well-known name, or a unique name (a host
    /// that exports its objects without owning the name, as tests do).
    public var destination: String

    public init(connection: DBusConnection, timeout: Duration = .seconds(10), destination: String = VigilAPI.busName) {
        self.connection = connection
        self.timeout = timeout
        self.destination = destination
    }

    /// Connects to `bus`; the caller closes the connection.
    public static func connect(to bus: DBusConnection.Bus, timeout: Duration = .seconds(10)) async throws -> VigilClient {
        VigilClient(connection: try await DBusConnection.connect(to: bus), timeout: timeout)
    }

    /// Whether vigild owns its name on this bus.
    public func hostIsRunning() async throws -> Bool {
        try await connection.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "NameHasOwner", arguments: [VigilAPI.busName], returning: Bool.self, timeout: timeout)
    }

    /// Calls a method of an interface outside the contract (the standard
    /// ones: Properties, ObjectManager) on vigild's object at `path`.
    public func call(_ member: String, path: String = VigilAPI.rootPath, interface: String,
                     arguments: [BusValue] = []) async throws -> DBusMessage {
        try await connection.call(destination: destination, path: path, interface: interface, member: member,
                                  arguments: arguments, timeout: timeout)
    }

    private typealias Host = VigilAPI.Host

    // MARK: the Host object

    /// Every Host property, in one `GetAll`.
    public func host() async throws -> HostRow {
        try await properties(of: VigilAPI.rootPath, interface: VigilAPI.hostInterface)
    }

    /// `ListLeases`: the active leases by id.
    public func leases() async throws -> [LeaseRow] { try await call(Host.listLeases).values }

    /// `ListStrategies`: the strategies in config order.
    public func strategies() async throws -> [StrategyRow] { try await call(Host.listStrategies).values }

    /// `Survival`: the runs that started at or after `sinceMicros` (µs since
    /// the epoch; 0 for all), newest first.
    public func survival(sinceMicros: UInt64 = 0) async throws -> [RunRow] {
        try await call(Host.survival, sinceMicros).values
    }

    /// `Reload`: whether the config was applied, and what changed or why not.
    public func reload() async throws -> ReloadReply { try await call(Host.reload) }

    /// `AppPolicy`: the live rules, the held app leases with their limits,
    /// and refusals and expiries per app since vigild started.
    public func appPolicy() async throws -> AppPolicyReply { try await call(Host.appPolicy) }

    /// `DenyApp`: denies apps matching `pattern` for `forMicros` (0: until
    /// vigild restarts); returns how many held leases it released.
    public func denyApp(_ pattern: String, forMicros: UInt64 = 0) async throws -> UInt32 {
        try await call(Host.denyApp, pattern, forMicros).values
    }

    /// `AllowApp`: whether a live deny of `pattern` was lifted.
    public func allowApp(_ pattern: String) async throws -> Bool {
        try await call(Host.allowApp, pattern).values
    }

    /// `ReleaseLease`: ends an app's inhibit or a client's lease now.
    public func releaseLease(_ id: UInt64) async throws {
        _ = try await call(Host.releaseLease, id)
    }

    /// A client lease `BeginBackgroundTask` granted: its object and the
    /// descriptor whose closing ends it.
    public struct BackgroundTask: Sendable {
        public var path: String
        public var fd: BusFileDescriptor
    }

    /// `BeginBackgroundTask`: a client lease with a budget of `budgetMicros`
    /// microseconds (0: none).
    public func beginBackgroundTask(name: String, reason: String, budgetMicros: UInt64) async throws -> BackgroundTask {
        let (lease, fd) = try await call(Host.beginBackgroundTask, name, reason, budgetMicros).values
        return BackgroundTask(path: lease.rawValue, fd: fd)
    }

    /// `ClientLease.Renew` of the client lease at `path`: a new budget of
    /// `budgetMicros` microseconds from now.
    public func renewLease(at path: String, budgetMicros: UInt64) async throws {
        _ = try await call(VigilAPI.ClientLease.renew, at: path, budgetMicros)
    }

    /// `ClientLease.End` of the client lease at `path`.
    public func endLease(at path: String) async throws {
        _ = try await call(VigilAPI.ClientLease.end, at: path)
    }

    // MARK: download sessions

    /// `DownloadSession.Enqueue` on the download-session strategy at
    /// `session` (its Strategy object): the new download's object path.
    public func enqueue(on session: String, url: String, dest: String, options: [String: BusValue] = [:]) async throws -> String {
        try await call(VigilAPI.DownloadSession.enqueue, at: session, url, dest, options).values.rawValue
    }

    /// `DownloadSession.Cancel`, `Pause` or `Resume` of `download` on the strategy at `session`.
    public func control(_ action: DownloadAction, _ download: String, on session: String) async throws {
        _ = try await call(action.method, at: session, ObjectPath(download))
    }

    /// What `control(_:_:on:)` does to a download.
    public enum DownloadAction: Sendable, CaseIterable {
        case cancel, pause, resume

        /// The contract's method for this action.
        public var method: Method<ObjectPath, BusTuple< >> {
            switch self {
            case .cancel: VigilAPI.DownloadSession.cancel
            case .pause: VigilAPI.DownloadSession.pause
            case .resume: VigilAPI.DownloadSession.resume
            }
        }
    }

    // MARK: any method

    /// Calls `method` on vigild's object at `path` with typed arguments;
    /// the reply is decoded as the contract declares it, or this throws
    /// ``APIDecodingError`` naming the method.
    public func call<each In, Out>(_ method: Method<repeat each In, Out>, at path: String = VigilAPI.rootPath,
                                   _ arguments: repeat each In) async throws -> Out {
        try await connection.call(method, destination: destination, path: path, repeat each arguments, timeout: timeout)
    }

    // MARK: any object

    /// Every property of `interface` at `path`, as the contract's row.
    public func properties<Row: APIRow>(of path: String, interface: String, as type: Row.Type = Row.self) async throws -> Row {
        let all = try await allProperties(of: path, interface: interface)
        return try decoding("GetAll(\(interface))") { () throws(APIDecodingError) in try Row(properties: all) }
    }

    /// Every property of `interface` at `path` by name, values unwrapped.
    public func allProperties(of path: String, interface: String) async throws -> [String: BusValue] {
        let reply = try await call("GetAll", path: path, interface: VigilAPI.propertiesInterface, arguments: [.string(interface)])
        guard reply.body.count == 1, let all = reply.body[0].dictionaryValue else {
            throw APIDecodingError("GetAll(\(interface)) returned \(reply.body.map(\.signature).joined()), not a{sv}")
        }
        return all
    }

    /// `property` of vigild's object at `path`, as its declared type.
    public func get<T>(_ property: Property<T>, at path: String = VigilAPI.rootPath) async throws -> T {
        try await connection.get(property, destination: destination, path: path, timeout: timeout)
    }

    /// One property of a row-declared interface (Download), unwrapped.
    public func property(_ name: String, of path: String, interface: String) async throws -> BusValue {
        let reply = try await call("Get", path: path, interface: VigilAPI.propertiesInterface,
                                   arguments: [.string(interface), .string(name)])
        guard reply.body.count == 1, case .variant(let value) = reply.body[0] else {
            throw APIDecodingError("Get(\(interface).\(name)) returned \(reply.body.map(\.signature).joined()), not v")
        }
        return value.unwrapped
    }

    // MARK: signals

    /// The Host's signals, decoded; one whose arguments are not the
    /// declared ones is skipped. The stream ends when the connection closes.
    public func hostSignals() async throws -> AsyncStream<HostSignal> {
        let messages = try await connection.signals(matching: DBusMatchRule(
            sender: destination, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface))
        return AsyncStream { continuation in
            // Unstructured task: cancelled by the stream's onTermination below (its consumer
            // stopped); ends by itself when the connection closes.
            let task = Task {
                for await message in messages {
                    if let member = message.member, let signal = try? HostSignal(member: member, body: message.body) {
                        continuation.yield(signal)
                    }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    // MARK: internals

    /// A reply that does not match the contract names the member.
    private func decoding<T>(_ member: String, _ body: () throws(APIDecodingError) -> T) throws(APIDecodingError) -> T {
        do { return try body() } catch {
            throw APIDecodingError("vigild's reply to \(member) is not what the contract declares: \(error.description)")
        }
    }
}
