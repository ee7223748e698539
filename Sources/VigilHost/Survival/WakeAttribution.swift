import Foundation
import VigilKit

/// A system-waking alarm of the wake scheduler: a `wakeSystem` request, at
/// the time the `CLOCK_BOOTTIME_ALARM` timer was armed for, and when it fired.
public struct SystemWakeAlarm: Sendable, Hashable {
    /// Who asked (the request's label, e.g. "tick periodic-wake").
    public var label: String
    /// The strategy and kind that asked, when a strategy did.
    public var owner: WakeOwner?
    /// Boottime the alarm clock was armed for.
    public var deadline: VigilInstant
    /// When it fired, or nil while pending.
    public var firedAt: VigilInstant?

    public init(label: String, owner: WakeOwner? = nil, deadline: VigilInstant, firedAt: VigilInstant?) {
        self.label = label
        self.owner = owner
        self.deadline = deadline
        self.firedAt = firedAt
    }
}

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

    /// Decides what woke the system. `resume` are the clock readings just
    /// after the resume, `suspendedMicros` how long it slept, `alarms` the
    /// scheduler's system-waking alarms (pending and recently fired).
    public static func attribute(
        resume: ClockReadings, runStartBoottimeMicros: Int64, suspendedMicros: Int64,
        alarms: [SystemWakeAlarm], kernelSource: String?
    ) -> SystemWake {
        let woke = resume.boottimeMicros
        let slept = woke - suspendedMicros
        // Alarms due between falling asleep and (a little after) waking.
        let due = alarms
            .map { (alarm: $0, deadline: $0.deadline.nanoseconds / 1_000) }
            .filter { $0.deadline >= slept && $0.deadline <= woke + earlyBoundMicros }
            .sorted { $0.deadline < $1.deadline }
        var wake = SystemWake(
            wall: resume.wallMicros, startOffsetMicros: max(0, woke - runStartBoottimeMicros),
            suspendedMicros: suspendedMicros, cause: .other, kernelSource: kernelSource)
        if let first = due.first {
            let lateness = woke - first.deadline
            if lateness <= latenessBoundMicros {
                wake.cause = .vigilAlarm
                wake.alarm = first.alarm.label
                wake.alarmStrategy = first.alarm.owner?.strategy
                wake.alarmKind = first.alarm.owner?.kind
                wake.latenessMicros = lateness
            } else {
                wake.missedAlarm = first.alarm.label
                wake.missedByMicros = lateness
            }
        }
        return wake
    }

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
    init?(fields: [String: String], wall: Int64, startOffsetMicros: Int64) {
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

/// The kernel's own account of what woke the system, read from sysfs:
/// `/sys/power/pm_wakeup_irq` (the IRQ that ended the last suspend, where the
/// kernel knows it) and the wakeup sources in `/sys/class/wakeup` whose
/// event count grew since the previous snapshot. Reads are bounded (256
/// sources, 4 KiB a file) and names reduced to printable ASCII, since they
/// end up on a terminal.
public struct KernelWakeSources: Sendable {
    public var root: String
    private var counts: [String: Int64] = [:]

    public init(root: String = "/sys") {
        self.root = root
        counts = Self.eventCounts(root: root)
    }

    /// Describes what woke the system since the last call, or nil.
    public mutating func describeWake() -> String? {
        let now = Self.eventCounts(root: root)
        defer { counts = now }
        var parts: [String] = []
        if let irq = Self.readSmall("\(root)/power/pm_wakeup_irq").map(Self.printable), !irq.isEmpty {
            parts.append("pm_wakeup_irq \(irq)")
        }
        let grown = now.filter { $0.value > counts[$0.key, default: 0] }.keys.sorted()
        if !grown.isEmpty {
            parts.append("wakeup sources: " + grown.prefix(8).joined(separator: ", ") + (grown.count > 8 ? ", …" : ""))
        }
        return parts.isEmpty ? nil : parts.joined(separator: "; ")
    }

    static func eventCounts(root: String) -> [String: Int64] {
        let dir = "\(root)/class/wakeup"
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: dir) else { return [:] }
        var counts: [String: Int64] = [:]
        for entry in entries.sorted().prefix(256) {
            guard let name = readSmall("\(dir)/\(entry)/name").map(printable), !name.isEmpty,
                  let count = readSmall("\(dir)/\(entry)/event_count").flatMap({ Int64($0) }) else { continue }
            counts[name, default: 0] += count
        }
        return counts
    }

    static func readSmall(_ path: String) -> String? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let data = try? handle.read(upToCount: 4096) else { return nil }
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func printable(_ text: String) -> String {
        String(text.unicodeScalars.prefix(64).map { $0.value >= 0x20 && $0.value < 0x7F ? Character($0) : "?" })
    }
}

/// Records a `system-resumed` event for each resume the host sees: what
/// woke the system (``SystemWake/attribute``), and logs it.
actor ResumeRecorder {
    private let store: SurvivalStore
    private let scheduler: WakeScheduler?
    private let runStartBoottimeMicros: Int64
    private let log: Logger
    private var kernel: KernelWakeSources
    /// Counts a wake by a strategy's alarm as that strategy's system wake.
    private let costs: StrategyCosts?

    init(store: SurvivalStore, scheduler: WakeScheduler?, runStartBoottimeMicros: Int64, log: Logger,
         costs: StrategyCosts? = nil, sysfsRoot: String = "/sys") {
        self.costs = costs
        self.store = store
        self.scheduler = scheduler
        self.runStartBoottimeMicros = runStartBoottimeMicros
        self.log = log
        self.kernel = KernelWakeSources(root: sysfsRoot)
    }

    func resumed(_ readings: ClockReadings, suspendedMicros: Int64) async {
        let asleepSince = VigilInstant(nanoseconds: (readings.boottimeMicros - suspendedMicros) * 1_000)
        let alarms = await scheduler?.systemWakeAlarms(since: asleepSince) ?? []
        let wake = SystemWake.attribute(
            resume: readings, runStartBoottimeMicros: runStartBoottimeMicros, suspendedMicros: suspendedMicros,
            alarms: alarms, kernelSource: kernel.describeWake())
        log.notice("system resumed after \(SurvivalReportFormat.duration(suspendedMicros)) suspended: \(SurvivalReportFormat.wakeCause(wake))")
        if wake.cause == .vigilAlarm, let strategy = wake.alarmStrategy { costs?.systemWake(by: strategy) }
        do {
            try await store.recordEvent(SystemWake.eventName, strategy: nil, fields: wake.fields, readings: readings)
        } catch {
            log.error("cannot record the resume: \(error)")
        }
    }
}
