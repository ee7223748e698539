import Foundation
import TOMLKit
import VigilKit

/// Reads, parses and validates the Vigil config file.
///
/// Validation runs before anything starts and collects every problem it can
/// find in one pass, each with file, line, column, key path and what was
/// expected. Nothing above this layer sees TOMLKit: values are ``ConfigValue``s.
public enum ConfigLoader {
    /// The top-level tables a config may hold.
    static let topLevelKeys = ["host", "strategy", "metrics"]

    /// Reads and parses the file and validates `[host]` and the document's
    /// shape; strategy tables are only collected.
    ///
    /// Used before plugins are known, to learn `plugin_path` and `state_dir`.
    /// Throws only when the file cannot be read or is not valid TOML. Other
    /// problems are kept in ``ConfigDocument/problems`` (with defaults in
    /// their place) so that ``validate(_:resolver:)`` can report them
    /// together with the strategies' problems: the user sees all at once.
    public static func loadDocument(path: String) throws(ConfigError) -> ConfigDocument {
        let text = try readText(path: path)
        return try parseDocument(text: text, path: path)
    }

    /// Parses config text that was read from `path` (used for messages and
    /// to anchor relative paths).
    public static func parseDocument(text: String, path: String) throws(ConfigError) -> ConfigDocument {
        if text.utf8.count > ConfigLimits.maxFileBytes {
            throw ConfigError(path: path, problems: [ConfigProblem(location: nil, keyPath: "", message: tooLarge(text.utf8.count))])
        }
        // Before TOMLKit: its parser recurses once per level.
        if let problem = TOMLPrecheck.firstProblem(in: text, file: path) {
            throw ConfigError(path: path, problems: [problem])
        }
        let root: TOMLTable
        do {
            root = try TOMLTable(string: text)
        } catch let error as TOMLParseError {
            let location = ConfigLocation(file: path, line: error.source.begin.line, column: error.source.begin.column)
            throw ConfigError(path: path, problems: [
                ConfigProblem(location: location, keyPath: "", message: "invalid TOML: \(error.description)"),
            ])
        } catch {
            throw ConfigError(path: path, problems: [
                ConfigProblem(location: nil, keyPath: "", message: "invalid TOML: \(error)"),
            ])
        }
        let locator = SourceLocator(text: text, file: path)
        var builder = DocumentBuilder(path: path, locator: locator)
        return builder.build(TOMLConversion.table(root))
    }

    /// Reads, parses and validates the whole file, resolving each strategy's
    /// kind through `resolver`.
    public static func load(path: String, resolver: any KindResolver) throws(ConfigError) -> VigilConfig {
        let document = try loadDocument(path: path)
        return try validate(document, resolver: resolver).get()
    }

    /// Validates every strategy table and returns the config, or every
    /// problem of the document (including those of ``loadDocument(path:)``).
    public static func validate(_ document: ConfigDocument, resolver: any KindResolver) -> Result<VigilConfig, ConfigError> {
        var validator = StrategyValidator(resolver: resolver)
        var problems = document.problems
        var strategies: [ConfiguredStrategy] = []
        for table in document.strategies {
            if let configured = validator.validate(table, problems: &problems) {
                strategies.append(configured)
            }
        }
        if problems.isEmpty {
            let tables = Dictionary(document.strategies.map { ($0.index, $0) }, uniquingKeysWith: { a, _ in a })
            problems += ConditionConfig.crossCheck(strategies, tables: tables)
        }
        guard problems.isEmpty else {
            return .failure(ConfigError(path: document.path, problems: problems))
        }
        var notes: [String] = []
        if strategies.isEmpty {
            notes.append("no [[strategy]] tables in \(document.path): the host will run idle, recording only its survival log")
        }
        return .success(VigilConfig(path: document.path, host: document.host, strategies: strategies, notes: notes))
    }

    // MARK: reading

    static func tooLarge(_ size: Int?) -> String {
        let found = size.map { " (\($0) bytes)" } ?? ""
        return "config file is larger than \(ConfigLimits.maxFileBytes) bytes\(found); the limit is \(ConfigLimits.maxFileBytes / 1024 / 1024) MiB"
    }

