import CTimer
import Foundation
import VigilKit

extension ClockReadings {
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
