import Foundation
import VigilKit

/// The validated `[host]` table: settings of the host daemon itself.
///
/// To add a `[host]` key: add a stored property with its default here and one
/// line to ``HostSettings/keys``; validation, unknown-key detection and
/// did-you-mean suggestions follow from that list.
public struct HostSettings: Sendable, Equatable {
    /// Where the survival log and other state live (`state_dir`).
    public var stateDir: String
    /// How often the survival log records a heartbeat (`survival_interval`).
    public var survivalInterval: Duration = .seconds(60)
    /// Extra directories searched for strategy plugins, in order
    /// (`plugin_path`). Empty means only the plugin loader's defaults.
    public var pluginPath: [String] = []
    /// The least severe log level written (`log_level`): the level of
    /// vigild's log handler.
    public var logLevel: Logger.Level = .info
    /// The `log_level` values, syslog's (swift-log's `trace` and `critical`
    /// are written, as debug and crit, but are no threshold of their own).
    public static let logLevels: [Logger.Level] = [.debug, .info, .notice, .warning, .error]
    /// The message bus vigild serves `org.vigil.Vigil1` on (`bus`).
    public var bus: BusSelection = .session
    /// What leases hold on the system (`power`): see ``PowerChoice``.
    public var power: PowerChoice = .auto
    /// Where the kernel's wake lock files are (`wakelock_dir`).
    public var wakelockDir: String = "/sys/power"
    /// Where the kernel lists power supplies, for `ac_power` and
    /// `battery_above` conditions (`power_supply_dir`).
    public var powerSupplyDir: String = "/sys/class/power_supply"
    /// Leases D-Bus clients begin with BeginBackgroundTask (`client_*`).
    public var clientLeases = ClientLeaseSettings()
    /// Runs before the system sleeps, under a logind delay lock (`on_sleep`).
    public var onSleep: [String]? = nil
    /// How long `on_sleep` may run (`on_sleep_timeout`); logind's own limit
    /// (InhibitDelayMaxUSec, 5 s by default) still applies.
    public var onSleepTimeout: Duration = .seconds(5)
    /// Apps' keep-awake requests through the freedesktop inhibit APIs
    /// (`freedesktop_inhibit`, `inhibit_max`, `inhibit_allow`, `inhibit_deny`).
    public var inhibits = InhibitSettings()
    /// Wake, work, sleep again (`return_to_sleep`, `return_to_sleep_grace`):
    /// after vigild's own alarm woke the system and its work is done.
    public var returnToSleep = ReturnToSleepSettings()
    /// Caps and rolling budgets per app, for apps' inhibits and client
    /// leases (`app_max`, `app_budget`).
    public var appLimits = AppLimitSettings()
    /// The `[metrics]` table (its own table, kept here so reload compares it
    /// like a `[host]` key: a change needs a restart).
    public var metrics = MetricsSettings()

    /// The defaults used for keys the config leaves out.
    public init(stateDir: String = HostPaths.defaultStateDir()) {
        self.stateDir = stateDir
    }

    /// Every `[host]` key, in the order they are documented.
    static var keys: [HostKey] {
        [
            .path("state_dir", \.stateDir),
            .duration("survival_interval", \.survivalInterval, atLeast: .seconds(1)),
            .pathList("plugin_path", \.pluginPath),
            .choice("log_level", \.logLevel, HostSettings.logLevels, spelled: \.rawValue),
            .busSelection("bus", \.bus),
            .choice("power", \.power, PowerChoice.allCases, spelled: \.rawValue),
            .path("wakelock_dir", \.wakelockDir),
            .path("power_supply_dir", \.powerSupplyDir),
            .flag("client_leases", \.clientLeases.enabled),
            .count("client_max_leases_per_uid", \.clientLeases.maxLeasesPerUID, range: 1...100_000),
            .duration("client_max_budget_per_uid", \.clientLeases.maxBudgetPerUID, atLeast: .seconds(1)),
            .duration("client_grace", \.clientLeases.grace, atLeast: .zero),
            .argv("on_sleep", \.onSleep),
            .duration("on_sleep_timeout", \.onSleepTimeout, atLeast: .milliseconds(1)),
            .choice("freedesktop_inhibit", \.inhibits.mode, InhibitSettings.Mode.allCases, spelled: \.rawValue),
            .duration("inhibit_max", \.inhibits.maxDuration, atLeast: .seconds(1)),
            .patterns("inhibit_allow", \.inhibits.allow),
            .patterns("inhibit_deny", \.inhibits.deny),
            .flag("return_to_sleep", \.returnToSleep.enabled),
            .duration("return_to_sleep_grace", \.returnToSleep.grace, atLeast: .zero),
            .limitsByPattern("app_max", \.appLimits.caps),
            .limitsByPattern("app_budget", \.appLimits.budgets),
        ]
    }

