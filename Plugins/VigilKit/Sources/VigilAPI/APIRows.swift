/// A typed row of the `org.vigil.Vigil1` API: a struct a method returns in
/// an array (`ListLeases`' `(otssssttus)`), or the property set of an
/// object (a download). Its ``fields`` are its D-Bus encoding, written once:
/// the signature, the encoding vigild sends and the decoding vigilctl does
/// all come from them.
public protocol APIRow: Sendable, Equatable, Codable, BusCodable, BusBody {
    /// A row with every field at its zero value (the start of decoding).
    init()
    /// The fields in wire order.
    static var fields: [APIField<Self>] { get }
}

extension APIRow {
    /// The struct signature: `(otssssttus)`.
    public static var signature: String { "(" + fields.map(\.signature).joined() + ")" }
    /// An array of rows: `a(otssssttus)`.
    public static var arraySignature: String { "a" + signature }
    public static var busSignature: String { signature }

    /// The row as a struct.
    public var busValue: BusValue { .structure(Self.fields.map { $0.encode(self) }) }

    /// The row of a struct.
    public init(busValue: BusValue) throws(APIDecodingError) {
        guard case .structure(let values) = busValue, values.count == Self.fields.count else {
            throw APIDecodingError("expected a \(Self.self) of signature \(Self.signature), got \(busValue.signature)")
        }
        self.init()
        for (field, value) in zip(Self.fields, values) {
            guard field.decode(&self, value) else {
                throw APIDecodingError("\(Self.self).\(field.name) should be \(field.signature), got \(value.signature)")
            }
        }
    }

    /// Rows as the array a method returns.
    public static func array(_ rows: [Self]) -> BusValue {
        .array(elementSignature: signature, rows.map { $0.busValue })  // no key path: see Array.busValue
    }

    /// The rows of an array a method returned.
    public static func rows(_ value: BusValue) throws(APIDecodingError) -> [Self] {
        guard case .array(let element, let items) = value, element == signature else {
            throw APIDecodingError("expected \(arraySignature), got \(value.signature)")
        }
        var rows: [Self] = []
        rows.reserveCapacity(items.count)
        for item in items { rows.append(try Self(busValue: item)) }
        return rows
    }

    /// The row as an object's properties, named by its fields.
    public var properties: [String: BusValue] {
        Dictionary(uniqueKeysWithValues: Self.fields.map { ($0.name, $0.encode(self)) })
    }

    /// The row of an object's properties (`GetAll`); every field must be there.
    public init(properties: [String: BusValue]) throws(APIDecodingError) {
        self.init()
        for field in Self.fields {
            guard let value = properties[field.name]?.unwrapped else { throw APIDecodingError("\(Self.self) lacks \(field.name)") }
            guard field.decode(&self, value) else {
                throw APIDecodingError("\(Self.self).\(field.name) should be \(field.signature), got \(value.signature)")
            }
        }
    }
}

/// A reply that does not match the contract: the one mismatch type of
/// typed values (``BusValueMismatch``), under the name clients catch.
public typealias APIDecodingError = BusValueMismatch

/// One field of a row: its name, signature and how it is read from and
/// written to the row.
public struct APIField<Row>: Sendable {
    public let name: String
    public let signature: String
    let encode: @Sendable (Row) -> BusValue
    let decode: @Sendable (inout Row, BusValue) -> Bool

    /// This field of `row`, encoded: one property of an object whose
    /// properties are a row, without the row's whole ``APIRow/properties``.
    public func value(of row: Row) -> BusValue { encode(row) }

    /// A field of a basic type.
    public init<Value: BusCodable>(_ name: String, _ keyPath: WritableKeyPath<Row, Value> & Sendable) {
        self.name = name
        self.signature = Value.busSignature
        self.encode = { $0[keyPath: keyPath].busValue }
        self.decode = { row, value in
            guard let decoded = try? Value(busValue: value) else { return false }
            row[keyPath: keyPath] = decoded
            return true
        }
    }

    /// An object path (`o`), held as a string.
    public static func objectPath(_ name: String, _ keyPath: WritableKeyPath<Row, String> & Sendable) -> APIField {
        APIField(name: name, signature: "o", encode: { .objectPath($0[keyPath: keyPath]) }, decode: { row, value in
            guard case .objectPath(let path) = value else { return false }
            row[keyPath: keyPath] = path
            return true
        })
    }

