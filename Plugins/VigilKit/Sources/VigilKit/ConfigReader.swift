/// Typed, problem-collecting access to one `[[strategy]]` table.
///
/// Accessors never throw: a missing or malformed value is recorded as a
/// ``ConfigProblem`` (with file, line, column and key path) and a placeholder
/// is returned, so one validation pass reports every problem. The host reports
/// every key of the table that no accessor asked for as unknown, with a
/// did-you-mean suggestion.
///
/// Used only during ``StrategyKind/makeStrategy(_:)``, from one thread.
public final class ConfigReader {
    /// The instance name (`name` key).
    public let strategyName: String
    /// The key path prefix of this table, e.g. `strategy[1]`.
    public let keyPath: String
    public let values: [String: ConfigValue]
    private let locations: [String: ConfigLocation]
    private let tableLocation: ConfigLocation?

    /// Problems recorded so far.
    public private(set) var problems: [ConfigProblem] = []
    /// Keys an accessor asked for (known keys, for unknown-key detection).
    public private(set) var consultedKeys: Set<String> = []

    public init(
        strategyName: String, keyPath: String, values: [String: ConfigValue],
        locations: [String: ConfigLocation] = [:], tableLocation: ConfigLocation? = nil
    ) {
        self.strategyName = strategyName
        self.keyPath = keyPath
        self.values = values
        self.locations = locations
        self.tableLocation = tableLocation
    }

    /// Records a problem with `key` (or with the whole table when `key` is nil).
    public func problem(_ key: String?, _ message: String) {
        let path = key.map { "\(keyPath).\($0)" } ?? keyPath
        let location = key.flatMap { locations[$0] } ?? tableLocation
        problems.append(ConfigProblem(location: location, keyPath: path, message: message))
    }

    public var hasProblems: Bool { !problems.isEmpty }

    /// The location of `key`, for messages a strategy builds itself.
    public func location(of key: String) -> ConfigLocation? { locations[key] ?? tableLocation }

    /// Marks a key as known without reading it (e.g. a key the host reads).
    public func declare(_ keys: String...) { consultedKeys.formUnion(keys) }

    private func lookup(_ key: String, required: Bool, expected: String) -> ConfigValue? {
        consultedKeys.insert(key)
        guard let value = values[key] else {
            if required { problem(key, "missing required key; expected \(expected)") }
            return nil
        }
        return value
    }

    private func mismatch(_ key: String, _ expected: String, _ value: ConfigValue) {
        problem(key, "expected \(expected), found \(value.typeName)")
    }

    // MARK: strings

    public func string(_ key: String) -> String? {
        guard let value = lookup(key, required: false, expected: "a string") else { return nil }
        guard case .string(let s) = value else { mismatch(key, "a string", value); return nil }
        return s
    }

    public func string(_ key: String, default fallback: String) -> String {
        string(key) ?? fallback
    }

    public func requireString(_ key: String) -> String {
        guard lookup(key, required: true, expected: "a string") != nil else { return "" }
        return string(key) ?? ""
    }

