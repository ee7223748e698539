import Synchronization
import VigilKit

/// What went wrong for each strategy, for the supervisor to fold into its
/// LastError (one truth on D-Bus, in `vigilctl strategies` and in the
/// metrics): its own last failure (its run threw), until a later run takes
/// a lease, and the errors its leases report in their live status
/// (`LastError`), seen as the registry publishes them.
///
/// An observer on the registry: a status costs one lookup, and only a lease
/// whose error changed (set, replaced, cleared, or the lease ended with one)
/// wakes the supervisor, through ``changes``. Taking a lease costs a lookup
/// too: only one that ends a failure wakes the supervisor.
public final class StrategyErrors: LeaseObserver {
    /// A lease's error and when it was set (wall clock, microseconds).
    public struct Entry: Sendable, Hashable {
        public var lease: LeaseID
        public var error: String
        public var wallMicros: Int64
    }

    private struct State {
        /// Lease errors by strategy, so a strategy's newest is found among
        /// its own leases (10,000 connections failing at once must not
        /// cost 10,000 scans of every lease).
        var byStrategy: [String: [LeaseID: Entry]] = [:]
        var failures: [String: (error: String, wallMicros: Int64)] = [:]
    }

    private let state = Lock(State())
    /// Lease errors held now. Lease errors change only on the registry
    /// (one caller at a time), so a status without an error, while none is
    /// held, returns without taking the lock: the common case of a ping.
    private let leaseErrorCount = Atomic<Int>(0)
    private let clock: any VigilClock
    /// The strategies whose errors changed, in order.
    let changes: AsyncStream<String>
    private let continuation: AsyncStream<String>.Continuation

    init(clock: any VigilClock) {
        self.clock = clock
        (changes, continuation) = AsyncStream.makeStream(of: String.self)
    }

    deinit { continuation.finish() }

    /// `strategy`'s run failed with `error` (now).
    func recordFailure(of strategy: String, _ error: String) -> (error: String, wallMicros: Int64) {
        let failure = (error, clock.wallMicroseconds)
        state.withLock { $0.failures[strategy] = failure }
        return failure
    }

    /// A run of `strategy` took a lease: it recovered from its failure.
    func leaseTaken(by strategy: String) {
        let recovered = state.withLock { $0.failures.removeValue(forKey: strategy) != nil }
        if recovered { continuation.yield(strategy) }
    }

    /// Forgets `strategy`'s failure (it was stopped).
    func forgetFailure(of strategy: String) {
        state.withLock { $0.failures[strategy] = nil }
    }

    /// `strategy`'s newest error: its failure or a lease's ("lease 7: ...").
    func newest(of strategy: String) -> (error: String, wallMicros: Int64)? {
        var newest = state.withLock { $0.failures[strategy] }
        if let lease = newestLeaseError(of: strategy), lease.wallMicros >= newest?.wallMicros ?? .min {
            newest = ("lease \(lease.lease.rawValue): \(lease.error)", lease.wallMicros)
        }
        return newest
    }

    /// The newest lease error of `strategy`.
    public func newestLeaseError(of strategy: String) -> Entry? {
        state.withLock { s in s.byStrategy[strategy]?.values.max { ($0.wallMicros, $0.lease.rawValue) < ($1.wallMicros, $1.lease.rawValue) } }
    }

    public func observe(_ event: LeaseEvent) {
        guard LeaseEventFilter.endings.contains(event.kind) else { return }
        let strategy = event.lease.strategy
        let had = state.withLock { s -> Bool in
            guard s.byStrategy[strategy]?.removeValue(forKey: event.lease.id) != nil else { return false }
            leaseErrorCount.subtract(1, ordering: .relaxed)
            if s.byStrategy[strategy]?.isEmpty == true { s.byStrategy[strategy] = nil }
            return true
        }
        if had { continuation.yield(strategy) }
    }

    public func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {
        let error: String
        if case .string(let text)? = status["LastError"] { error = text } else { error = "" }
        if error.isEmpty, leaseErrorCount.load(ordering: .relaxed) == 0 { return }
        let changed = state.withLock { s -> Bool in
            let old = s.byStrategy[strategy]?[lease]?.error ?? ""
            guard old != error else { return false }
            if error.isEmpty {
                s.byStrategy[strategy]?[lease] = nil
                if s.byStrategy[strategy]?.isEmpty == true { s.byStrategy[strategy] = nil }
                leaseErrorCount.subtract(1, ordering: .relaxed)
            } else {
                if old.isEmpty { leaseErrorCount.add(1, ordering: .relaxed) }
                s.byStrategy[strategy, default: [:]][lease] = Entry(lease: lease, error: error, wallMicros: clock.wallMicroseconds)
            }
            return true
        }
        if changed { continuation.yield(strategy) }
    }
}