    /// The file's text, or one problem naming the file and the system's reason.
    static func readText(path: String) throws(ConfigError) -> String {
        func failure(_ message: String) -> ConfigError {
            ConfigError(path: path, problems: [ConfigProblem(location: nil, keyPath: "", message: message)])
        }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw failure("cannot open config file: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw failure("cannot read config file: \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            bytes.append(contentsOf: buffer[0..<count])
            if bytes.count > ConfigLimits.maxFileBytes {
                throw failure(tooLarge(nil))
            }
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw failure("config file is not valid UTF-8 text")
        }
        return text
    }
}

/// Builds a ``ConfigDocument`` from the converted root table: checks the
/// top-level shape, reads `[host]`, and collects the strategy tables.
private struct DocumentBuilder {
    let path: String
    let locator: SourceLocator
    var problems: [ConfigProblem] = []

    init(path: String, locator: SourceLocator) {
        self.path = path
        self.locator = locator
    }

    mutating func build(_ root: [String: ConfigValue]) -> ConfigDocument {
        checkTopLevelKeys(root)
        var host = readHost(root["host"])
        host.metrics = readMetrics(root["metrics"])
        let strategies = collectStrategies(root["strategy"])
        return ConfigDocument(
            path: path, host: host, hostValues: hostValues(root["host"]), strategies: strategies, problems: problems
        )
    }

    private func hostValues(_ value: ConfigValue?) -> [String: ConfigValue] {
        if case .table(let table)? = value { return table }
        return [:]
    }

    private mutating func problem(_ path: [TOMLPathComponent], _ keyPath: String, _ message: String) {
        problems.append(ConfigProblem(location: locator.location(of: path), keyPath: keyPath, message: message))
    }

    private mutating func checkTopLevelKeys(_ root: [String: ConfigValue]) {
        for key in root.keys.sorted() where !ConfigLoader.topLevelKeys.contains(key) {
            let message: String
            if HostSettings.keyNames.contains(key) {
                message = "\"\(key)\" is a [host] key: move it below a [host] header"
            } else {
                let what: String
                if case .table = root[key] { what = "table" } else { what = "key" }
                let hint = Spelling.suggestion(for: key, among: ConfigLoader.topLevelKeys)
                    .map { " (did you mean \"\($0)\"?)" } ?? ""
                message = "unknown top-level \(what) \"\(key)\"\(hint); a config holds a [host] table, [[strategy]] tables and a [metrics] table"
            }
            problem([.key(key)], key, message)
        }
    }

    private mutating func readHost(_ value: ConfigValue?) -> HostSettings {
        let configDirectory = absoluteDirectory(of: path)
        var settings = HostSettings()
        guard let value else { return settings }
        guard case .table(let table) = value else {
            let hint: String
            if case .array = value { hint = "; write [host] with single brackets, once" } else { hint = "" }
            problem([.key("host")], "host", "expected a table, found \(value.typeName)\(hint)")
            return settings
        }
        let reader = ConfigReader(
            strategyName: "host", keyPath: "host", values: table,
            locations: keyLocations([.key("host")], table), tableLocation: locator.location(of: [.key("host")])
        )
        for key in HostSettings.keys {
            key.read(reader, &settings, configDirectory)
        }
        problems += reader.problems
        problems += unknownKeys(table, known: HostSettings.keyNames, reader: reader)
        return settings
    }

    /// `[metrics]` (docs/metrics.md): where the Prometheus metrics go.
    private mutating func readMetrics(_ value: ConfigValue?) -> MetricsSettings {
        guard let value else { return MetricsSettings() }
        guard case .table(let table) = value else {
            problem([.key("metrics")], "metrics", "expected a table written as a [metrics] section, found \(value.typeName)")
            return MetricsSettings()
        }
        let reader = ConfigReader(
            strategyName: "metrics", keyPath: "metrics", values: table,
            locations: keyLocations([.key("metrics")], table), tableLocation: locator.location(of: [.key("metrics")])
        )
        let settings = MetricsSettings.read(reader, configDirectory: absoluteDirectory(of: path))
        problems += reader.problems
        problems += unknownKeys(table, known: MetricsSettings.keyNames, reader: reader)
        return settings
    }