    /// An array of strings (`as`), or of object paths (`ao`) with `objectPaths`.
    public static func strings(_ name: String, _ keyPath: WritableKeyPath<Row, [String]> & Sendable, objectPaths: Bool = false) -> APIField {
        let element = objectPaths ? "o" : "s"
        return APIField(name: name, signature: "a" + element, encode: { row in
            .array(elementSignature: element, row[keyPath: keyPath].map { objectPaths ? .objectPath($0) : .string($0) })
        }, decode: { row, value in
            guard case .array(element, let items) = value else { return false }
            var strings: [String] = []
            strings.reserveCapacity(items.count)
            for item in items {
                switch item {
                case .string(let text) where !objectPaths, .objectPath(let text) where objectPaths: strings.append(text)
                default: return false
                }
            }
            row[keyPath: keyPath] = strings
            return true
        })
    }

    /// An array of rows (`a(...)`).
    public static func rows<Element: APIRow>(_ name: String, _ keyPath: WritableKeyPath<Row, [Element]> & Sendable) -> APIField {
        APIField(name: name, signature: Element.arraySignature, encode: { Element.array($0[keyPath: keyPath]) }, decode: { row, value in
            guard let rows = try? Element.rows(value) else { return false }
            row[keyPath: keyPath] = rows
            return true
        })
    }

    /// This field of a row held at `keyPath` of another row, named `name` there.
    public func field<Outer>(of keyPath: WritableKeyPath<Outer, Row> & Sendable, named name: String) -> APIField<Outer> {
        let (encode, decode) = (self.encode, self.decode)
        return APIField<Outer>(name: name, signature: signature, encode: { encode($0[keyPath: keyPath]) },
                               decode: { outer, value in decode(&outer[keyPath: keyPath], value) })
    }

    private init(name: String, signature: String, encode: @escaping @Sendable (Row) -> BusValue,
                 decode: @escaping @Sendable (inout Row, BusValue) -> Bool) {
        self.name = name
        self.signature = signature
        self.encode = encode
        self.decode = decode
    }
}

// MARK: the rows

/// One entry of `Host.ListLeases`, per active lease by id.
public struct LeaseRow: APIRow {
    public var path = ""
    public var id: UInt64 = 0
    public var strategy = ""
    public var kind = ""
    public var holds = ""
    public var reason = ""
    /// Microseconds since the Unix epoch.
    public var acquiredAt: UInt64 = 0
    /// Microseconds since the Unix epoch; 0: no budget.
    public var deadline: UInt64 = 0
    public var renewals: UInt32 = 0
    public var state = ""

    public init() {}
    public init(path: String, id: UInt64, strategy: String, kind: String, holds: String, reason: String,
                acquiredAt: UInt64, deadline: UInt64, renewals: UInt32, state: String) {
        (self.path, self.id, self.strategy, self.kind, self.holds, self.reason) = (path, id, strategy, kind, holds, reason)
        (self.acquiredAt, self.deadline, self.renewals, self.state) = (acquiredAt, deadline, renewals, state)
    }

    public static let fields: [APIField<LeaseRow>] = [
        .objectPath("path", \.path), APIField("id", \.id), APIField("strategy", \.strategy), APIField("kind", \.kind),
        APIField("holds", \.holds), APIField("reason", \.reason), APIField("acquired_at", \.acquiredAt),
        APIField("deadline", \.deadline), APIField("renewals", \.renewals), APIField("state", \.state),
    ]
}

/// One entry of `Host.ListStrategies`, per strategy in config order.
public struct StrategyRow: APIRow {
    public var path = ""
    public var name = ""
    public var kind = ""
    public var state = ""
    public var restarts: UInt32 = 0
    public var lastError = ""

    public init() {}
    public init(path: String, name: String, kind: String, state: String, restarts: UInt32, lastError: String) {
        (self.path, self.name, self.kind, self.state, self.restarts, self.lastError) = (path, name, kind, state, restarts, lastError)
    }

    public static let fields: [APIField<StrategyRow>] = [
        .objectPath("path", \.path), APIField("name", \.name), APIField("kind", \.kind), APIField("state", \.state),
        APIField("restarts", \.restarts), APIField("last_error", \.lastError),
    ]
}

