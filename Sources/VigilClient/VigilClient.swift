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

    /// Calls a method of vigild's object at `path`.
    public func call(_ member: String, path: String = VigilAPI.rootPath, interface: String = VigilAPI.hostInterface,
                     arguments: [BusValue] = []) async throws -> DBusMessage {
        try await connection.call(destination: destination, path: path, interface: interface, member: member,
                                  arguments: arguments, timeout: timeout)
    }

    // MARK: the Host object

    /// Every Host property, in one `GetAll`.
    public func host() async throws -> HostRow {
        try await properties(of: VigilAPI.rootPath, interface: VigilAPI.hostInterface)
    }

    /// `ListLeases`: the active leases by id.
    public func leases() async throws -> [LeaseRow] { try await rows("ListLeases") }

    /// `ListStrategies`: the strategies in config order.
    public func strategies() async throws -> [StrategyRow] { try await rows("ListStrategies") }

    /// `Survival`: the runs that started at or after `sinceMicros` (µs since
    /// the epoch; 0 for all), newest first.
    public func survival(sinceMicros: UInt64 = 0) async throws -> [RunRow] {
        try await rows("Survival", arguments: [.uint64(sinceMicros)])
    }

    /// `Reload`: whether the config was applied, and what changed or why not.
    public func reload() async throws -> ReloadReply {
        let reply = try await call("Reload")
        return try decoding("Reload") { () throws(APIDecodingError) in try ReloadReply(arguments: reply.body) }
    }

    /// `AppPolicy`: the live rules, the held app leases with their limits,
    /// and refusals and expiries per app since vigild started.
    public func appPolicy() async throws -> AppPolicyReply {
        let reply = try await call("AppPolicy")
        return try decoding("AppPolicy") { () throws(APIDecodingError) in try AppPolicyReply(arguments: reply.body) }
    }

    /// `DenyApp`: denies apps matching `pattern` for `forMicros` (0: until
    /// vigild restarts); returns how many held leases it released.
    public func denyApp(_ pattern: String, forMicros: UInt64 = 0) async throws -> UInt32 {
        let reply = try await call("DenyApp", arguments: [.string(pattern), .uint64(forMicros)])
        return try decoding("DenyApp") { () throws(APIDecodingError) in
            guard reply.body.count == 1, case .uint32(let released) = reply.body[0] else {
                throw APIDecodingError("expected u, got \(reply.body.map(\.signature).joined())")
            }
            return released
        }
    }

    /// `AllowApp`: whether a live deny of `pattern` was lifted.
    public func allowApp(_ pattern: String) async throws -> Bool {
        let reply = try await call("AllowApp", arguments: [.string(pattern)])
        return try decoding("AllowApp") { () throws(APIDecodingError) in
            guard reply.body.count == 1, case .bool(let lifted) = reply.body[0] else {
                throw APIDecodingError("expected b, got \(reply.body.map(\.signature).joined())")
            }
            return lifted
        }
    }

    /// `ReleaseLease`: ends an app's inhibit or a client's lease now.
    public func releaseLease(_ id: UInt64) async throws {
        try await expectEmpty("ReleaseLease", try await call("ReleaseLease", arguments: [.uint64(id)]))
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
        let reply = try await call("BeginBackgroundTask", arguments: [.string(name), .string(reason), .uint64(budgetMicros)])
        let declared = VigilAPI.host.method("BeginBackgroundTask").outSignature
        guard reply.body.map(\.signature).joined() == declared,
              case .objectPath(let path) = reply.body[0], case .unixFD(let fd) = reply.body[1] else {
            throw APIDecodingError("BeginBackgroundTask returned \(reply.body.map(\.signature).joined()), not \(declared)")
        }
        return BackgroundTask(path: path, fd: fd)
    }

    /// `ClientLease.Renew` of the client lease at `path`: a new budget of
    /// `budgetMicros` microseconds from now.
    public func renewLease(at path: String, budgetMicros: UInt64) async throws {
        try await expectEmpty("Renew", try await call("Renew", path: path, interface: VigilAPI.clientLeaseInterface,
                                                      arguments: [.uint64(budgetMicros)]))
    }

    /// `ClientLease.End` of the client lease at `path`.
    public func endLease(at path: String) async throws {
        try await expectEmpty("End", try await call("End", path: path, interface: VigilAPI.clientLeaseInterface))
    }

    // MARK: download sessions

    /// `DownloadSession.Enqueue` on the download-session strategy at
    /// `session` (its Strategy object): the new download's object path.
    public func enqueue(on session: String, url: String, dest: String, options: [String: BusValue] = [:]) async throws -> String {
        let reply = try await call("Enqueue", path: session, interface: VigilAPI.downloadSessionInterface,
                                   arguments: [.string(url), .string(dest), .dictionary(options)])
        guard reply.body.count == 1, case .objectPath(let download) = reply.body[0] else {
            throw APIDecodingError("Enqueue returned \(reply.body.map(\.signature).joined()), not o")
        }
        return download
    }

    /// `DownloadSession.Cancel`, `Pause` or `Resume` of `download` on the strategy at `session`.
    public func control(_ action: DownloadAction, _ download: String, on session: String) async throws {
        try await expectEmpty(action.rawValue, try await call(action.rawValue, path: session, interface: VigilAPI.downloadSessionInterface,
                                                              arguments: [.objectPath(download)]))
    }

    /// What `control(_:_:on:)` does to a download.
    public enum DownloadAction: String, Sendable, CaseIterable {
        case cancel = "Cancel", pause = "Pause", resume = "Resume"
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

    /// One property, unwrapped.
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

    private func rows<Row: APIRow>(_ member: String, arguments: [BusValue] = []) async throws -> [Row] {
        let reply = try await call(member, arguments: arguments)
        return try decoding(member) { () throws(APIDecodingError) in
            guard reply.body.count == 1 else {
                throw APIDecodingError("expected one \(Row.arraySignature), got \(reply.body.map(\.signature).joined())")
            }
            return try Row.rows(reply.body[0])
        }
    }

    /// A method the contract declares without out arguments must reply empty.
    private func expectEmpty(_ member: String, _ reply: DBusMessage) async throws {
        guard reply.body.isEmpty else {
            throw APIDecodingError("vigild's reply to \(member) is not what the contract declares: \(reply.body.map(\.signature).joined()), not empty")
        }
    }

    /// A reply that does not match the contract names the member.
    private func decoding<T>(_ member: String, _ body: () throws(APIDecodingError) -> T) throws(APIDecodingError) -> T {
        do { return try body() } catch {
            throw APIDecodingError("vigild's reply to \(member) is not what the contract declares: \(error.description)")
        }
    }
}
