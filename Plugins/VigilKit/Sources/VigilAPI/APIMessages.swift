/// The Host object's properties, its replies and its signals as rows of
/// the contract (``APIRow``): what a client decodes them into, with the
/// field names and signatures the contract declares (``VigilAPI/host``).
/// A row decodes a reply or a signal from its body taken as one struct
/// (``APIRow/init(arguments:)``); `APIRowTests` checks each against the
/// declaration.

/// Every property of `org.vigil.Vigil1.Host` (`GetAll`).
public struct HostRow: APIRow {
    public var version = ""
    public var runId = ""
    /// Microseconds since the Unix epoch.
    public var startedAt: UInt64 = 0
    public var survivalSeconds: UInt64 = 0
    public var powerBackend = ""
    public var powerBackendReason = ""
    public var wakeClock = ""
    public var wakeClockReason = ""
    public var canWakeSystem = false
    public var configPath = ""
    /// False while vigild cannot write its survival store.
    public var storeWritable = true
    /// Log lines vigild could not write since it started.
    public var droppedLogLines: UInt64 = 0
    /// The strategy objects' paths.
    public var strategies: [String] = []
    /// The active leases' object paths.
    public var leases: [String] = []

    public init() {}

    private typealias Host = VigilAPI.Host
    /// Named by the Host's property declarations (`APIRowTests` checks the types).
    public static let fields: [APIField<HostRow>] = [
        APIField(Host.version.name, \.version), APIField(Host.runId.name, \.runId), APIField(Host.startedAt.name, \.startedAt),
        APIField(Host.survivalSeconds.name, \.survivalSeconds), APIField(Host.powerBackend.name, \.powerBackend),
        APIField(Host.powerBackendReason.name, \.powerBackendReason), APIField(Host.wakeClock.name, \.wakeClock),
        APIField(Host.wakeClockReason.name, \.wakeClockReason), APIField(Host.canWakeSystem.name, \.canWakeSystem),
        APIField(Host.configPath.name, \.configPath), APIField(Host.storeWritable.name, \.storeWritable),
        APIField(Host.droppedLogLines.name, \.droppedLogLines),
        .strings(Host.strategies.name, \.strategies, objectPaths: true), .strings(Host.leases.name, \.leases, objectPaths: true),
    ]
}

/// `Host.Reload`'s reply.
public struct ReloadReply: APIRow {
    /// Whether the new config was applied (false: it was refused, nothing changed).
    public var applied = false
    /// What changed, or why the config was refused.
    public var messages: [String] = []
    public init() {}
    public static let fields: [APIField<ReloadReply>] = [APIField("applied", \.applied), .strings("messages", \.messages)]
}

/// `Host.AppPolicy`'s reply: the live rules, the held app leases with
/// their limits, and what was refused and expired per app.
public struct AppPolicyReply: APIRow {
    public var rules: [AppRuleRow] = []
    public var leases: [AppLimitRow] = []
    public var apps: [AppCountRow] = []
    public init() {}
    public static let fields: [APIField<AppPolicyReply>] = [.rows("rules", \.rules), .rows("leases", \.leases), .rows("apps", \.apps)]
}

/// `Host.LeaseAcquired`.
public struct LeaseAcquiredSignal: APIRow {
    public var lease = ""
    public var strategy = ""
    public var holds = ""
    public init() {}
    public init(lease: String, strategy: String, holds: String) {
        self.lease = lease
        self.strategy = strategy
        self.holds = holds
    }
    public static let fields: [APIField<LeaseAcquiredSignal>] = [.objectPath("lease", \.lease), APIField("strategy", \.strategy), APIField("holds", \.holds)]
}

/// `Host.SleepBrokeLease`: the system slept although this lease held
/// `sleep` in block mode; sent after the resume, once per lease.
public struct SleepBrokeLeaseSignal: APIRow {
    public var lease = ""
    /// The strategy, or `client` / `inhibit` for a D-Bus client's lease.
    public var holder = ""
    /// The client's name, else the lease's reason.
    public var name = ""
    public var sleptUsec: UInt64 = 0
    /// `vigil-alarm`, `other`, or `unknown` (no resume seen).
    public var wakeCause = ""
    public init() {}
    public init(lease: String, holder: String, name: String, sleptUsec: UInt64, wakeCause: String) {
        self.lease = lease
        self.holder = holder
        self.name = name
        self.sleptUsec = sleptUsec
        self.wakeCause = wakeCause
    }
    public static let fields: [APIField<SleepBrokeLeaseSignal>] = [
        .objectPath("lease", \.lease), APIField("holder", \.holder), APIField("name", \.name),
        APIField("slept_usec", \.sleptUsec), APIField("wake_cause", \.wakeCause),
    ]
}

/// `Host.LeaseRenewed`: the lease's new deadline (µs since the epoch).
public struct LeaseRenewedSignal: APIRow {
    public var lease = ""
    public var deadline: UInt64 = 0
    public init() {}
    public init(lease: String, deadline: UInt64) {
        self.lease = lease
        self.deadline = deadline
    }
    public static let fields: [APIField<LeaseRenewedSignal>] = [.objectPath("lease", \.lease), APIField("deadline", \.deadline)]
}