    private mutating func collectStrategies(_ value: ConfigValue?) -> [StrategyTable] {
        guard let value else { return [] }
        let base: [TOMLPathComponent] = [.key("strategy")]
        guard case .array(let items) = value else {
            if case .table = value {
                problem(base, "strategy", "expected an array of tables: write each strategy as a [[strategy]] section (double brackets), not [strategy]")
            } else {
                problem(base, "strategy", "expected an array of tables written as [[strategy]] sections, found \(value.typeName)")
            }
            return []
        }
        if items.count > ConfigLimits.maxStrategies {
            problem(base, "strategy", "\(items.count) [[strategy]] tables; the limit is \(ConfigLimits.maxStrategies) per file")
            return []
        }
        var tables: [StrategyTable] = []
        for (index, item) in items.enumerated() {
            let path = base + [.index(index)]
            guard case .table(let table) = item else {
                problem(path, "strategy[\(index)]", "expected a table written as a [[strategy]] section, found \(item.typeName)")
                continue
            }
            var nested: [String: ConfigLocation] = [:]
            if case .table(let when)? = table["when"] {
                for (key, location) in keyLocations(path + [.key("when")], when) { nested["when.\(key)"] = location }
            }
            if case .array(let items)? = table["when_any"] {
                for (i, item) in items.enumerated().prefix(ConditionConfig.maxTables) {
                    guard case .table(let t) = item else { continue }
                    for (key, location) in keyLocations(path + [.key("when_any"), .index(i)], t) { nested["when_any[\(i)].\(key)"] = location }
                }
            }
            tables.append(StrategyTable(
                index: index, keyPath: "strategy[\(index)]", values: table,
                location: locator.location(of: path), keyLocations: keyLocations(path, table), nestedLocations: nested
            ))
        }
        return tables
    }

    private func keyLocations(_ table: [TOMLPathComponent], _ values: [String: ConfigValue]) -> [String: ConfigLocation] {
        var out: [String: ConfigLocation] = [:]
        for key in values.keys {
            if let location = locator.exactLocation(of: table + [.key(key)]) { out[key] = location }
        }
        return out
    }

    private func absoluteDirectory(of file: String) -> String {
        let absolute = file.hasPrefix("/") ? file : FileManager.default.currentDirectoryPath + "/" + file
        var parts = absolute.split(separator: "/", omittingEmptySubsequences: true)
        if !parts.isEmpty { parts.removeLast() }
        return ("/" + parts.joined(separator: "/")).standardizedPath
    }
}

/// Problems for keys of `table` that no reader accessor consulted, with a
/// did-you-mean suggestion (or the list of known keys when none is close).
func unknownKeys(_ table: [String: ConfigValue], known: [String], reader: ConfigReader) -> [ConfigProblem] {
    let knownKeys = Set(known).union(reader.consultedKeys)
    let candidates = knownKeys.sorted()
    // In file order: only the first ones can be listed (ConfigError shows
    // at most maxReportedProblems, in file order), so only they get the
    // costly did-you-mean search; 80,000 unknown keys took 16.7 s with it.
    let unknown = table.keys.filter { !knownKeys.contains($0) }.sorted { a, b in
        let la = reader.location(of: a).map { ($0.line, $0.column) } ?? (0, 0)
        let lb = reader.location(of: b).map { ($0.line, $0.column) } ?? (0, 0)
        return la != lb ? la < lb : a < b
    }
    return unknown.enumerated().map { index, key in
        let hint = index >= ConfigLimits.maxReportedProblems ? ""
            : Spelling.suggestion(for: key, among: candidates).map { " (did you mean \"\($0)\"?)" }
                ?? "; known keys: \(candidates.joined(separator: ", "))"
        return ConfigProblem(
            location: reader.location(of: key), keyPath: "\(reader.keyPath).\(key)", message: "unknown key \"\(key)\"\(hint)"
        )
    }
}

/// Validates strategy tables: name, duplicate names, kind, and the kind's own
/// options through a ``ConfigReader``.
private struct StrategyValidator {
    let resolver: any KindResolver
    private var availableKinds: [String]?
    private var resolvedKinds: [String: Result<any StrategyKind, KindResolutionError>] = [:]
    private var firstUseOfName: [String: StrategyTable] = [:]

    init(resolver: any KindResolver) {
        self.resolver = resolver
    }

