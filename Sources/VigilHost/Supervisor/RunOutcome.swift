import VigilKit

/// How this run of vigild is ending: `stopped` unless a service said it
/// failed. The service that fails (the bus that cannot be started, say)
/// says so before it throws, that is before the group stops the others; the
/// ``SurvivalRecorder``, which stops last, records the end of the run with
/// ``reason``.
public final class RunOutcome: Sendable {
    private let failure = Lock<String?>(nil)

    public init() {}

    /// The run failed (the first reason given is kept).
    public func fail(_ why: String) {
        failure.withLock { failure in
            if failure == nil { failure = why }
        }
    }

    /// Why the run failed; nil while it has not.
    public var failed: String? { failure.withLock { $0 } }

    /// The end of run the survival log records.
    public var reason: RunEndReason { failed == nil ? .stopped : .failed }
}
