import VigilKit

/// Why a kind could not be loaded: library missing, entry symbol missing, SDK
/// version mismatch, ... The message is shown to the user as is.
public struct KindResolutionError: Error, Sendable, Hashable, CustomStringConvertible {
    public var message: String

    public init(_ message: String) {
        self.message = message
    }

    public var description: String { message }
}

/// Resolves `kind` names to ``StrategyKind`` values. The plugin loader
/// conforms; tests use an in-memory list.
public protocol KindResolver {
    /// Every kind name that could be loaded (for "unknown kind" messages).
    /// Must not load anything.
    func availableKinds() -> [String]

    /// Loads (if needed) and returns the kind, or a message explaining why not.
    func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError>
}

/// A `[[strategy]]` table as read from the file, before its kind is known.
public struct StrategyTable: Sendable {
    /// Position among the `[[strategy]]` tables, from 0.
    public var index: Int
    /// `strategy[<index>]`, the prefix of this table's key paths.
    public var keyPath: String
    /// The table's raw values.
    public var values: [String: ConfigValue]
    /// Where the table's `[[strategy]]` header (or inline table) is.
    public var location: ConfigLocation?
    /// Where each key of the table is written.
    public var keyLocations: [String: ConfigLocation]
    /// Where keys of the `when` table and the `when_any` tables are written,
    /// by `when.<key>` and `when_any[<i>].<key>`.
    public var nestedLocations: [String: ConfigLocation] = [:]

    /// The location of `key`, or of the table when the key is absent.
    public func location(of key: String) -> ConfigLocation? { keyLocations[key] ?? location }

    /// The `name` value when it is a string.
    public var name: String? {
        if case .string(let s)? = values["name"] { return s }
        return nil
    }

    /// The `kind` value when it is a string.
    public var kind: String? {
        if case .string(let s)? = values["kind"] { return s }
        return nil
    }
}

/// A parsed config file whose `[host]` table is validated and whose strategy
/// tables are not yet (their kinds may not be loaded yet).
public struct ConfigDocument: Sendable {
    /// The config file as given.
    public var path: String
    /// The `[host]` settings; defaults stand in for keys that have problems.
    public var host: HostSettings
    /// The raw `[host]` table.
    public var hostValues: [String: ConfigValue]
    /// The `[[strategy]]` tables in file order.
    public var strategies: [StrategyTable]
    /// Problems found so far: in `[host]` and in the shape of the document.
    /// ``ConfigLoader/validate(_:resolver:)`` reports them together with the
    /// strategies' problems.
    public var problems: [ConfigProblem]

    /// True when `[host]` and the document's shape have no problems, so
    /// ``host`` holds exactly what the file says.
    public var isHostValid: Bool { problems.isEmpty }
}

/// One configured and validated strategy instance, not yet running.
public struct ConfiguredStrategy: Sendable {
    /// The instance's unique `name`.
    public var name: String
    /// The `kind` name, e.g. `periodic-wake`.
    public var kind: String
    /// Position among the `[[strategy]]` tables, from 0.
    public var index: Int
    /// The strategy built by its kind; nothing runs until `run(in:)`.
    public var strategy: any KeepAliveStrategy
    /// The kind that built it (for its summary in listings).
    public var strategyKind: any StrategyKind
    /// The raw table, for showing the configuration (e.g. over D-Bus).
    public var values: [String: ConfigValue]
    /// Where the table starts in the file.
    public var location: ConfigLocation?
    /// Its `when` / `when_any` conditions (docs/composition.md).
    public var conditions: StrategyConditions? = nil
}

/// A fully validated config: everything the host needs to start.
public struct VigilConfig: Sendable {
    /// The config file as given.
    public var path: String
    public var host: HostSettings
    /// The strategies in file order.
    public var strategies: [ConfiguredStrategy]
    /// Remarks that are not problems, e.g. that no strategy is configured.
    public var notes: [String]
}

/// Every problem found in a config file.
///
/// `description` shows one `file:line:column: key.path: message` line per
/// problem, in file order, then a count: `2 problems in vigil.toml`.
public struct ConfigError: Error, Sendable, CustomStringConvertible {
    /// The config file as given.
    public var path: String
    /// The problems, ordered by position in the file (problems about the
    /// whole file first).
    public var problems: [ConfigProblem]

    public init(path: String, problems: [ConfigProblem]) {
        self.path = path
        self.problems = ConfigError.ordered(problems)
    }

    /// At most ``ConfigLimits/maxReportedProblems`` lines, then how many
    /// more there were; text from the file is escaped for the terminal.
    public var description: String {
        var lines = problems.prefix(ConfigLimits.maxReportedProblems).map { problem -> String in
            TerminalText.escaped(problem.location == nil ? "\(path): \(problem)" : problem.description)
        }
        let hidden = problems.count - lines.count
        if hidden > 0 {
            lines.append("... and \(hidden) more problem\(hidden == 1 ? "" : "s") not shown (at most \(ConfigLimits.maxReportedProblems) are listed)")
        }
        lines.append("\(problems.count) problem\(problems.count == 1 ? "" : "s") in \(TerminalText.escaped(path))")
        return lines.joined(separator: "\n")
    }

    /// Sorts by line and column, stably; problems without a location first.
    static func ordered(_ problems: [ConfigProblem]) -> [ConfigProblem] {
        problems.enumerated().sorted { a, b in
            let la = a.element.location.map { ($0.line, $0.column) } ?? (0, 0)
            let lb = b.element.location.map { ($0.line, $0.column) } ?? (0, 0)
            if la != lb { return la < lb }
            return a.offset < b.offset
        }.map(\.element)
    }
}
