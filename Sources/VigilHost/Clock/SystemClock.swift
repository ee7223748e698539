import CTimer
import Foundation
import VigilKit

/// Readings of the three clocks the survival log compares.
public struct ClockReadings: Sendable, Hashable, Codable {
    /// Wall clock, microseconds since the Unix epoch.
    public var wallMicros: Int64
    /// CLOCK_MONOTONIC, microseconds; stops during system suspend.
    public var monotonicMicros: Int64
    /// CLOCK_BOOTTIME, microseconds; keeps counting during suspend.
    public var boottimeMicros: Int64

    public init(wallMicros: Int64, monotonicMicros: Int64, boottimeMicros: Int64) {
        self.wallMicros = wallMicros
        self.monotonicMicros = monotonicMicros
        self.boottimeMicros = boottimeMicros
    }

    /// Reads the real clocks now.
    public static func now() -> ClockReadings {
        ClockReadings(
            wallMicros: vigil_clock_ns(vigil_CLOCK_REALTIME) / 1_000,
            monotonicMicros: vigil_clock_ns(vigil_CLOCK_MONOTONIC) / 1_000,
            boottimeMicros: vigil_clock_ns(vigil_CLOCK_BOOTTIME) / 1_000
        )
    }
}

/// The real clock: `CLOCK_BOOTTIME` for instants, `CLOCK_REALTIME` for wall time.
public struct SystemClock: VigilClock {
    public init() {}

    public var now: VigilInstant { VigilInstant(nanoseconds: vigil_clock_ns(vigil_CLOCK_BOOTTIME)) }

    public var wallMicroseconds: Int64 { vigil_clock_ns(vigil_CLOCK_REALTIME) / 1_000 }

    public func sleep(until deadline: VigilInstant) async throws {
        try await DeadlineTimer.sleep(until: deadline.nanoseconds)
    }
}

/// Awake time: `CLOCK_MONOTONIC`, which stops while the system is
/// suspended. Lease budgets are counted on it, as iOS counts a background
/// task's time: a budget is time the work could run, and time asleep is
/// not (a lease with budget left never lapses across a suspend). Its
/// instants are not on the boottime timeline of ``SystemClock``: compare
/// them only with each other.
public struct AwakeClock: VigilClock {
    public init() {}

    public var now: VigilInstant { VigilInstant(nanoseconds: vigil_clock_ns(vigil_CLOCK_MONOTONIC)) }

    public var wallMicroseconds: Int64 { vigil_clock_ns(vigil_CLOCK_REALTIME) / 1_000 }

    public func sleep(until deadline: VigilInstant) async throws {
        try await DeadlineTimer.sleep(until: deadline.nanoseconds, awake: true)
    }
}
