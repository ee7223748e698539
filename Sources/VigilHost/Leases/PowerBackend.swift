import VigilKit

/// What a lease holds on the system. The `none` backend tracks leases only;
/// logind inhibitors and kernel wake locks implement the same protocol.
public protocol PowerBackend: Sendable {
    /// "none", "logind", "wakelock".
    var name: String { get }
    /// Why this backend was chosen, for `vigilctl status`.
    var reason: String { get }
    /// Takes a hold; the returned token releases it. `deadline` lets
    /// backends with a kernel-side timeout (wake locks) set one.
    func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken
}

/// A hold taken by a backend; released exactly once.
public protocol PowerToken: Sendable {
    /// Describes the hold for people ("logind inhibitor fd 7: sleep/block").
    var description: String { get }
    /// Extends the hold for a new budget. Backends that replace the hold take
    /// the new one before dropping the old, so the system is never unheld.
    func renew(budget: Duration?) async throws
    func release() async
}

extension PowerToken {
    public func renew(budget: Duration?) async throws {}
}

/// Tracks leases without holding anything on the system.
public struct NoPowerBackend: PowerBackend {
    public let reason: String
    public init(reason: String = "configured") { self.reason = reason }
    public var name: String { "none" }

    public func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken {
        TrackedOnly()
    }

    struct TrackedOnly: PowerToken {
        var description: String { "tracked only" }
        func release() async {}
    }
}