    /// A string that must be one of `choices`.
    public func choice(_ key: String, _ choices: [String], default fallback: String) -> String {
        guard let s = string(key) else { return fallback }
        guard choices.contains(s) else {
            let hint = Spelling.suggestion(for: s, among: choices).map { " (did you mean \"\($0)\"?)" } ?? ""
            problem(key, "expected one of \(choices.map { "\"\($0)\"" }.joined(separator: ", ")), found \"\(s)\"\(hint)")
            return fallback
        }
        return s
    }

    // MARK: numbers and booleans

    public func integer(_ key: String) -> Int64? {
        guard let value = lookup(key, required: false, expected: "an integer") else { return nil }
        guard case .integer(let i) = value else { mismatch(key, "an integer", value); return nil }
        return i
    }

    public func integer(_ key: String, default fallback: Int64, range: ClosedRange<Int64>? = nil) -> Int64 {
        guard let i = integer(key) else { return fallback }
        if let range, !range.contains(i) {
            problem(key, "expected an integer in \(range.lowerBound)...\(range.upperBound), found \(i)")
            return fallback
        }
        return i
    }

    public func number(_ key: String) -> Double? {
        guard let value = lookup(key, required: false, expected: "a number") else { return nil }
        switch value {
        case .integer(let i): return Double(i)
        case .float(let d) where d.isFinite: return d
        case .float: problem(key, "expected a finite number"); return nil
        default: mismatch(key, "a number", value); return nil
        }
    }

    public func number(_ key: String, default fallback: Double) -> Double { number(key) ?? fallback }

    public func bool(_ key: String) -> Bool? {
        guard let value = lookup(key, required: false, expected: "a boolean") else { return nil }
        guard case .boolean(let b) = value else { mismatch(key, "a boolean (true or false)", value); return nil }
        return b
    }

    public func bool(_ key: String, default fallback: Bool) -> Bool { bool(key) ?? fallback }

    // MARK: durations and sizes

    /// A duration: a string such as `"90s"`, `"25m"`, `"1h30m"`, `"250ms"`,
    /// or an integer number of seconds. Negative values are rejected.
    public func duration(_ key: String) -> Duration? {
        guard let value = lookup(key, required: false, expected: "a duration") else { return nil }
        return parseDuration(key, value)
    }

    public func duration(_ key: String, default fallback: Duration) -> Duration { duration(key) ?? fallback }

    public func requireDuration(_ key: String) -> Duration {
        guard lookup(key, required: true, expected: "a duration such as \"90s\" or \"1h30m\"") != nil else { return .zero }
        return duration(key) ?? .zero
    }

    /// A strictly positive duration, or nil when the key is absent.
    public func positiveDuration(_ key: String) -> Duration? {
        guard let d = duration(key) else { return nil }
        guard d > .zero else {
            problem(key, "expected a duration greater than zero, found \"\(d.vigilDescription)\"")
            return nil
        }
        return d
    }

    public func positiveDuration(_ key: String, default fallback: Duration) -> Duration {
        positiveDuration(key) ?? fallback
    }

    public func requirePositiveDuration(_ key: String) -> Duration {
        guard lookup(key, required: true, expected: "a duration such as \"90s\" or \"1h30m\"") != nil else { return .seconds(1) }
        return positiveDuration(key) ?? .seconds(1)
    }

    private func parseDuration(_ key: String, _ value: ConfigValue) -> Duration? {
        switch value {
        case .integer(let i):
            guard i >= 0 else { problem(key, "expected a non-negative duration, found \(i)"); return nil }
            return .seconds(i)
        case .string(let s):
            switch DurationSyntax.parse(s) {
            case .success(let d): return d
            case .failure(let e): problem(key, e.message); return nil
            }
        default:
            mismatch(key, "a duration such as \"90s\" or \"1h30m\"", value)
            return nil
        }
    }

    /// A byte size: `"512KiB"`, `"10MB"`, `"1G"` or an integer number of bytes.
    public func byteSize(_ key: String) -> Int64? {
        guard let value = lookup(key, required: false, expected: "a byte size") else { return nil }
        switch value {
        case .integer(let i):
            guard i >= 0 else { problem(key, "expected a non-negative byte size, found \(i)"); return nil }
            return i
        case .string(let s):
            switch ByteSizeSyntax.parse(s) {
            case .success(let n): return n
            case .failure(let e): problem(key, e.message); return nil
            }
        default:
            mismatch(key, "a byte size such as \"64KiB\" or \"10MB\"", value)
            return nil
        }
    }

    public func byteSize(_ key: String, default fallback: Int64) -> Int64 { byteSize(key) ?? fallback }

    // MARK: arrays and tables

    public func stringArray(_ key: String) -> [String]? {
        guard let value = lookup(key, required: false, expected: "an array of strings") else { return nil }
        guard case .array(let items) = value else { mismatch(key, "an array of strings", value); return nil }
        var out: [String] = []
        for (i, item) in items.enumerated() {
            guard case .string(let s) = item else {
                problem(key, "element \(i) : expected a string, found \(item.typeName)")
                return nil
            }
            out.append(s)
        }
        return out
    }

    /// A command as an argv array: non-empty, first element non-empty. No
    /// shell is involved unless the user writes `["sh", "-c", "..."]`.
    public func argv(_ key: String) -> [String]? {
        guard let value = values[key] else { consultedKeys.insert(key); return nil }
        if case .string(let s) = value {
            consultedKeys.insert(key)
            problem(key, "expected an argv array such as [\"/usr/bin/true\"], found a string; write [\"sh\", \"-c\", \"\(s)\"] to use a shell")
            return nil
        }
        guard let args = stringArray(key) else { return nil }
        if args.isEmpty || args[0].isEmpty {
            problem(key, "expected a non-empty argv array whose first element names the program")
            return nil
        }
        return args
    }

    public func requireArgv(_ key: String) -> [String] {
        guard lookup(key, required: true, expected: "an argv array such as [\"/usr/bin/true\"]") != nil else { return [] }
        return argv(key) ?? []
    }

    /// A nested table, as its own reader sharing this reader's problem list.
    public func table(_ key: String) -> [String: ConfigValue]? {
        guard let value = lookup(key, required: false, expected: "a table") else { return nil }
        guard case .table(let t) = value else { mismatch(key, "a table", value); return nil }
        return t
    }
}
