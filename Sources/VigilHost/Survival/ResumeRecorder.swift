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

extension SystemWake {
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

    @discardableResult
    func resumed(_ readings: ClockReadings, suspendedMicros: Int64) async -> SystemWake {
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
        return wake
    }
}
