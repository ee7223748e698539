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
}

/// How a run ended. `running` means no end has been recorded yet.
public enum RunEndReason: String, Codable, Sendable, CaseIterable {
    /// No end recorded: the run is alive, or died and no later run has started yet.
    case running
    /// Clean shutdown.
    case stopped
    /// No clean end, and the next run started in the same boot.
    case killed
    /// No clean end, and the next run started in a different boot.
    case rebooted
    /// The host ended on an error it recorded itself.
    case failed
}

/// A lease as recorded in a heartbeat.
public struct HeartbeatLease: Sendable, Hashable, Codable {
    public var id: UInt64
    /// The strategy instance holding it.
    public var strategy: String
    /// What it holds on the system (logind, wakelock, none, ...).
    public var holds: String
    /// Its state (active, expiring, ...).
    public var state: String

    public init(id: UInt64, strategy: String, holds: String, state: String) {
        self.id = id
        self.strategy = strategy
        self.holds = holds
        self.state = state
    }
}
