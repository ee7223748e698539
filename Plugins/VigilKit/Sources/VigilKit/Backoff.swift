/// Exponential backoff with full jitter (AWS architecture blog, "Exponential
/// Backoff And Jitter"): attempt n waits a random time in
/// [0, min(maximum, initial * 2^n)], or exactly that cap without jitter.
/// Shared by everything in Vigil that retries: the supervisor, reconnecting
/// sockets, downloads.
public struct Backoff: Sendable, Hashable {
    public var initial: Duration
    public var maximum: Duration
    public var jitter: Bool

    public init(initial: Duration = .seconds(1), maximum: Duration = .seconds(60), jitter: Bool = true) {
        self.initial = initial
        self.maximum = max(initial, maximum)
        self.jitter = jitter
    }

    /// The cap for attempt `n` (0-based), before jitter.
    public func ceiling(attempt n: Int) -> Duration {
        let shift = min(max(n, 0), 40)
        let ns = Double(initial.nanoseconds) * Double(UInt64(1) << UInt64(shift))
        return .nanoseconds(Int64(min(ns, Double(maximum.nanoseconds))))
    }

    /// The delay before attempt `n + 1`.
    public func delay<R: RandomNumberGenerator>(attempt n: Int, using rng: inout R) -> Duration {
        let cap = ceiling(attempt: n)
        guard jitter, cap > .zero else { return cap }
        return .nanoseconds(Int64.random(in: 0...cap.nanoseconds, using: &rng))
    }

    public func delay(attempt n: Int) -> Duration {
        var rng = SystemRandomNumberGenerator()
        return delay(attempt: n, using: &rng)
    }
}