/// `Host.LeaseExpiring`: the expiration handler runs; the grace left.
public struct LeaseExpiringSignal: APIRow {
    public var lease = ""
    public var remainingUsec: UInt64 = 0
    public init() {}
    public init(lease: String, remainingUsec: UInt64) {
        self.lease = lease
        self.remainingUsec = remainingUsec
    }
    public static let fields: [APIField<LeaseExpiringSignal>] = [.objectPath("lease", \.lease), APIField("remaining_usec", \.remainingUsec)]
}

/// `Host.LeaseExpired`: `forced` when the handler overran its grace.
public struct LeaseExpiredSignal: APIRow {
    public var lease = ""
    public var forced = false
    public init() {}
    public init(lease: String, forced: Bool) {
        self.lease = lease
        self.forced = forced
    }
    public static let fields: [APIField<LeaseExpiredSignal>] = [.objectPath("lease", \.lease), APIField("forced", \.forced)]
}

/// `Host.LeaseReleased`.
public struct LeaseReleasedSignal: APIRow {
    public var lease = ""
    public var reason = ""
    public init() {}
    public init(lease: String, reason: String) {
        self.lease = lease
        self.reason = reason
    }
    public static let fields: [APIField<LeaseReleasedSignal>] = [.objectPath("lease", \.lease), APIField("reason", \.reason)]
}

/// `Host.StrategyStateChanged`.
public struct StrategyStateChangedSignal: APIRow {
    public var strategy = ""
    public var state = ""
    public var lastError = ""
    public init() {}
    public init(strategy: String, state: String, lastError: String) {
        self.strategy = strategy
        self.state = state
        self.lastError = lastError
    }
    public static let fields: [APIField<StrategyStateChangedSignal>] = [
        .objectPath("strategy", \.strategy), APIField("state", \.state), APIField("last_error", \.lastError),
    ]
}

/// A signal of the Host interface, decoded by its member name; all but
/// `SleepBrokeLease`, which a client decodes with
/// `SleepBrokeLeaseSignal(arguments:)`. A case for it miscompiled on Swift
/// 6.3.1: unboxed, `vigilctl leases --watch` crashed in the outlined destroy
/// of `HostSignal?` (VigilctlBusTests, every run); boxed (`indirect`),
/// `HostSignal(member: "SomethingElse", body: [])` was no longer nil
/// (APIRowTests). Without it the enum's layout is what it was.
public enum HostSignal: Sendable, Equatable {
    case leaseAcquired(LeaseAcquiredSignal)
    case leaseRenewed(LeaseRenewedSignal)
    case leaseExpiring(LeaseExpiringSignal)
    case leaseExpired(LeaseExpiredSignal)
    case leaseReleased(LeaseReleasedSignal)
    case strategyStateChanged(StrategyStateChangedSignal)

    /// The signal `member` with arguments `body`; nil for a member the
    /// contract does not declare. Throws when the arguments are not the
    /// declared ones.
    public init?(member: String, body: [BusValue]) throws(APIDecodingError) {
        typealias Host = VigilAPI.Host
        switch member {
        case Host.leaseAcquired.name: self = .leaseAcquired(try LeaseAcquiredSignal(arguments: body))
        case Host.leaseRenewed.name: self = .leaseRenewed(try LeaseRenewedSignal(arguments: body))
        case Host.leaseExpiring.name: self = .leaseExpiring(try LeaseExpiringSignal(arguments: body))
        case Host.leaseExpired.name: self = .leaseExpired(try LeaseExpiredSignal(arguments: body))
        case Host.leaseReleased.name: self = .leaseReleased(try LeaseReleasedSignal(arguments: body))
        case Host.strategyStateChanged.name: self = .strategyStateChanged(try StrategyStateChangedSignal(arguments: body))
        default: return nil
        }
    }

    /// The member names this type decodes, as the contract declares them
    /// (all of the Host's signals but ``notDecoded``).
    public static let members = [VigilAPI.Host.leaseAcquired.name, VigilAPI.Host.leaseRenewed.name, VigilAPI.Host.leaseExpiring.name,
                                 VigilAPI.Host.leaseExpired.name, VigilAPI.Host.leaseReleased.name, VigilAPI.Host.strategyStateChanged.name]
    /// The Host's signals this type leaves to their own rows.
    public static let notDecoded = [VigilAPI.Host.sleepBrokeLease.name]
}

extension APIRow {
    /// The row of a reply's or a signal's arguments, taken in order as one struct.
    public init(arguments: [BusValue]) throws(APIDecodingError) {
        guard arguments.count == Self.fields.count else {
            throw APIDecodingError("expected \(Self.self)'s \(Self.fields.count) arguments (\(Self.fields.map(\.signature).joined())), got \(arguments.map(\.signature).joined())")
        }
        try self.init(busValue: .structure(arguments))
    }

    /// The row as arguments, in order (a reply's or a signal's body).
    public var arguments: [BusValue] {
        guard case .structure(let fields) = busValue else { return [] }
        return fields
    }
}