    mutating func validate(_ table: StrategyTable, problems: inout [ConfigProblem]) -> ConfiguredStrategy? {
        let start = problems.count
        let name = checkName(table, problems: &problems)
        guard let kind = resolveKind(table, problems: &problems) else { return nil }

        let reader = ConfigReader(
            strategyName: name ?? "", keyPath: table.keyPath, values: table.values,
            locations: table.keyLocations, tableLocation: table.location
        )
        // The host's keys: conditions apply to every kind.
        reader.declare("name", "kind", "when", "when_any")
        let conditions = ConditionConfig.read(table, problems: &problems)
        var strategy: (any KeepAliveStrategy)?
        do {
            strategy = try kind.makeStrategy(reader)
        } catch {
            reader.problem(nil, "kind \"\(kind.name)\" could not create the strategy: \(error)")
        }
        problems += reader.problems
        problems += unknownKeys(table.values, known: ["name", "kind", "when", "when_any"], reader: reader)

        guard problems.count == start, let name, let strategy else { return nil }
        return ConfiguredStrategy(
            name: name, kind: kind.name, index: table.index, strategy: strategy, strategyKind: kind,
            values: table.values, location: table.location, conditions: conditions
        )
    }

    /// The name if valid; records missing, mistyped, empty and duplicate names.
    private mutating func checkName(_ table: StrategyTable, problems: inout [ConfigProblem]) -> String? {
        let keyPath = "\(table.keyPath).name"
        guard let value = table.values["name"] else {
            problems.append(ConfigProblem(
                location: table.location, keyPath: keyPath,
                message: "missing required key; expected a unique name for this strategy, e.g. name = \"sync\""
            ))
            return nil
        }
        guard case .string(let name) = value else {
            problems.append(ConfigProblem(
                location: table.location(of: "name"), keyPath: keyPath, message: "expected a string, found \(value.typeName)"
            ))
            return nil
        }
        guard !name.trimmingCharacters(in: .whitespaces).isEmpty else {
            problems.append(ConfigProblem(
                location: table.location(of: "name"), keyPath: keyPath, message: "expected a non-empty name"
            ))
            return nil
        }
        if let reason = StrategyName.problem(name) {
            problems.append(ConfigProblem(location: table.location(of: "name"), keyPath: keyPath, message: reason))
            return nil
        }
        if let first = firstUseOfName[name] {
            let at = first.location(of: "name").map { " at \($0)" } ?? ""
            problems.append(ConfigProblem(
                location: table.location(of: "name"), keyPath: keyPath,
                message: "duplicate strategy name \"\(name)\": already used by \(first.keyPath)\(at); names must be unique"
            ))
            return nil
        }
        firstUseOfName[name] = table
        return name
    }

    /// The kind if it resolves; records missing, mistyped, unknown and
    /// unloadable kinds.
    private mutating func resolveKind(_ table: StrategyTable, problems: inout [ConfigProblem]) -> (any StrategyKind)? {
        let keyPath = "\(table.keyPath).kind"
        let available = availableKinds ?? resolver.availableKinds().sorted()
        availableKinds = available
        let list = available.isEmpty ? "no kinds are available (check plugin_path)" : "available kinds: \(available.joined(separator: ", "))"
        guard let value = table.values["kind"] else {
            problems.append(ConfigProblem(
                location: table.location, keyPath: keyPath, message: "missing required key; expected a strategy kind; \(list)"
            ))
            return nil
        }
        guard case .string(let kindName) = value else {
            problems.append(ConfigProblem(
                location: table.location(of: "kind"), keyPath: keyPath, message: "expected a string, found \(value.typeName)"
            ))
            return nil
        }
        guard available.contains(kindName) else {
            let hint = Spelling.suggestion(for: kindName, among: available).map { " (did you mean \"\($0)\"?)" } ?? ""
            problems.append(ConfigProblem(
                location: table.location(of: "kind"), keyPath: keyPath, message: "unknown kind \"\(kindName)\"\(hint); \(list)"
            ))
            return nil
        }
        let result = resolvedKinds[kindName] ?? resolver.resolve(kind: kindName)
        resolvedKinds[kindName] = result
        switch result {
        case .success(let kind):
            return kind
        case .failure(let error):
            problems.append(ConfigProblem(
                location: table.location(of: "kind"), keyPath: keyPath,
                message: "cannot load kind \"\(kindName)\": \(error.message)"
            ))
            return nil
        }
    }
}
