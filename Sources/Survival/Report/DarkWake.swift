import Foundation

/// One wake by vigild's own alarm and what followed it (event `dark-wake`):
/// the work the alarm was for, and whether vigild returned the system to
/// sleep or why it stayed awake (docs/survival.md, "Wake, work, sleep again").
public struct DarkWake: Codable, Sendable, Hashable {
    public enum Outcome: String, Codable, Sendable {
        /// vigild asked logind to suspend again.
        case asleepAgain = "asleep-again"
        /// Something needed the machine (``DarkWake/reason``).
        case stayedAwake = "stayed-awake"
    }

    /// Wall time of the resume (µs since the epoch).
    public var wall: Int64
    /// Boottime since the run's start at the resume (µs), for the timeline.
    public var startOffsetMicros: Int64
    /// The alarm that woke the system, and the strategy and kind that asked.
    public var alarm: String?
    public var alarmStrategy: String?
    public var alarmKind: String?
    /// Leases the woken strategy began for the work.
    public var runs: Int
    /// From the resume to the end of the work (µs); nil when the decision
    /// came before the work ended (the setting is off).
    public var workEndedAfterMicros: Int64?
    /// From the resume to the return to sleep, or to the decision to stay awake (µs).
    public var awakeMicros: Int64
    public var outcome: Outcome
    /// Why it stayed awake, for people ("keys pressed", "another program
    /// holds a sleep inhibitor: ..."); nil when asleep again.
    public var reason: String?
    /// The refusal's code (``Refusal``), nil when asleep again.
    public var refusal: String?

    public static let eventName = "dark-wake"

    /// What kept the system awake after vigild's own wake.
    public enum Refusal: String, Sendable, CaseIterable {
        case settingOff = "setting-off"
        case vigilLease = "vigil-lease"
        case inhibitor
        case person
        case sleepInProgress = "sleep-in-progress"
        case suspendFailed = "suspend-failed"
    }

    public init(wall: Int64, startOffsetMicros: Int64, alarm: String? = nil, alarmStrategy: String? = nil, alarmKind: String? = nil,
                runs: Int = 0, workEndedAfterMicros: Int64? = nil, awakeMicros: Int64, outcome: Outcome,
                reason: String? = nil, refusal: String? = nil) {
        self.wall = wall
        self.startOffsetMicros = startOffsetMicros
        self.alarm = alarm
        self.alarmStrategy = alarmStrategy
        self.alarmKind = alarmKind
        self.runs = runs
        self.workEndedAfterMicros = workEndedAfterMicros
        self.awakeMicros = awakeMicros
        self.outcome = outcome
        self.reason = reason
        self.refusal = refusal
    }

    /// The event's string fields (the event's own wall and boot are the
    /// moment of the decision; `wokeWall` and `wokeBoot` are the resume's).
    public func fields(wokeBootMicros: Int64) -> [String: String] {
        var f = ["outcome": outcome.rawValue, "runs": String(runs), "awakeMicros": String(awakeMicros),
                 "wokeWall": String(wall), "wokeBoot": String(wokeBootMicros)]
        if let alarm { f["alarm"] = alarm }
        if let alarmStrategy { f["alarmStrategy"] = alarmStrategy }
        if let alarmKind { f["alarmKind"] = alarmKind }
        if let workEndedAfterMicros { f["workEndedAfterMicros"] = String(workEndedAfterMicros) }
        if let reason { f["reason"] = reason }
        if let refusal { f["refusal"] = refusal }
        return f
    }

    /// Rebuilds a dark wake from its event (nil if the fields are not one).
    package init?(fields: [String: String], runStartBoot: Int64) {
        guard let outcome = fields["outcome"].flatMap(Outcome.init(rawValue:)),
              let awake = fields["awakeMicros"].flatMap(Int64.init),
              let wall = fields["wokeWall"].flatMap(Int64.init),
              let boot = fields["wokeBoot"].flatMap(Int64.init) else { return nil }
        self.init(wall: wall, startOffsetMicros: max(0, boot - runStartBoot), alarm: fields["alarm"],
                  alarmStrategy: fields["alarmStrategy"], alarmKind: fields["alarmKind"],
                  runs: fields["runs"].flatMap { Int($0) } ?? 0,
                  workEndedAfterMicros: fields["workEndedAfterMicros"].flatMap(Int64.init),
                  awakeMicros: awake, outcome: outcome, reason: fields["reason"], refusal: fields["refusal"])
    }
}

/// A suspend that began while Vigil leases held `sleep` in block mode
/// (event `sleep-broke-leases`): root's `systemctl suspend -i`, the lid
/// switch, a critical battery action, `echo mem > /sys/power/state`.
public struct BrokenSleep: Codable, Sendable, Hashable {
    /// One lease the suspend broke.
    public struct Lease: Codable, Sendable, Hashable {
        public var id: UInt64
        /// The strategy, or `client` / `inhibit` for a D-Bus client's lease.
        public var holder: String
        /// The client's name, else the lease's reason.
        public var name: String
        public init(id: UInt64, holder: String, name: String) {
            self.id = id
            self.holder = holder
            self.name = name
        }
    }

    /// Wall time when the sleep began (µs since the epoch).
    public var wall: Int64
    /// Boottime since the run's start when the sleep began (µs).
    public var startOffsetMicros: Int64
    /// How long the system slept (Δboot − Δmono from the sleep's start to
    /// the resume).
    public var sleptMicros: Int64
    /// What woke it: `vigil-alarm`, `other`, or `unknown` (no resume seen).
    public var wakeCause: String
    public var leases: [Lease]

    public static let eventName = "sleep-broke-leases"
    /// The most leases one event names (the rest are counted in `more`).
    public static let maxLeases = 32

    public init(wall: Int64, startOffsetMicros: Int64, sleptMicros: Int64, wakeCause: String, leases: [Lease]) {
        self.wall = wall
        self.startOffsetMicros = startOffsetMicros
        self.sleptMicros = sleptMicros
        self.wakeCause = wakeCause
        self.leases = leases
    }

    public var fields: [String: String] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let list = (try? encoder.encode(Array(leases.prefix(Self.maxLeases)))).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
        var f = ["sleptMicros": String(sleptMicros), "wakeCause": wakeCause, "leases": list]
        if leases.count > Self.maxLeases { f["more"] = String(leases.count - Self.maxLeases) }
        return f
    }

    package init?(fields: [String: String], wall: Int64, startOffsetMicros: Int64) {
        guard let slept = fields["sleptMicros"].flatMap(Int64.init), let cause = fields["wakeCause"],
              let list = fields["leases"],
              let leases = try? JSONDecoder().decode([Lease].self, from: Data(list.utf8)) else { return nil }
        self.init(wall: wall, startOffsetMicros: startOffsetMicros, sleptMicros: slept, wakeCause: cause, leases: leases)
    }
}
