import VigilKit

/// Reads a strategy's `when` / `when_any` keys (docs/configuration.md) and
/// checks, across strategies, what `lease_active` names.
enum ConditionConfig {
    /// The condition names a `when` table may hold.
    static let names = ["ac_power", "battery_above", "network", "time", "lease_active", "process", "file_exists"]
    /// The kernel keeps 15 bytes of a process name (`comm`).
    static let maxProcessName = 15
    /// Bounds on what a config may ask for.
    static let maxTables = 16
    static let maxWindows = 64

    /// The conditions of `table`, or nil when it has none or they have problems
    /// (recorded in `problems`).
    static func read(_ table: StrategyTable, problems: inout [ConfigProblem]) -> StrategyConditions? {
        let when = table.values["when"], whenAny = table.values["when_any"]
        if when != nil && whenAny != nil {
            problems.append(ConfigProblem(
                location: table.location(of: "when_any"), keyPath: "\(table.keyPath).when_any",
                message: "a strategy has either a when table or a when_any list, not both; move the when conditions into each when_any table"
            ))
            return nil
        }
        let start = problems.count
        var tables: [[Condition]] = []
        if let when {
            let path = "\(table.keyPath).when"
            guard case .table(let t) = when else {
                problems.append(ConfigProblem(location: table.location(of: "when"), keyPath: path, message: "expected a table such as when = { ac_power = true }, found \(when.typeName)"))
                return nil
            }
            tables.append(readTable(t, prefix: "when", keyPath: path, in: table, problems: &problems))
        } else if let whenAny {
            let path = "\(table.keyPath).when_any"
            guard case .array(let items) = whenAny, !items.isEmpty, items.count <= maxTables else {
                problems.append(ConfigProblem(location: table.location(of: "when_any"), keyPath: path,
                    message: "expected a list of 1 to \(maxTables) tables such as when_any = [{ ac_power = true }, { file_exists = \"/run/x\" }], found \(whenAny.typeName)"))
                return nil
            }
            for (i, item) in items.enumerated() {
                guard case .table(let t) = item else {
                    problems.append(ConfigProblem(location: table.location(of: "when_any"), keyPath: "\(path)[\(i)]", message: "expected a table, found \(item.typeName)"))
                    continue
                }
                tables.append(readTable(t, prefix: "when_any[\(i)]", keyPath: "\(path)[\(i)]", in: table, problems: &problems))
            }
        } else {
            return nil
        }
        return problems.count == start ? StrategyConditions(tables: tables) : nil
    }

