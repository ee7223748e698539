import Foundation
import VigilDBus
import VigilKit

/// Sleep that broke a lease: a suspend that begins (logind's
/// `PrepareForSleep(true)`) while Vigil leases hold `sleep` in block mode.
/// A lease is only a request: root's `systemctl suspend -i`, the lid switch
/// (`LidSwitchIgnoreInhibited=yes` is logind's default), a critical battery
/// action or `echo mem > /sys/power/state` suspend all the same. After the
/// resume (`PrepareForSleep(false)`) each such suspend becomes one
/// ``BrokenSleep``: a survival-log event, a warning line, a metric, and
/// the `SleepBrokeLease` D-Bus signal per lease (through ``breaks()``). The
/// leases go on: their budgets count awake time.
public actor SleepBreaks {
    private let registry: LeaseRegistry
    private let clock: any VigilClock
    private let readings: @Sendable () -> ClockReadings
    private let runStartBoottimeMicros: Int64
    private let log: Logger
    private let record: @Sendable (BrokenSleep, ClockReadings) async -> Void
    private var subscribers: [UInt64: AsyncStream<BrokenSleep>.Continuation] = [:]
    private var nextSubscriber: UInt64 = 0
    private var watching: Task<Void, Never>?

    /// A suspend that began while leases held sleep, until it is told.
    private struct Pending {
        var number: UInt64
        var start: ClockReadings
        var leases: [BrokenSleep.Lease]
        var sleptMicros: Int64?
    }
    private var pending: Pending?
    private var nextNumber: UInt64 = 0
    /// The newest resume the resume watcher explained, with its boottime.
    private var lastWake: (cause: String, boot: Int64)?
    /// How long the report waits after `PrepareForSleep(false)` for the
    /// resume watcher to say what woke the system.
    static let wakeWait: Duration = .seconds(2)

    public init(registry: LeaseRegistry, clock: any VigilClock, readings: @escaping @Sendable () -> ClockReadings,
                runStartBoottimeMicros: Int64, logging: HostLogging,
                record: @escaping @Sendable (BrokenSleep, ClockReadings) async -> Void) {
        self.registry = registry
        self.clock = clock
        self.readings = readings
        self.runStartBoottimeMicros = runStartBoottimeMicros
        self.log = logging.logger("sleep")
        self.record = record
    }

    /// Follows logind's PrepareForSleep on `connection`.
    public func watch(_ connection: DBusConnection) async throws {
        let signals = try await connection.signals(matching: DBusMatchRule(
            sender: LogindPowerBackend.busName, path: LogindPowerBackend.path, interface: LogindPowerBackend.interface,
            member: "PrepareForSleep"))
        // Unstructured task: cancelled by stop().
        watching = Task { [weak self] in
            for await signal in signals {
                guard let starting = try? signal.argument(0, as: Bool.self) else { continue }
                if starting { await self?.sleepBegins() } else { await self?.sleepEnded() }
            }
        }
    }

    public func stop() {
        watching?.cancel()
        watching = nil
        for subscriber in subscribers.values { subscriber.finish() }
        subscribers = [:]
    }

    /// Each broken sleep from now on, until ``stop()``.
    public func breaks() -> AsyncStream<BrokenSleep> {
        let (stream, continuation) = AsyncStream.makeStream(of: BrokenSleep.self, bufferingPolicy: .bufferingNewest(64))
        let id = nextSubscriber
        nextSubscriber += 1
        subscribers[id] = continuation
        // Unstructured task: not cancelled: one hop into the actor to forget the subscriber, from a
        // synchronous termination handler.
        continuation.onTermination = { [weak self] _ in Task { await self?.unsubscribe(id) } }
        return stream
    }

    private func unsubscribe(_ id: UInt64) { subscribers[id] = nil }

    /// The resume watcher explained a resume.
    public func resumed(_ wake: SystemWake, boottimeMicros: Int64) async {
        lastWake = (wake.cause.rawValue, boottimeMicros)
        if let current = pending, current.sleptMicros != nil { await tell(current.number) }
    }

    func sleepBegins() async {
        let start = readings()
        let held = await registry.active.filter { lease in
            guard let hold = lease.hold else { return false }
            return hold.mode == "block" && hold.what.contains("sleep")
        }
        guard !held.isEmpty else {
            log.debug("a sleep begins; no Vigil lease holds sleep in block mode")
            return
        }
        nextNumber += 1
        pending = Pending(number: nextNumber, start: start, leases: held.map {
            BrokenSleep.Lease(id: $0.id.rawValue, holder: $0.strategy, name: $0.client?.name ?? $0.reason)
        })
    }

    func sleepEnded() async {
        guard var current = pending, current.sleptMicros == nil else { return }
        let now = readings()
        current.sleptMicros = max(0, (now.boottimeMicros - now.monotonicMicros) - (current.start.boottimeMicros - current.start.monotonicMicros))
        pending = current
        if let wake = lastWake, wake.boot >= current.start.boottimeMicros {
            await tell(current.number)
            return
        }
        // The resume watcher may see the resume a moment after logind says
        // so; without a suspend (slept below the gap rule's threshold) there
        // is no resume to wait for.
        guard current.sleptMicros ?? 0 > GapRule.suspendThresholdMicros else {
            await tell(current.number)
            return
        }
        let number = current.number, clock = self.clock
        // Unstructured task: not cancelled: it ends after `wakeWait`, and holds the actor weakly.
        Task { [weak self] in
            try? await clock.sleep(for: Self.wakeWait)
            await self?.tell(number)
        }
    }

    private func tell(_ number: UInt64) async {
        guard let current = pending, current.number == number, let slept = current.sleptMicros else { return }
        pending = nil
        let cause = lastWake.flatMap { $0.boot >= current.start.boottimeMicros ? $0.cause : nil } ?? "unknown"
        let broken = BrokenSleep(
            wall: current.start.wallMicros, startOffsetMicros: max(0, current.start.boottimeMicros - runStartBoottimeMicros),
            sleptMicros: slept, wakeCause: cause, leases: current.leases)
        let names = current.leases.prefix(8).map { "lease \($0.id) (\(ClientText.excerpt($0.holder)): \(ClientText.excerpt($0.name)))" }
            .joined(separator: ", ") + (current.leases.count > 8 ? ", …" : "")
        log.warning("the system slept \(SurvivalReportFormat.duration(slept)) although \(current.leases.count == 1 ? "a lease held" : "\(current.leases.count) leases held") sleep (woken by \(cause)): \(names)")
        await record(broken, current.start)
        for subscriber in subscribers.values { subscriber.yield(broken) }
    }
}