    static var keyNames: [String] { keys.map(\.name) }
}

/// How one `[host]` key is read: its name and a function that reads it
/// through a ``ConfigReader`` (which records problems) into the settings.
struct HostKey {
    let name: String
    /// Reads the key if present; `configDirectory` anchors relative paths.
    let read: (_ reader: ConfigReader, _ settings: inout HostSettings, _ configDirectory: String) -> Void

    /// A directory path: `~/` is the home directory, a relative path is
    /// relative to the directory holding the config file.
    static func path(_ name: String, _ field: WritableKeyPath<HostSettings, String>) -> HostKey {
        HostKey(name: name) { reader, settings, directory in
            guard let text = reader.string(name) else { return }
            guard !text.trimmingCharacters(in: .whitespaces).isEmpty else {
                reader.problem(name, "expected a directory path, found an empty string")
                return
            }
            settings[keyPath: field] = resolvePath(text, relativeTo: directory)
        }
    }

    /// One directory path or an array of them.
    static func pathList(_ name: String, _ field: WritableKeyPath<HostSettings, [String]>) -> HostKey {
        HostKey(name: name) { reader, settings, directory in
            let texts: [String]
            if case .string(let one)? = reader.values[name] {
                reader.declare(name)
                texts = [one]
            } else {
                guard let many = reader.stringArray(name) else { return }
                texts = many
            }
            if let empty = texts.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces).isEmpty }) {
                reader.problem(name, texts.count == 1 && reader.values[name].map(isString) == true
                    ? "expected a directory path, found an empty string"
                    : "element \(empty): expected a directory path, found an empty string")
                return
            }
            settings[keyPath: field] = texts.map { resolvePath($0, relativeTo: directory) }
        }
    }

    /// A duration of at least `minimum`.
    static func duration(_ name: String, _ field: WritableKeyPath<HostSettings, Duration>, atLeast minimum: Duration) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            guard let value = reader.duration(name) else { return }
            guard value >= minimum else {
                reader.problem(name, "expected a duration of at least \(DurationSyntax.format(minimum)), found \"\(DurationSyntax.format(value))\"")
                return
            }
            settings[keyPath: field] = value
        }
    }

    /// One of a fixed set of names.
    static func choice<Value>(
        _ name: String, _ field: WritableKeyPath<HostSettings, Value>, _ cases: [Value], spelled: (Value) -> String
    ) -> HostKey {
        let names = cases.map(spelled)
        return HostKey(name: name) { reader, settings, _ in
            guard reader.values[name] != nil else { reader.declare(name); return }
            let chosen = reader.choice(name, names, default: "")
            if let index = names.firstIndex(of: chosen) { settings[keyPath: field] = cases[index] }
        }
    }

    /// `"session"`, `"system"` or a D-Bus address (`transport:key=value,...`).
    static func busSelection(_ name: String, _ field: WritableKeyPath<HostSettings, BusSelection>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            guard let text = reader.string(name) else { return }
            guard let selection = BusSelection(parsing: text) else {
                reader.problem(name, "expected \"session\", \"system\" or a D-Bus address such as \"unix:path=/run/vigil/bus\" (transport:key=value,...), found \"\(text)\"")
                return
            }
            settings[keyPath: field] = selection
        }
    }

    /// An integer within `range`.
    static func count(_ name: String, _ field: WritableKeyPath<HostSettings, Int>, range: ClosedRange<Int64>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            guard reader.values[name] != nil else { reader.declare(name); return }
            let value = reader.integer(name, default: Int64(settings[keyPath: field]), range: range)
            settings[keyPath: field] = Int(value)
        }
    }

    /// A command as an argv array (`["/usr/bin/backup", "--quick"]`).
    static func argv(_ name: String, _ field: WritableKeyPath<HostSettings, [String]?>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            if let argv = reader.argv(name) { settings[keyPath: field] = argv }
        }
    }

    /// A boolean.
    static func flag(_ name: String, _ field: WritableKeyPath<HostSettings, Bool>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            if let value = reader.bool(name) { settings[keyPath: field] = value }
        }
    }

    /// A list of shell patterns (fnmatch), each non-empty and at most 256 bytes.
    static func patterns(_ name: String, _ field: WritableKeyPath<HostSettings, [String]>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            guard let patterns = reader.stringArray(name) else { return }
            if let bad = patterns.firstIndex(where: { $0.isEmpty || $0.utf8.count > 256 }) {
                reader.problem(name, "element \(bad): expected a shell pattern of 1 to 256 bytes such as \"firefox*\" or \"/usr/bin/*\"")
                return
            }
            settings[keyPath: field] = patterns
        }
    }

    /// Durations by shell pattern: a table such as `{ "mpv" = "3h",
    /// "*chat*" = "5m" }`, or one duration for every app (`"6h"`, the
    /// pattern `"*"`). Each pattern 1 to 256 bytes, each duration at least 1 s.
    static func limitsByPattern(_ name: String, _ field: WritableKeyPath<HostSettings, [AppLimitRule]>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            let entries: [(String, ConfigValue)]
            switch reader.values[name] {
            case nil:
                reader.declare(name)
                return
            case .string(let one)?:
                reader.declare(name)
                entries = [("*", .string(one))]
            default:
                guard let table = reader.table(name) else { return }
                entries = table.sorted { $0.key < $1.key }
            }
            var rules: [AppLimitRule] = []
            var bad = false
            for (pattern, value) in entries {
                let quoted = "\"\(ClientText.excerpt(pattern))\""
                guard !pattern.isEmpty, pattern.utf8.count <= 256 else {
                    reader.problem(name, "pattern \(quoted): expected a shell pattern of 1 to 256 bytes such as \"firefox*\" or \"/usr/bin/*\"")
                    bad = true
                    continue
                }
                guard case .string(let text) = value else {
                    reader.problem(name, "pattern \(quoted): expected a duration such as \"3h\" or \"5m\", found \(value.typeName)")
                    bad = true
                    continue
                }
                switch DurationSyntax.parse(text) {
                case .failure(let error):
                    reader.problem(name, "pattern \(quoted): \(error.message)")
                    bad = true
                case .success(let limit) where limit < .seconds(1):
                    reader.problem(name, "pattern \(quoted): expected a duration of at least 1s, found \"\(DurationSyntax.format(limit))\"")
                    bad = true
                case .success(let limit):
                    rules.append(AppLimitRule(pattern, limit))
                }
            }
            if !bad { settings[keyPath: field] = rules }
        }
    }

    /// A byte size such as `"64MiB"` (for later keys).
    static func byteSize(_ name: String, _ field: WritableKeyPath<HostSettings, Int64>) -> HostKey {
        HostKey(name: name) { reader, settings, _ in
            if let value = reader.byteSize(name) { settings[keyPath: field] = value }
        }
    }
}

private func isString(_ value: ConfigValue) -> Bool {
    if case .string = value { return true }
    return false
}

/// Expands `~` and anchors a relative path at `directory`.
func resolvePath(_ text: String, relativeTo directory: String) -> String {
    if text == "~" || text.hasPrefix("~/") {
        let home = ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory()
        return (home + text.dropFirst()).standardizedPath
    }
    if text.hasPrefix("/") { return text.standardizedPath }
    return (directory + "/" + text).standardizedPath
}

extension String {
    /// Removes `.` and `..` components and duplicate slashes, lexically
    /// (symlinks are left alone).
    var standardizedPath: String {
        var parts: [Substring] = []
        for part in split(separator: "/", omittingEmptySubsequences: true) {
            if part == "." { continue }
            if part == ".." {
                if !parts.isEmpty { parts.removeLast() }
                continue
            }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }
}
