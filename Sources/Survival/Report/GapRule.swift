/// How the gap between two consecutive heartbeats of one run is classified.
///
/// CLOCK_MONOTONIC stops while the system is suspended and CLOCK_BOOTTIME
/// does not, so between two heartbeats:
/// - suspended time is Δboot − Δmono, counted when it exceeds
///   `suspendThresholdMicros` (readings are not taken atomically, so tiny
///   differences are noise);
/// - a frozen or stalled gap is Δmono > I + max(I/2, 2 s): the system was
///   awake but the heartbeat came far too late (SIGSTOP, cgroup freezer,
///   overload). Its length is Δmono, the awake time without a heartbeat.
public struct GapRule: Sendable, Hashable {
    /// Suspensions shorter than this (1 s) are treated as reading noise.
    public static let suspendThresholdMicros: Int64 = 1_000_000
    /// The smallest allowance for a late heartbeat (2 s).
    public static let minimumStallSlackMicros: Int64 = 2_000_000

    /// The heartbeat interval I of the run.
    public let intervalMicros: Int64

    public init(intervalMicros: Int64) {
        self.intervalMicros = intervalMicros
    }

    /// Δmono above which a gap is a stall: I + max(I/2, 2 s).
    public var stallThresholdMicros: Int64 {
        intervalMicros + max(intervalMicros / 2, Self.minimumStallSlackMicros)
    }

    /// What one gap between heartbeats contained.
    public struct Gap: Sendable, Hashable {
        /// Time suspended in the gap (0 when below the threshold).
        public var suspendedMicros: Int64
        /// Length of the stall (Δmono) when the gap was a stall, else nil.
        public var stallMicros: Int64?
        /// Δmono, clamped at zero.
        public var awakeMicros: Int64
        /// Δboot, clamped at zero.
        public var elapsedMicros: Int64
    }

    /// Classifies the gap from heartbeat `previous` to heartbeat `next`.
    public func classify(from previous: ClockReadings, to next: ClockReadings) -> Gap {
        // Both clocks only move forward within one boot; clamp anyway so a
        // bad reading cannot produce negative durations.
        let mono = max(0, next.monotonicMicros - previous.monotonicMicros)
        let boot = max(0, next.boottimeMicros - previous.boottimeMicros)
        let sleep = boot - mono
        return Gap(
            suspendedMicros: sleep > Self.suspendThresholdMicros ? sleep : 0,
            stallMicros: mono > stallThresholdMicros ? mono : nil,
            awakeMicros: mono,
            elapsedMicros: boot
        )
    }
}
