import VigilKit

// What a strategy's `StrategyContext` needs from a host, for a test that
// runs the strategy without one: wakes on a test clock, leases and hook
// runs recorded in waitable logs. The host's own tests use the real
// scheduler, registry and hook runner instead.

/// A `WakeScheduling` on a clock (a ``ManualClock`` in tests): each request
/// fires alone at its `latest` instant, the latest the host's scheduler
/// may fire it (no coalescing, no system wakes).
public struct ClockDrivenScheduler: WakeScheduling {
    public let clock: any VigilClock

    public init(clock: any VigilClock) {
        self.clock = clock
    }

    public var clockInfo: WakeClockInfo {
        WakeClockInfo(clock: "test", canWakeSystem: false, reason: "a test clock")
    }

    public func wake(_ request: WakeRequest) async throws -> WakeFiring {
        try await clock.sleep(until: request.latest)
        return WakeFiring(target: request.latest, firedAt: clock.now, batchSize: 1, onAlarmClock: false)
    }
}

/// What happened to a lease of ``RecordingLeases``.
public struct RecordedLeaseEvent: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        case acquired, renewed, status, released
    }

    public var kind: Kind
    public var lease: LeaseID
    public var holds: String
    public var reason: String
    /// The budget asked for (acquired, renewed).
    public var budget: Duration?
    /// The status set (status).
    public var status: [String: StatusValue]
}

/// A `LeaseProvider` that grants every request and records each lease's
/// life in ``events``, to wait on. It does not enforce budgets (the host's
/// registry does): a test checks what the strategy asked for and released.
public final class RecordingLeases: LeaseProvider {
    public let events = WaitableLog<RecordedLeaseEvent>()
    private let nextID = Lock<UInt64>(0)

    public init() {}

    /// Leases acquired and not yet released, by id.
    public var held: Set<LeaseID> {
        var held = Set<LeaseID>()
        for event in events.all {
            if event.kind == .acquired { held.insert(event.lease) }
            if event.kind == .released { held.remove(event.lease) }
        }
        return held
    }

    public func acquire(_ request: LeaseRequest) async throws -> any LeaseHandle {
        let id = LeaseID(nextID.withLock { $0 += 1; return $0 })
        let handle = Handle(id: id, request: request, events: events)
        handle.record(.acquired, budget: request.budget)
        return handle
    }

    private final class Handle: LeaseHandle {
        let id: LeaseID
        let request: LeaseRequest
        let events: WaitableLog<RecordedLeaseEvent>
        private let ended = Lock(false)

        init(id: LeaseID, request: LeaseRequest, events: WaitableLog<RecordedLeaseEvent>) {
            self.id = id
            self.request = request
            self.events = events
        }

        func record(_ kind: RecordedLeaseEvent.Kind, budget: Duration? = nil, status: [String: StatusValue] = [:]) {
            events.append(RecordedLeaseEvent(kind: kind, lease: id, holds: request.holds, reason: request.reason, budget: budget, status: status))
        }

        func setStatus(_ status: [String: StatusValue]) async {
            guard !ended.withLock({ $0 }) else { return }
            record(.status, status: status)
        }

        func renew(budget: Duration?) async throws {
            guard !ended.withLock({ $0 }) else { throw LeaseError(.ended, "lease \(id) already ended") }
            record(.renewed, budget: budget ?? request.budget)
        }

        func release() async {
            let first = ended.withLock { ended in
                defer { ended = true }
                return !ended
            }
            if first { record(.released) }
        }

        var state: LeaseState {
            get async { ended.withLock { $0 } ? .released : .active }
        }
    }
}

/// A hook command a strategy ran through ``RecordingHookRunner``.
public struct HookCall: Sendable, Hashable {
    public var command: HookCommand
    public var event: String
    public var variables: [String: String]
}

/// A `HookRunning` that starts nothing: it records each call in ``calls``
/// and answers with ``result``.
public final class RecordingHookRunner: HookRunning {
    public let calls = WaitableLog<HookCall>()
    public let result: HookResult

    public init(result: HookResult = HookResult(exit: .exited(0), output: "", duration: .zero)) {
        self.result = result
    }

    public func run(_ command: HookCommand, event: String, variables: [String: String]) async -> HookResult {
        calls.append(HookCall(command: command, event: event, variables: variables))
        return result
    }
}
