/// The life cycle of a lease.
public enum LeaseState: String, Sendable, Hashable, CaseIterable {
    /// Held; if it has a budget, the deadline is in the future.
    case active
    /// The deadline passed and the expiration handler is running.
    case expiring
    /// Ended by its holder.
    case released
    /// Ended because its budget ran out.
    case expired
    /// Could not be held (the power backend refused it).
    case failed

    public var isEnded: Bool { self == .released || self == .expired || self == .failed }
}

/// What to hold on the system while the lease lives. The host maps this to its
/// power backend (a logind inhibitor, a kernel wake lock, or nothing).
public struct PowerHold: Hashable, Sendable {
    /// logind inhibitor names: "sleep", "idle", "shutdown", "handle-lid-switch", ...
    public var what: [String]
    /// `block` or `delay`.
    public var mode: String

    public init(what: [String] = ["sleep"], mode: String = "block") {
        self.what = what
        self.mode = mode
    }
}

/// Told to an expiration handler: the lease that ran out and how long the
/// handler has before the host force-releases the lease.
public struct LeaseExpiry: Sendable {
    public var lease: LeaseID
    public var grace: Duration
    public init(lease: LeaseID, grace: Duration) {
        self.lease = lease
        self.grace = grace
    }
}

/// What a strategy asks for when it acquires a lease.
public struct LeaseRequest: Sendable {
    /// What is held, for people: "command /usr/bin/mbsync", "audio stream on nullsink".
    public var holds: String
    /// Why, for people.
    public var reason: String
    /// How long the lease lasts without renewal; nil for no deadline.
    public var budget: Duration?
    /// How long the expiration handler may run before the lease is
    /// force-released (iOS semantics: a leaked task is never kept).
    public var grace: Duration
    /// Hold something on the system (inhibitor or wake lock); nil tracks only.
    public var power: PowerHold?
    /// Runs when the budget runs out; the lease is released when it returns
    /// or when `grace` has passed, whichever comes first.
    public var onExpire: (@Sendable (LeaseExpiry) async -> Void)?

    public init(
        holds: String, reason: String, budget: Duration? = nil, grace: Duration = .seconds(5),
        power: PowerHold? = nil, onExpire: (@Sendable (LeaseExpiry) async -> Void)? = nil
    ) {
        self.holds = holds
        self.reason = reason
        self.budget = budget
        self.grace = grace
        self.power = power
        self.onExpire = onExpire
    }
}

/// One value of a lease's live status (see ``LeaseHandle/setStatus(_:)``).
/// On D-Bus it is a variant of type `s`, `x`, `t`, `d` or `b`.
public enum StatusValue: Sendable, Hashable, CustomStringConvertible {
    case string(String)
    case int(Int64)
    case uint(UInt64)
    case double(Double)
    case bool(Bool)

    public var description: String {
        switch self {
        case .string(let v): v
        case .int(let v): String(v)
        case .uint(let v): String(v)
        case .double(let v): String(v)
        case .bool(let v): String(v)
        }
    }
}

/// A held lease. Release it when done; the host releases every lease of a
/// strategy whose `run` ended.
public protocol LeaseHandle: Sendable {
    var id: LeaseID { get }
    /// Publishes what the strategy knows about the held thing now: an audio
    /// stream's sink, signal, state and underruns; a socket's addresses,
    /// state and last round-trip time. Replaces the previous status. The host
    /// shows it as the lease object's `Status` property (`a{sv}`) on D-Bus,
    /// announced with PropertiesChanged at a bounded rate, and in
    /// `vigilctl status`. Keys are CamelCase like D-Bus property names.
    /// Setting the status of an ended lease does nothing.
    func setStatus(_ status: [String: StatusValue]) async
    /// Extends the deadline to now + `budget` (or the original budget when
    /// nil). Throws ``LeaseError`` if the lease already ended.
    func renew(budget: Duration?) async throws
    /// Ends the lease. Releasing an ended lease does nothing.
    func release() async
    /// The current state.
    var state: LeaseState { get async }
}

extension LeaseHandle {
    public func renew() async throws { try await renew(budget: nil) }
}

/// Takes the statuses of many leases in one call: a strategy that keeps
/// thousands of leases (a voip-socket connection each) publishes a round of
/// changes at once instead of one call, and one hop into the host, per lease.
/// Same meaning as ``LeaseHandle/setStatus(_:)`` for each, in order.
public protocol LeaseStatusSink: AnyObject, Sendable {
    func setStatuses(_ updates: [(lease: LeaseID, status: [String: StatusValue])]) async
}

/// A lease handle whose status may go to its host in a batch with other
/// leases' (see ``LeaseStatusSink``). Handles with the same `statusSink`
/// object may be batched together; anything else calls ``setStatus(_:)``.
public protocol BatchableLeaseHandle: LeaseHandle {
    var statusSink: any LeaseStatusSink { get }
}

public protocol LeaseProvider: Sendable {
    func acquire(_ request: LeaseRequest) async throws -> any LeaseHandle
}

/// System sleep as the host's power backend announces it (logind's
/// `PrepareForSleep`). The host's lease provider conforms; a strategy that
/// must let go of something before the system sleeps casts
/// `context.leases` to it.
public protocol SystemSleepWatching: Sendable {
    /// Runs `beforeSleep` before each system sleep, under a logind delay
    /// lock: the sleep waits until it returns (at most logind's
    /// `InhibitDelayMaxUSec`). `afterResume` runs once the system is back.
    /// Throws when the host's power backend cannot announce sleep. Cancel
    /// the returned task to stop watching.
    func watchSleep(
        who: String, beforeSleep: @escaping @Sendable () async -> Void, afterResume: @escaping @Sendable () async -> Void
    ) async throws -> Task<Void, Never>
}

/// Why a lease operation failed.
public struct LeaseError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Hashable, Sendable { case ended, invalidBudget, backendFailed, unknownLease }
    public var code: Code
    public var message: String
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { message }
}

extension LeaseProvider {
    /// Holds a lease while `body` runs and releases it afterwards, also when
    /// `body` throws or is cancelled.
    public func withLease<T: Sendable>(
        _ request: LeaseRequest, _ body: (any LeaseHandle) async throws -> T
    ) async throws -> T {
        let lease = try await acquire(request)
        do {
            let result = try await body(lease)
            await lease.release()
            return result
        } catch {
            await lease.release()
            throw error
        }
    }
}
