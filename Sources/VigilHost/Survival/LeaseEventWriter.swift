import ServiceLifecycle
import VigilKit

/// Copies every lease event into the survival log's event table, in batches.
///
/// The registry hands each event to ``observer`` as it publishes it (no task
/// wakes per event; observe it before any strategy starts). Each write is one
/// transaction synced to the disk, and writes start at most every
/// ``writeGap``: the events that arrive meanwhile go together in the next
/// one. A steady stream of leases (a client beginning and ending a thousand a
/// second) costs twenty syncs a second, not two per lease, and never waits
/// for them; an event reaches the disk within that gap and its write.
///
/// A `Service`: ``run()`` writes until cancelled or shut down gracefully, then
/// writes what still waits and returns.
public struct LeaseEventWriter: Service {
    /// The least time between two writes of lease events to the survival log.
    public static let writeGap: Duration = .milliseconds(50)

    let store: SurvivalStore
    private let pending: UnrecordedLeaseEvents

    /// What the registry must be shown each event through (`LeaseRegistry.observe`).
    public var observer: any LeaseObserver { pending }

    public init(store: SurvivalStore, readings: @escaping @Sendable () -> ClockReadings) {
        self.store = store
        self.pending = UnrecordedLeaseEvents(readings: readings)
    }

    public func run() async {
        let store = self.store, pending = self.pending
        await cancelWhenGracefulShutdown {
            // The host's own timer (docs/architecture.md, "No polling"),
            // not Task.sleep.
            let clock = SystemClock()
            var lastWrite: VigilInstant?
            for await _ in pending.arrivals {
                if let lastWrite, clock.now < lastWrite + Self.writeGap {
                    // Cancelled at shutdown: the sleep ends at once, this
                    // batch is written, and the stream ends the loop.
                    try? await clock.sleep(until: lastWrite + Self.writeGap)
                }
                lastWrite = clock.now
                try? await store.recordEvents(pending.take())
            }
        }
        // What arrived after the last batch.
        try? await store.recordEvents(pending.take())
    }
}

/// Lease events not yet written to the survival log's event table. The
/// registry shows each event to it as it publishes it (statuses are not
/// logged); `arrivals` says, at most once per batch, that some wait.
private final class UnrecordedLeaseEvents: LeaseObserver {
    private let events = Lock<[SurvivalStore.Event]>([])
    private let readings: @Sendable () -> ClockReadings
    private let arrived: AsyncStream<Void>.Continuation
    /// Yields when events arrived since the writer last took them.
    let arrivals: AsyncStream<Void>

    init(readings: @escaping @Sendable () -> ClockReadings) {
        self.readings = readings
        (arrivals, arrived) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    func observe(_ event: LeaseEvent) {
        var fields = ["lease": String(event.lease.id.rawValue), "holds": event.lease.holds]
        if !event.detail.isEmpty { fields["detail"] = event.detail }
        if event.forced { fields["forced"] = "true" }
        let recorded = SurvivalStore.Event("lease-\(event.kind.rawValue)", strategy: event.lease.strategy, fields: fields, readings: readings())
        events.withLock { $0.append(recorded) }
        arrived.yield()
    }

    func observeStatus(of lease: LeaseID, strategy: String, _ status: [String: StatusValue]) {}

    /// Every waiting event, oldest first; none wait afterwards.
    func take() -> [SurvivalStore.Event] {
        events.withLock { events in
            defer { events = [] }
            return events
        }
    }
}
