import VigilKit

/// One condition of a `when` table (docs/composition.md).
public enum Condition: Sendable, Hashable {
    /// `ac_power = true` (on mains) or `false` (on battery).
    case acPower(Bool)
    /// `battery_above = "20%"`: every battery above the percentage (a
    /// machine without a battery counts as above).
    case batteryAbove(Int)
    /// `network = "online" | "unmetered"`.
    case network(NetworkRequirement)
    /// `time = ["mon-fri 09:00-18:00", ...]`: inside one of the windows, in local time.
    case time([TimeWindow])
    /// `lease_active = "player"` or `"client:<task>"`.
    case leaseActive(LeaseSelector)
    /// `process = "mpv"`: a process with this name (its `comm`) runs.
    case process(String)
    /// `file_exists = "/run/..."`.
    case fileExists(String)

    /// The condition as it is written in the config, for `WaitingFor` and logs.
    public var written: String {
        switch self {
        case .acPower(let on): return "ac_power = \(on)"
        case .batteryAbove(let p): return "battery_above = \"\(p)%\""
        case .network(let n): return "network = \"\(n.rawValue)\""
        case .time(let windows): return "time = [\(windows.map { "\"\($0.written)\"" }.joined(separator: ", "))]"
        case .leaseActive(let s): return "lease_active = \"\(s.written)\""
        case .process(let name): return "process = \"\(name)\""
        case .fileExists(let path): return "file_exists = \"\(path)\""
        }
    }
}

public enum NetworkRequirement: String, Sendable, Hashable, CaseIterable {
    /// A non-loopback link is up and running with an address.
    case online
    /// Online, and NetworkManager does not call the connection metered.
    case unmetered
}

/// Whose lease `lease_active` waits for.
public enum LeaseSelector: Sendable, Hashable {
    /// Any lease of the strategy instance with this name.
    case strategy(String)
    /// A lease a D-Bus client began (BeginBackgroundTask) under this task name.
    case client(String)

    public var written: String {
        switch self {
        case .strategy(let name): return name
        case .client(let task): return "client:\(task)"
        }
    }

    /// True when `lease` is one this selector waits for.
    func matches(_ lease: LeaseSnapshot) -> Bool {
        switch self {
        case .strategy(let name): return lease.strategy == name && lease.client == nil
        case .client(let task): return lease.client?.name == task
        }
    }
}

/// A strategy's conditions: it runs while every condition of at least one
/// table holds (`when` is one table; `when_any` a list of them).
public struct StrategyConditions: Sendable, Hashable {
    /// Each inner array is one table: all its conditions must hold.
    public var tables: [[Condition]]

    public init(tables: [[Condition]]) {
        self.tables = tables
    }

    /// Every condition of every table.
    public var all: [Condition] { tables.flatMap { $0 } }

    /// The conditions as written (`when_any` tables in parentheses, joined
    /// with " or "), as `WaitingFor` shows them when none holds.
    public var written: String { verdict { _ in false }.waitingFor }

    /// Whether the conditions hold given each condition's truth, and, when
    /// they do not, what is waited for: the false conditions of each table
    /// (tables joined with " or ").
    func verdict(_ truth: (Condition) -> Bool) -> ConditionVerdict {
        var missing: [String] = []
        for table in tables {
            let falseOnes = table.filter { !truth($0) }
            if falseOnes.isEmpty { return ConditionVerdict(holds: true, waitingFor: "") }
            missing.append(falseOnes.map(\.written).joined(separator: ", "))
        }
        return ConditionVerdict(holds: false, waitingFor: missing.map { tables.count > 1 ? "(\($0))" : $0 }.joined(separator: " or "))
    }
}

/// Whether a strategy may run now, and if not, which conditions are false.
public struct ConditionVerdict: Sendable, Hashable {
    public var holds: Bool
    /// The false conditions as written in the config; empty when `holds`.
    public var waitingFor: String

    public init(holds: Bool, waitingFor: String) {
        self.holds = holds
        self.waitingFor = waitingFor
    }
}