/// One entry of `Host.Survival`, per run, newest first. Times are
/// microseconds since the Unix epoch, durations microseconds.
public struct RunRow: APIRow {
    public var runId = ""
    public var startedAt: UInt64 = 0
    /// 0 while running; for a killed run its last heartbeat.
    public var endedAt: UInt64 = 0
    public var endReason = ""
    public var aliveUsec: UInt64 = 0
    public var awakeUsec: UInt64 = 0
    public var suspendedUsec: UInt64 = 0
    public var stalls: UInt32 = 0
    public var longestStallUsec: UInt64 = 0
    public var heartbeats: UInt32 = 0

    public init() {}

    public static let fields: [APIField<RunRow>] = [
        APIField("run_id", \.runId), APIField("started_at", \.startedAt), APIField("ended_at", \.endedAt),
        APIField("end_reason", \.endReason), APIField("alive_usec", \.aliveUsec), APIField("awake_usec", \.awakeUsec),
        APIField("suspended_usec", \.suspendedUsec), APIField("stalls", \.stalls),
        APIField("longest_stall_usec", \.longestStallUsec), APIField("heartbeats", \.heartbeats),
    ]
}

/// What a strategy cost: the cost properties of its
/// `org.vigil.Vigil1.Strategy` object (counters since vigild started), and
/// per run in the survival store (`vigilctl cost`). The fields are the
/// property names; docs/metrics.md#what-each-strategy-costs says how each
/// is counted.
public struct StrategyCostRow: APIRow, Hashable {
    /// Timer expirations of the wake scheduler that fired at least one of
    /// the strategy's requests. An expiration several strategies share
    /// counts once for each of them (and once for the machine).
    public var wakeups: UInt64 = 0
    /// System resumes attributed to the strategy's `wake_system` alarms.
    public var systemWakes: UInt64 = 0
    /// Microseconds its leases held sleep off (leases asking for `sleep`).
    public var sleepHeldUsec: UInt64 = 0
    /// Microseconds its leases held idle off (leases asking for `idle`).
    public var idleHeldUsec: UInt64 = 0
    /// User plus system CPU time of its commands and hooks, from their rusage.
    public var childCPUUsec: UInt64 = 0
    /// Bytes its connections and downloads sent and received.
    public var bytesSent: UInt64 = 0
    public var bytesReceived: UInt64 = 0

    public init() {}

    public init(wakeups: UInt64 = 0, systemWakes: UInt64 = 0, sleepHeldUsec: UInt64 = 0, idleHeldUsec: UInt64 = 0,
                childCPUUsec: UInt64 = 0, bytesSent: UInt64 = 0, bytesReceived: UInt64 = 0) {
        (self.wakeups, self.systemWakes, self.sleepHeldUsec, self.idleHeldUsec) = (wakeups, systemWakes, sleepHeldUsec, idleHeldUsec)
        (self.childCPUUsec, self.bytesSent, self.bytesReceived) = (childCPUUsec, bytesSent, bytesReceived)
    }

    public static let fields: [APIField<StrategyCostRow>] = [
        APIField("Wakeups", \.wakeups), APIField("SystemWakes", \.systemWakes),
        APIField("SleepHeldUsec", \.sleepHeldUsec), APIField("IdleHeldUsec", \.idleHeldUsec),
        APIField("ChildCPUUsec", \.childCPUUsec), APIField("BytesSent", \.bytesSent), APIField("BytesReceived", \.bytesReceived),
    ]

    /// Field by field sum (a strategy's cost over several runs).
    public static func + (a: StrategyCostRow, b: StrategyCostRow) -> StrategyCostRow {
        StrategyCostRow(
            wakeups: a.wakeups &+ b.wakeups, systemWakes: a.systemWakes &+ b.systemWakes,
            sleepHeldUsec: a.sleepHeldUsec &+ b.sleepHeldUsec, idleHeldUsec: a.idleHeldUsec &+ b.idleHeldUsec,
            childCPUUsec: a.childCPUUsec &+ b.childCPUUsec, bytesSent: a.bytesSent &+ b.bytesSent,
            bytesReceived: a.bytesReceived &+ b.bytesReceived)
    }
}

