#if canImport(Glibc)
import Glibc
#endif

/// A point in time on the host's clock: nanoseconds of `CLOCK_BOOTTIME`,
/// which keeps counting while the system is suspended.
public struct VigilInstant: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) {
        self.nanoseconds = nanoseconds
    }

    public static func < (a: Self, b: Self) -> Bool { a.nanoseconds < b.nanoseconds }

    public static func + (a: Self, d: Duration) -> Self { Self(nanoseconds: a.nanoseconds + d.nanoseconds) }
    public static func - (a: Self, d: Duration) -> Self { Self(nanoseconds: a.nanoseconds - d.nanoseconds) }
    public static func - (a: Self, b: Self) -> Duration { .nanoseconds(a.nanoseconds - b.nanoseconds) }

    public var description: String { "t+\(DurationSyntax.format(.nanoseconds(nanoseconds)))" }
}

/// The host's clock. The real one reads `CLOCK_BOOTTIME`; tests inject a
/// manual clock so minutes of behaviour run in milliseconds.
public protocol VigilClock: Sendable {
    /// Now, on the boottime timeline.
    var now: VigilInstant { get }
    /// Wall-clock time now, in microseconds since the Unix epoch.
    var wallMicroseconds: Int64 { get }
    /// Suspends until `deadline`; throws `CancellationError` if cancelled.
    func sleep(until deadline: VigilInstant) async throws
}

extension VigilClock {
    public func sleep(for duration: Duration) async throws {
        try await sleep(until: now + duration)
    }
}

extension Duration {
    /// Total nanoseconds, saturating.
    public var nanoseconds: Int64 {
        let (s, atto) = components
        let (ns, overflow) = s.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return s < 0 ? .min : .max }
        return ns.addingReportingOverflow(atto / 1_000_000_000).overflow ? (s < 0 ? .min : .max) : ns + atto / 1_000_000_000
    }

    public var microseconds: Int64 { nanoseconds / 1_000 }

    public var seconds: Double { Double(nanoseconds) / 1e9 }

    /// "1h30m", "3m47s", "1.5s", "250ms": a duration for people, at most
    /// two units (``DurationSyntax/human(_:)``), in the notation the
    /// config accepts. Logs, errors and `vigilctl` use it; exact values go
    /// to `--json` and the metrics.
    public var vigilDescription: String { DurationSyntax.human(self) }
}