    private static func readTable(
        _ values: [String: ConfigValue], prefix: String, keyPath: String, in table: StrategyTable, problems: inout [ConfigProblem]
    ) -> [Condition] {
        func location(_ key: String?) -> ConfigLocation? {
            key.flatMap { table.nestedLocations["\(prefix).\($0)"] } ?? table.location(of: prefix.hasPrefix("when_any") ? "when_any" : "when")
        }
        func problem(_ key: String?, _ message: String) {
            problems.append(ConfigProblem(location: location(key), keyPath: key.map { "\(keyPath).\($0)" } ?? keyPath, message: message))
        }
        if values.isEmpty {
            problem(nil, "empty condition table; expected one or more of \(names.joined(separator: ", "))")
            return []
        }
        var conditions: [Condition] = []
        for key in values.keys.sorted(by: { (location($0)?.line ?? 0, $0) < (location($1)?.line ?? 0, $1) }) {
            guard let value = values[key] else { continue }
            func string() -> String? {
                guard case .string(let s) = value, !s.isEmpty else {
                    problem(key, "expected a non-empty string, found \(value.typeName)")
                    return nil
                }
                return s
            }
            switch key {
            case "ac_power":
                guard case .boolean(let on) = value else { problem(key, "expected true (on mains) or false (on battery), found \(value.typeName)"); continue }
                conditions.append(.acPower(on))
            case "battery_above":
                var percent: Int?
                if case .string(let s) = value, s.hasSuffix("%") { percent = Int(s.dropLast()) }
                if case .integer(let n) = value { percent = Int(exactly: n) }
                guard let percent, (0...99).contains(percent) else {
                    problem(key, "expected a percentage from \"0%\" to \"99%\" such as \"20%\", found \(describe(value))")
                    continue
                }
                conditions.append(.batteryAbove(percent))
            case "network":
                guard let s = string() else { continue }
                guard let requirement = NetworkRequirement(rawValue: s) else {
                    let all = NetworkRequirement.allCases.map(\.rawValue)
                    let hint = Spelling.suggestion(for: s, among: all).map { " (did you mean \"\($0)\"?)" } ?? ""
                    problem(key, "unknown network requirement \"\(s)\"\(hint); expected \(all.map { "\"\($0)\"" }.joined(separator: " or "))")
                    continue
                }
                conditions.append(.network(requirement))
            case "time":
                var texts: [String] = []
                if case .string(let one) = value { texts = [one] }
                if case .array(let items) = value {
                    for item in items {
                        guard case .string(let s) = item else { texts = []; break }
                        texts.append(s)
                    }
                }
                guard !texts.isEmpty, texts.count <= maxWindows else {
                    problem(key, "expected a list of 1 to \(maxWindows) windows such as [\"mon-fri 09:00-18:00\"], found \(describe(value))")
                    continue
                }
                var windows: [TimeWindow] = []
                for (i, text) in texts.enumerated() {
                    switch TimeWindow.parse(text) {
                    case .success(let w): windows.append(w)
                    case .failure(let error): problem(key, "window \(i) \"\(text)\": \(error)")
                    }
                }
                if windows.count == texts.count { conditions.append(.time(windows)) }
            case "lease_active":
                guard let s = string() else { continue }
                if s.hasPrefix("client:") {
                    let task = String(s.dropFirst("client:".count))
                    guard !task.isEmpty else { problem(key, "expected \"client:<task name>\", found \"\(s)\""); continue }
                    conditions.append(.leaseActive(.client(task)))
                } else {
                    conditions.append(.leaseActive(.strategy(s)))
                }
            case "process":
                guard let s = string() else { continue }
                guard s.utf8.count <= maxProcessName, !s.contains("/") else {
                    problem(key, "expected a process name as the kernel keeps it (at most \(maxProcessName) bytes, no \"/\"; see /proc/PID/comm), found \"\(s)\"")
                    continue
                }
                conditions.append(.process(s))
            case "file_exists":
                guard let s = string() else { continue }
                guard s.hasPrefix("/"), s.utf8.count <= 4096 else { problem(key, "expected an absolute path, found \"\(s)\""); continue }
                conditions.append(.fileExists(s.standardizedPath))
            default:
                let hint = Spelling.suggestion(for: key, among: names).map { " (did you mean \"\($0)\"?)" } ?? ""
                problem(key, "unknown condition \"\(key)\"\(hint); conditions are \(names.joined(separator: ", "))")
            }
        }
        return conditions
    }

    private static func describe(_ value: ConfigValue) -> String {
        if case .string(let s) = value { return "\"\(s)\"" }
        return value.typeName
    }

    /// Problems with `lease_active` across strategies: names no strategy has,
    /// and cycles (a strategy that waits, directly or through others, for
    /// its own lease would never start).
    static func crossCheck(_ strategies: [ConfiguredStrategy], tables: [Int: StrategyTable]) -> [ConfigProblem] {
        var problems: [ConfigProblem] = []
        let names = strategies.map(\.name)
        var edges: [String: [String]] = [:]
        for s in strategies {
            guard let conditions = s.conditions else { continue }
            for case .leaseActive(.strategy(let target)) in conditions.all {
                if names.contains(target) {
                    edges[s.name, default: []].append(target)
                } else {
                    let hint = Spelling.suggestion(for: target, among: names).map { " (did you mean \"\($0)\"?)" } ?? ""
                    problems.append(ConfigProblem(
                        location: leaseLocation(tables[s.index]), keyPath: leaseKeyPath(tables[s.index], s),
                        message: "lease_active names \"\(target)\", which is not a strategy in this config\(hint); write \"client:<task>\" for a D-Bus client's lease"))
                }
            }
        }
        // Each cycle once, reported at its first strategy in file order.
        var reported: Set<String> = []
        for s in strategies where edges[s.name] != nil && !reported.contains(s.name) {
            if let cycle = findCycle(from: s.name, edges: edges) {
                reported.formUnion(cycle)
                let route = (cycle + [cycle[0]]).joined(separator: " → ")
                let message = cycle.count == 1
                    ? "strategy \"\(s.name)\" waits for its own lease (lease_active = \"\(s.name)\"): it could never start"
                    : "lease_active cycle \(route): each waits for the next one's lease, so none could ever start"
                problems.append(ConfigProblem(location: leaseLocation(tables[s.index]), keyPath: leaseKeyPath(tables[s.index], s), message: message))
            }
        }
        return problems
    }

    /// A cycle through `start`, as the strategies on it starting with `start`.
    private static func findCycle(from start: String, edges: [String: [String]]) -> [String]? {
        var path: [String] = []
        var visited: Set<String> = []
        func visit(_ node: String) -> Bool {
            path.append(node)
            for next in edges[node] ?? [] {
                if next == start { return true }
                if !visited.contains(next) {
                    visited.insert(next)
                    if visit(next) { return true }
                }
            }
            path.removeLast()
            return false
        }
        return visit(start) ? path : nil
    }

    private static func leaseLocation(_ table: StrategyTable?) -> ConfigLocation? {
        guard let table else { return nil }
        if let key = table.nestedLocations.keys.sorted().first(where: { $0.hasSuffix(".lease_active") }) {
            return table.nestedLocations[key]
        }
        return table.location(of: table.values["when"] != nil ? "when" : "when_any")
    }

    private static func leaseKeyPath(_ table: StrategyTable?, _ s: ConfiguredStrategy) -> String {
        let prefix = table?.values["when"] != nil ? "when" : "when_any"
        return "strategy[\(s.index)].\(prefix).lease_active"
    }
}