/// The properties of a `org.vigil.Vigil1.Download` object (a download of a
/// download-session strategy); the fields are the property names.
public struct DownloadRow: APIRow {
    public var url = ""
    /// The absolute destination path.
    public var dest = ""
    /// `queued`, `active`, `retrying`, `paused`, `completed`, `failed`.
    public var state = ""
    public var bytesDone: UInt64 = 0
    /// 0 while unknown.
    public var bytesTotal: UInt64 = 0
    /// Bytes per second while active, else 0.
    public var rate: Double = 0
    public var attempts: UInt32 = 0
    public var lastError = ""
    /// Of the published file; empty until completed.
    public var sha256 = ""

    public init() {}

    public static let fields: [APIField<DownloadRow>] = [
        APIField("Url", \.url), APIField("Dest", \.dest), APIField("State", \.state), APIField("BytesDone", \.bytesDone),
        APIField("BytesTotal", \.bytesTotal), APIField("Rate", \.rate), APIField("Attempts", \.attempts),
        APIField("LastError", \.lastError), APIField("Sha256", \.sha256),
    ]

    /// The properties that never change while the object exists.
    static let constant: Set<String> = ["Url", "Dest"]
}

/// The properties of a `org.vigil.Vigil1.Lease` object (``VigilAPI/lease``)
/// besides `Status` (a dictionary of the strategy's own, read on its own):
/// the lease's ``LeaseRow`` but its path, each field under its property
/// name (`acquired_at` is `AcquiredAt`), read from its object (`GetAll`).
public struct LeaseObjectRow: APIRow {
    public var lease = LeaseRow()

    public init() {}

    public static let fields: [APIField<LeaseObjectRow>] = LeaseRow.fields.filter { $0.name != "path" }.map {
        $0.field(of: \.lease, named: propertyName($0.name))
    }

    /// `acquired_at` as a property: `AcquiredAt`.
    static func propertyName(_ field: String) -> String {
        field.split(separator: "_").map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
    }
}

/// A rule added live with `DenyApp` or `AllowApp` (`Host.AppPolicy`).
public struct AppRuleRow: APIRow {
    public var pattern = ""
    /// "deny" or "allow".
    public var action = ""
    /// Microseconds until it lapses; -1: until vigild stops.
    public var leftUsec: Int64 = -1

    public init() {}
    public init(pattern: String, action: String, leftUsec: Int64) {
        (self.pattern, self.action, self.leftUsec) = (pattern, action, leftUsec)
    }

    public static let fields: [APIField<AppRuleRow>] = [
        APIField("pattern", \.pattern), APIField("action", \.action), APIField("left_usec", \.leftUsec),
    ]
}

/// A held app lease (an inhibit or a client lease) under `app_max` or
/// `app_budget` (`Host.AppPolicy`).
public struct AppLimitRow: APIRow {
    public var lease: UInt64 = 0
    public var app = ""
    /// The rules that apply, e.g. `app_max "mpv" 3h; app_budget "*" 6h per 24h`; empty: none.
    public var rule = ""
    /// Microseconds left under the cap; -1: no cap.
    public var capLeftUsec: Int64 = -1
    /// Microseconds left of the app's rolling budget; -1: no budget.
    public var budgetLeftUsec: Int64 = -1

    public init() {}
    public init(lease: UInt64, app: String, rule: String, capLeftUsec: Int64, budgetLeftUsec: Int64) {
        (self.lease, self.app, self.rule, self.capLeftUsec, self.budgetLeftUsec) = (lease, app, rule, capLeftUsec, budgetLeftUsec)
    }

    public static let fields: [APIField<AppLimitRow>] = [
        APIField("lease", \.lease), APIField("app", \.app), APIField("rule", \.rule),
        APIField("cap_left_usec", \.capLeftUsec), APIField("budget_left_usec", \.budgetLeftUsec),
    ]
}

/// Requests of one app refused and leases of it expired since vigild
/// started (`Host.AppPolicy`).
public struct AppCountRow: APIRow, Hashable {
    public var app = ""
    public var refused: UInt64 = 0
    public var expired: UInt64 = 0

    public init() {}
    public init(app: String, refused: UInt64, expired: UInt64) {
        (self.app, self.refused, self.expired) = (app, refused, expired)
    }

    public static let fields: [APIField<AppCountRow>] = [
        APIField("app", \.app), APIField("refused", \.refused), APIField("expired", \.expired),
    ]
}
