import Foundation
import VigilKit

/// What woke the system from one suspend, as the survival log records it
/// (event `system-resumed`; `vigilctl survival` prints it under the run's bar).
public struct SystemWake: Codable, Sendable, Hashable {
    public enum Cause: String, Codable, Sendable {
        /// A Vigil alarm was due when the system woke.
        case vigilAlarm = "vigil-alarm"
        /// No Vigil alarm explains the wake.
        case other
    }

    /// Wall time of the resume (µs since the epoch).
    public var wall: Int64
    /// Boottime since the run's start at the resume (µs), for the timeline.
    public var startOffsetMicros: Int64
    /// How long the system was suspended (Δboot − Δmono across the resume).
    public var suspendedMicros: Int64
    public var cause: Cause
    /// The alarm that woke it (`cause == .vigilAlarm`): its request label.
    public var alarm: String?
    /// The strategy instance whose alarm woke it, and that strategy's kind
    /// (nil when the alarm was not a strategy's).
    public var alarmStrategy: String?
    public var alarmKind: String?
    /// How late the resume came after that alarm's deadline (negative: the
    /// RTC, which counts whole seconds, woke the system a little early).
    public var latenessMicros: Int64?
    /// A Vigil alarm that was due during the suspend but did not wake the
    /// system (`cause == .other`), and how long before the resume it was due.
    public var missedAlarm: String?
    public var missedByMicros: Int64?
    /// What the kernel says woke it, where readable (`pm_wakeup_irq`, wakeup
    /// sources whose event count grew), else nil.
    public var kernelSource: String?

    /// The survival log's event name for a resume.
    public static let eventName = "system-resumed"

    /// A resume up to this late after a Vigil alarm's deadline counts as woken
    /// by it: the RTC counts whole seconds and resuming (devices, then tasks)
    /// takes a few seconds on slow machines. A later resume means the alarm
    /// did not wake the system (it would have woken it at its deadline).
    public static let latenessBoundMicros: Int64 = 10_000_000
    /// An alarm due this soon after the resume still counts (RTC rounding).
    public static let earlyBoundMicros: Int64 = 2_000_000

    /// The event's string fields.
    public var fields: [String: String] {
        var f = ["cause": cause.rawValue, "suspendedMicros": String(suspendedMicros)]
        if let alarm { f["alarm"] = alarm }
        if let alarmStrategy { f["alarmStrategy"] = alarmStrategy }
        if let alarmKind { f["alarmKind"] = alarmKind }
        if let latenessMicros { f["latenessMicros"] = String(latenessMicros) }
        if let missedAlarm { f["missedAlarm"] = missedAlarm }
        if let missedByMicros { f["missedByMicros"] = String(missedByMicros) }
        if let kernelSource { f["kernelSource"] = kernelSource }
        return f
    }

    /// Rebuilds a wake from its event (nil if the fields are not one).
    package init?(fields: [String: String], wall: Int64, startOffsetMicros: Int64) {
        guard let cause = fields["cause"].flatMap(Cause.init(rawValue:)),
              let suspended = fields["suspendedMicros"].flatMap(Int64.init) else { return nil }
        self.init(wall: wall, startOffsetMicros: startOffsetMicros, suspendedMicros: suspended, cause: cause,
                  alarm: fields["alarm"], alarmStrategy: fields["alarmStrategy"], alarmKind: fields["alarmKind"], latenessMicros: fields["latenessMicros"].flatMap(Int64.init),
                  missedAlarm: fields["missedAlarm"], missedByMicros: fields["missedByMicros"].flatMap(Int64.init),
                  kernelSource: fields["kernelSource"])
    }

    public init(wall: Int64, startOffsetMicros: Int64, suspendedMicros: Int64, cause: Cause, alarm: String? = nil,
                alarmStrategy: String? = nil, alarmKind: String? = nil, latenessMicros: Int64? = nil, missedAlarm: String? = nil, missedByMicros: Int64? = nil, kernelSource: String? = nil) {
        self.wall = wall
        self.startOffsetMicros = startOffsetMicros
        self.suspendedMicros = suspendedMicros
        self.cause = cause
        self.alarm = alarm
        self.alarmStrategy = alarmStrategy
        self.alarmKind = alarmKind
        self.latenessMicros = latenessMicros
        self.missedAlarm = missedAlarm
        self.missedByMicros = missedByMicros
        self.kernelSource = kernelSource
    }
}
