import Foundation
import Testing
import VigilKit
@testable import VigilHost

// MARK: test kinds

/// Stands in for the real periodic-wake plugin: same kind name, option names
/// and option types, so the fixtures also fit an end-to-end check with the
/// real plugin (`vigilctl check-config`).
struct TestWakeKind: StrategyKind {
    var name: String { "periodic-wake" }
    var summary: String { "test stand-in for periodic-wake" }

    func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let every = config.requirePositiveDuration("every")
        config.declare("align")
        var align: Duration?
        switch config.values["align"] {
        case nil, .boolean(false): align = nil
        case .boolean(true): align = every
        case .string: align = config.positiveDuration("align")
        case let other?: config.problem("align", "expected true, false or a slot duration, found \(other.typeName)")
        }
        return TestWakeStrategy(
            every: every,
            tolerance: config.duration("tolerance", default: every / 10),
            align: align,
            wakeSystem: config.bool("wake_system", default: false),
            catchUp: config.choice("catch_up", ["skip", "once", "all"], default: "once"),
            run: config.requireArgv("run"),
            runTimeout: config.positiveDuration("run_timeout", default: .seconds(30))
        )
    }
}

struct TestWakeStrategy: KeepAliveStrategy {
    var every: Duration
    var tolerance: Duration
    var align: Duration?
    var wakeSystem: Bool
    var catchUp: String
    var run: [String]
    var runTimeout: Duration

    func run(in context: StrategyContext) async throws {}
}

/// A second kind: a required string and a byte size; throws on request, to
/// test failures that are not about the config.
struct TestEchoKind: StrategyKind {
    struct Refused: Error, CustomStringConvertible {
        var description: String { "the echo device is busy" }
    }

    var name: String { "test-echo" }
    var summary: String { "echoes a message" }

    func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let message = config.requireString("message")
        let buffer = config.byteSize("buffer", default: 4096)
        if message == "refuse" { throw Refused() }
        return TestEchoStrategy(message: message, buffer: buffer)
    }
}

struct TestEchoStrategy: KeepAliveStrategy {
    var message: String
    var buffer: Int64
    func run(in context: StrategyContext) async throws {}
}

/// Resolves the test kinds from memory; `broken` kinds are listed but fail to load.
struct TestResolver: KindResolver {
    var kinds: [any StrategyKind] = [TestWakeKind(), TestEchoKind()]
    var broken: [String: String] = [:]

    func availableKinds() -> [String] { kinds.map(\.name) + broken.keys }

    func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError> {
        if let message = broken[kind] { return .failure(KindResolutionError(message)) }
        if let found = kinds.first(where: { $0.name == kind }) { return .success(found) }
        return .failure(KindResolutionError("no such kind"))
    }
}

// MARK: helpers

enum Fixtures {
    static let configs = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/configs")

    static func bad(_ name: String) -> String { configs.appendingPathComponent("bad/\(name).toml").path }
    static func good(_ name: String) -> String { configs.appendingPathComponent("good/\(name).toml").path }

    static func names(in folder: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: configs.appendingPathComponent(folder).path)
            .filter { $0.hasSuffix(".toml") }.map { String($0.dropLast(5)) }.sorted()
    }

    /// The substring the fixture's first line promises: `# expect: <substring>`.
    static func expectation(of path: String) throws -> String {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let first = text.split(separator: "\n", omittingEmptySubsequences: false).first ?? ""
        let prefix = "# expect: "
        guard first.hasPrefix(prefix) else { return "" }
        return String(first.dropFirst(prefix.count))
    }
}

/// Writes `text` to a config file in a fresh temporary directory.
final class TempConfig {
    let directory: String
    let path: String

    init(_ text: String, name: String = "vigil.toml") throws {
        directory = NSTemporaryDirectory() + "vigil-config-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = directory + "/" + name
        try text.write(toFile: path, atomically: true, encoding: .utf8)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }
}

func loadProblems(_ path: String, resolver: any KindResolver = TestResolver()) -> ConfigError? {
    do {
        _ = try ConfigLoader.load(path: path, resolver: resolver)
        return nil
    } catch {
        return error
    }
}

func load(_ path: String, resolver: any KindResolver = TestResolver()) throws -> VigilConfig {
    try ConfigLoader.load(path: path, resolver: resolver)
}

// MARK: bad fixtures

struct ExpectedProblem: CustomTestStringConvertible, Sendable {
    var fixture: String
    var keyPath: String
    var line: Int
    var column: Int
    var message: String

    var testDescription: String { fixture }
}

@Suite("Config")
struct ConfigTests {
    /// Every single-problem bad fixture: where the problem is and what it says.
    static let badFixtures: [ExpectedProblem] = [
        .init(fixture: "syntax-error", keyPath: "", line: 8, column: 7,
              message: "invalid TOML: Error while parsing key-value pair: expected '=', saw '\"'"),
        .init(fixture: "strategy-wrong-type", keyPath: "strategy[0].wake_system", line: 6, column: 1,
              message: "expected a boolean (true or false), found a string"),
        .init(fixture: "host-wrong-type", keyPath: "host.survival_interval", line: 3, column: 1,
              message: "expected a duration such as \"90s\" or \"1h30m\", found a boolean"),
        .init(fixture: "host-unknown-key", keyPath: "host.survival_intervall", line: 4, column: 1,
              message: "unknown key \"survival_intervall\" (did you mean \"survival_interval\"?)"),
        .init(fixture: "strategy-unknown-key", keyPath: "strategy[0].wake_sytem", line: 6, column: 1,
              message: "unknown key \"wake_sytem\" (did you mean \"wake_system\"?)"),
        .init(fixture: "unknown-kind", keyPath: "strategy[0].kind", line: 4, column: 1,
              message: "unknown kind \"periodic-wak\" (did you mean \"periodic-wake\"?); available kinds: periodic-wake, test-echo"),
        .init(fixture: "negative-duration", keyPath: "strategy[0].every", line: 5, column: 1,
              message: "expected a non-negative duration, found \"-5m\""),
        .init(fixture: "nonsense-duration", keyPath: "strategy[0].every", line: 5, column: 1,
              message: "expected a duration such as \"90s\", \"25m\" or \"1h30m\", found \"soon\""),
        .init(fixture: "unknown-duration-unit", keyPath: "strategy[0].every", line: 5, column: 1,
              message: "unknown unit \"min\" in \"5min\" (units: d, h, m, s, ms, us, ns)"),
        .init(fixture: "duplicate-names", keyPath: "strategy[1].name", line: 9, column: 1,
              message: "duplicate strategy name \"tick\": already used by strategy[0] at \(Fixtures.bad("duplicate-names")):3:1; names must be unique"),
        .init(fixture: "empty-argv", keyPath: "strategy[0].run", line: 6, column: 1,
              message: "expected a non-empty argv array whose first element names the program"),
        .init(fixture: "argv-as-string", keyPath: "strategy[0].run", line: 6, column: 1,
              message: "expected an argv array such as [\"/usr/bin/true\"], found a string; write [\"sh\", \"-c\", \"echo hello\"] to use a shell"),
        .init(fixture: "missing-name", keyPath: "strategy[0].name", line: 2, column: 1,
              message: "missing required key; expected a unique name for this strategy, e.g. name = \"sync\""),
        .init(fixture: "missing-kind", keyPath: "strategy[0].kind", line: 2, column: 1,
              message: "missing required key; expected a strategy kind; available kinds: periodic-wake, test-echo"),
        .init(fixture: "empty-name", keyPath: "strategy[0].name", line: 3, column: 1,
              message: "expected a non-empty name"),
        .init(fixture: "reserved-name", keyPath: "strategy[0].name", line: 3, column: 1,
              message: "\"client\" is reserved: vigild shows the leases D-Bus clients begin (BeginBackgroundTask) as strategy \"client\" and applications' inhibits as \"inhibit\"; choose another name"),
        .init(fixture: "strategy-single-brackets", keyPath: "strategy", line: 2, column: 1,
              message: "expected an array of tables: write each strategy as a [[strategy]] section (double brackets), not [strategy]"),
        .init(fixture: "strategy-not-table", keyPath: "strategy[0]", line: 2, column: 13,
              message: "expected a table written as a [[strategy]] section, found a string"),
        .init(fixture: "unknown-top-level-table", keyPath: "hosts", line: 2, column: 1,
              message: "unknown top-level table \"hosts\" (did you mean \"host\"?); a config holds a [host] table, [[strategy]] tables and a [metrics] table"),
        .init(fixture: "host-key-at-top-level", keyPath: "state_dir", line: 2, column: 1,
              message: "\"state_dir\" is a [host] key: move it below a [host] header"),
        .init(fixture: "survival-interval-too-short", keyPath: "host.survival_interval", line: 3, column: 1,
              message: "expected a duration of at least 1s, found \"500ms\""),
        .init(fixture: "bad-log-level", keyPath: "host.log_level", line: 3, column: 1,
              message: "expected one of \"debug\", \"info\", \"notice\", \"warning\", \"error\", found \"verbose\""),
    ]

    @Test("a bad fixture reports its one problem with file:line:column", arguments: badFixtures)
    func badFixture(_ expected: ExpectedProblem) throws {
        let path = Fixtures.bad(expected.fixture)
        let error = try #require(loadProblems(path))
        #expect(error.path == path)
        try #require(error.problems.count == 1, "\(error)")
        let problem = error.problems[0]
        #expect(problem.keyPath == expected.keyPath)
        #expect(problem.message.hasPrefix(expected.message), "\(problem.message)")
        #expect(problem.location == ConfigLocation(file: path, line: expected.line, column: expected.column))
        // The fixture's own promise, which an end-to-end test reuses.
        let promise = try Fixtures.expectation(of: path)
        #expect(!promise.isEmpty)
        #expect(error.description.contains(promise), "\(error)")
    }

    @Test("every bad fixture is covered and fails with its promised message")
    func everyBadFixtureIsChecked() throws {
        let names = try Fixtures.names(in: "bad")
        let covered = Set(Self.badFixtures.map(\.fixture)).union(["multiple-problems"])
        #expect(Set(names) == covered)
        for name in names {
            let path = Fixtures.bad(name)
            let error = try #require(loadProblems(path), "\(name) loaded")
            #expect(error.description.contains(try Fixtures.expectation(of: path)), "\(name): \(error)")
        }
    }

    @Test("one run reports every problem of the file, in file order")
    func multipleProblems() throws {
        let path = Fixtures.bad("multiple-problems")
        let error = try #require(loadProblems(path))
        let seen = error.problems.map { "\($0.location?.line ?? 0):\($0.location?.column ?? 0) \($0.keyPath)" }
        #expect(seen == [
            "4:1 host.survival_interval",
            "5:1 host.log_levl",
            "10:1 strategy[0].every",
            "11:1 strategy[0].run",
            "14:1 strategy[1].name",
            "15:1 strategy[1].kind",
            "19:1 strategy[2].name",
            "22:1 strategy[2].wake_sytem",
        ])
        let messages = error.problems.map(\.message)
        #expect(messages[0] == "expected a non-negative duration, found \"-1m\"")
        #expect(messages[1] == "unknown key \"log_levl\" (did you mean \"log_level\"?)")
        #expect(messages[4].hasPrefix("duplicate strategy name \"tick\": already used by strategy[0] at \(path):8:1"))
        #expect(messages[5].hasPrefix("unknown kind \"periodic-wak\" (did you mean \"periodic-wake\"?)"))
        #expect(messages[7] == "unknown key \"wake_sytem\" (did you mean \"wake_system\"?)")
        #expect(error.description.hasSuffix("\n8 problems in \(path)"))
    }

    @Test("ConfigError's text: one file:line:col: key: message line per problem, then the count")
    func errorDescription() throws {
        let path = Fixtures.bad("negative-duration")
        let error = try #require(loadProblems(path))
        #expect(error.description == """
            \(path):5:1: strategy[0].every: expected a non-negative duration, found "-5m"
            1 problem in \(path)
            """)
    }

    // MARK: files that cannot be read

    @Test("a missing file is one problem naming the file and the errno text")
    func missingFile() throws {
        let path = NSTemporaryDirectory() + "vigil-no-such-config-\(UUID().uuidString).toml"
        let error = try #require(loadProblems(path))
        #expect(error.problems.count == 1)
        #expect(error.problems[0].location == nil)
        #expect(error.description == """
            \(path): cannot open config file: No such file or directory
            1 problem in \(path)
            """)
    }

    @Test("a directory given as the config file is reported as such")
    func directoryAsFile() throws {
        let temp = try TempConfig("")
        let error = try #require(loadProblems(temp.directory))
        #expect(error.problems.map(\.message) == ["cannot read config file: Is a directory"])
    }

    @Test("invalid UTF-8 is reported, not crashed on")
    func invalidUTF8() throws {
        let temp = try TempConfig("")
        try Data([0x5B, 0x68, 0xFF, 0x5D, 0x0A]).write(to: URL(fileURLWithPath: temp.path))
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.map(\.message) == ["config file is not valid UTF-8 text"])
    }

    // MARK: good fixtures

    @Test("every good fixture loads")
    func everyGoodFixtureLoads() throws {
        for name in try Fixtures.names(in: "good") {
            #expect(throws: Never.self, "\(name)") { try load(Fixtures.good(name)) }
        }
    }

    @Test("the minimal fixture: one strategy, host defaults")
    func minimalFixture() throws {
        let config = try load(Fixtures.good("minimal"))
        #expect(config.host == HostSettings())
        #expect(config.host.survivalInterval == .seconds(60))
        #expect(config.host.logLevel == .info)
        #expect(config.host.stateDir == HostPaths.defaultStateDir())
        #expect(config.notes.isEmpty)
        try #require(config.strategies.count == 1)
        let tick = config.strategies[0]
        #expect(tick.name == "tick")
        #expect(tick.kind == "periodic-wake")
        #expect(tick.index == 0)
        #expect(tick.location?.line == 2)
        #expect(tick.values["every"] == .string("5m"))
        let strategy = try #require(tick.strategy as? TestWakeStrategy)
        #expect(strategy.every == .seconds(300))
        #expect(strategy.tolerance == .seconds(30))
        #expect(strategy.align == nil)
        #expect(strategy.run == ["/bin/true"])
    }

    @Test("the full fixture: every host key, multi-line arrays, quoted keys")
    func fullFixture() throws {
        let path = Fixtures.good("full")
        let config = try load(path)
        let directory = Fixtures.configs.appendingPathComponent("good").path
        #expect(config.host.stateDir == "/tmp/vigil-fixture-state")
        #expect(config.host.survivalInterval == .seconds(30))
        #expect(config.host.pluginPath == ["/usr/local/lib/vigil", directory + "/plugins"])
        #expect(config.host.logLevel == .debug)
        #expect(config.strategies.map(\.name) == ["sync", "heartbeat"])
        #expect(config.strategies.map(\.index) == [0, 1])
        let sync = try #require(config.strategies[0].strategy as? TestWakeStrategy)
        #expect(sync.every == .seconds(900))
        #expect(sync.tolerance == .seconds(30))
        #expect(sync.catchUp == "all")
        #expect(!sync.wakeSystem)
        #expect(sync.run == ["/usr/bin/env", "echo", "sync [not a table] = still a string"])
        #expect(sync.runTimeout == .seconds(20))
        let heartbeat = try #require(config.strategies[1].strategy as? TestWakeStrategy)
        #expect(heartbeat.every == .seconds(90))
        #expect(heartbeat.align == .seconds(90))
        #expect(config.strategies[1].values["every"] == .integer(90))
    }

    @Test("a config without strategies runs idle, with a note")
    func idleConfig() throws {
        let idle = try load(Fixtures.good("idle"))
        #expect(idle.strategies.isEmpty)
        #expect(idle.host.pluginPath == ["/opt/vigil/plugins"])
        #expect(idle.notes.count == 1)
        #expect(idle.notes[0].contains("the host will run idle"))
        let empty = try load(Fixtures.good("empty"))
        #expect(empty.host == HostSettings())
        #expect(empty.notes.count == 1)
    }

    // MARK: host keys

    @Test("relative paths are relative to the config file, ~ is the home directory")
    func pathResolution() throws {
        let temp = try TempConfig("""
            [host]
            state_dir = "state/../vigil-state"
            plugin_path = ["~/vigil/plugins", "./lib//plugins/"]
            """)
        let config = try load(temp.path)
        let home = ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory()
        #expect(config.host.stateDir == temp.directory + "/vigil-state")
        #expect(config.host.pluginPath == [home + "/vigil/plugins", temp.directory + "/lib/plugins"])
    }

    @Test("host values of the wrong type or shape", arguments: [
        ("state_dir = 5", "host.state_dir", "expected a string, found an integer"),
        ("state_dir = \"\"", "host.state_dir", "expected a directory path, found an empty string"),
        ("plugin_path = [\"/a\", 5]", "host.plugin_path", "element 1 : expected a string, found an integer"),
        ("plugin_path = [\"/a\", \"\"]", "host.plugin_path", "element 1: expected a directory path, found an empty string"),
        ("plugin_path = \"\"", "host.plugin_path", "expected a directory path, found an empty string"),
        ("plugin_path = { a = 1 }", "host.plugin_path", "expected an array of strings, found a table"),
        ("log_level = 3", "host.log_level", "expected a string, found an integer"),
        ("log_level = \"warnig\"", "host.log_level", "expected one of \"debug\", \"info\", \"notice\", \"warning\", \"error\", found \"warnig\" (did you mean \"warning\"?)"),
        ("survival_interval = -5", "host.survival_interval", "expected a non-negative duration, found -5"),
        ("survival_interval = \"0s\"", "host.survival_interval", "expected a duration of at least 1s, found \"0s\""),
        ("client_max_leases_per_uid = 0", "host.client_max_leases_per_uid", "expected an integer in 1...100000, found 0"),
        ("client_max_budget_per_uid = \"0s\"", "host.client_max_budget_per_uid", "expected a duration of at least 1s, found \"0s\""),
        ("client_leases = \"yes\"", "host.client_leases", "expected a boolean (true or false), found a string"),
        ("on_sleep = \"pause-sync\"", "host.on_sleep", "expected an argv array such as [\"/usr/bin/true\"], found a string; write [\"sh\", \"-c\", \"pause-sync\"] to use a shell"),
        ("freedesktop_inhibit = \"of\"", "host.freedesktop_inhibit", "expected one of \"auto\", \"off\", found \"of\" (did you mean \"off\"?)"),
        ("inhibit_max = \"0s\"", "host.inhibit_max", "expected a duration of at least 1s, found \"0s\""),
        ("inhibit_deny = [\"firefox*\", \"\"]", "host.inhibit_deny", "element 1: expected a shell pattern of 1 to 256 bytes such as \"firefox*\" or \"/usr/bin/*\""),
        ("inhibit_allow = \"mpv\"", "host.inhibit_allow", "expected an array of strings, found a string"),
        ("app_max = { \"mpv\" = \"3x\" }", "host.app_max", "pattern \"mpv\": unknown unit \"x\" in \"3x\" (units: d, h, m, s, ms, us, ns)"),
        ("app_max = { \"\" = \"1h\" }", "host.app_max", "pattern \"\": expected a shell pattern of 1 to 256 bytes such as \"firefox*\" or \"/usr/bin/*\""),
        ("app_max = { \"mpv\" = 5 }", "host.app_max", "pattern \"mpv\": expected a duration such as \"3h\" or \"5m\", found an integer"),
        ("app_max = [\"mpv\"]", "host.app_max", "expected a table, found an array"),
        ("app_budget = \"500ms\"", "host.app_budget", "pattern \"*\": expected a duration of at least 1s, found \"500ms\""),
        ("colour = \"red\"", "host.colour", "unknown key \"colour\"; known keys: app_budget, app_max, bus, client_grace, client_leases, client_max_budget_per_uid, client_max_leases_per_uid, freedesktop_inhibit, inhibit_allow, inhibit_deny, inhibit_max, log_level, on_sleep, on_sleep_timeout, plugin_path, power, power_supply_dir, return_to_sleep, return_to_sleep_grace, state_dir, survival_interval, wakelock_dir"),
    ])
    func hostProblems(_ line: String, _ keyPath: String, _ message: String) throws {
        let temp = try TempConfig("[host]\n\(line)\n")
        let error = try #require(loadProblems(temp.path))
        try #require(error.problems.count == 1, "\(error)")
        #expect(error.problems[0].keyPath == keyPath)
        #expect(error.problems[0].message == message)
        #expect(error.problems[0].location == ConfigLocation(file: temp.path, line: 2, column: 1))
    }

    @Test("[host] must be a table")
    func hostNotATable() throws {
        let temp = try TempConfig("[[host]]\nlog_level = \"info\"\n")
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.map(\.message) == ["expected a table, found an array; write [host] with single brackets, once"])
        #expect(error.problems.first?.location?.line == 1)
    }

    @Test("loadDocument reads [host] before any kind is known and keeps its problems for validate")
    func documentBeforeKinds() throws {
        let temp = try TempConfig("""
            [host]
            plugin_path = "/opt/plugins"
            log_level = "loud"

            [[strategy]]
            name = "later"
            kind = "loaded-later"
            option = 1
            """)
        let document = try ConfigLoader.loadDocument(path: temp.path)
        #expect(document.host.pluginPath == ["/opt/plugins"])
        #expect(document.host.logLevel == .info)  // the default stands in for the bad value
        #expect(!document.isHostValid)
        #expect(document.problems.map(\.keyPath) == ["host.log_level"])
        #expect(document.strategies.map(\.kind) == ["loaded-later"])
        #expect(document.strategies[0].location(of: "option") == ConfigLocation(file: temp.path, line: 8, column: 1))

        // Once the kind can be resolved, validate reports host and strategy problems together.
        struct LaterKind: StrategyKind {
            var name: String { "loaded-later" }
            var summary: String { "" }
            func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
                _ = config.string("option")
                return TestEchoStrategy(message: "", buffer: 0)
            }
        }
        let result = ConfigLoader.validate(document, resolver: TestResolver(kinds: [LaterKind()]))
        let error = try #require(result.failure)
        #expect(error.problems.map(\.keyPath) == ["host.log_level", "strategy[0].option"])
        #expect(error.problems[1].message == "expected a string, found an integer")
    }

    // MARK: kinds

    @Test("a kind that is listed but fails to load reports the resolver's message at the kind key")
    func kindResolutionFailure() throws {
        let temp = try TempConfig("""
            [[strategy]]
            name = "audio"
              kind = "silent-audio"
            """)
        let resolver = TestResolver(broken: ["silent-audio": "libvigil-silent-audio.so was built with SDK 2; this host has SDK 1"])
        let error = try #require(loadProblems(temp.path, resolver: resolver))
        #expect(error.problems.count == 1)
        #expect(error.problems[0].keyPath == "strategy[0].kind")
        #expect(error.problems[0].message == "cannot load kind \"silent-audio\": libvigil-silent-audio.so was built with SDK 2; this host has SDK 1")
        #expect(error.problems[0].location == ConfigLocation(file: temp.path, line: 3, column: 3))
    }

    @Test("an unknown kind far from every known one lists the kinds without a guess")
    func unknownKindWithoutSuggestion() throws {
        let temp = try TempConfig("[[strategy]]\nname = \"x\"\nkind = \"teleport\"\n")
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.map(\.message) == ["unknown kind \"teleport\"; available kinds: periodic-wake, test-echo"])
    }

    @Test("with no kinds available, the message points at plugin_path")
    func noKindsAvailable() throws {
        let temp = try TempConfig("[[strategy]]\nname = \"x\"\nkind = \"periodic-wake\"\n")
        let error = try #require(loadProblems(temp.path, resolver: TestResolver(kinds: [])))
        #expect(error.problems.map(\.message) == ["unknown kind \"periodic-wake\"; no kinds are available (check plugin_path)"])
    }

    @Test("a strategy with an unknown kind still gets its name checked")
    func unknownKindStillChecksNames() throws {
        let temp = try TempConfig("""
            [[strategy]]
            name = "a"
            kind = "test-echo"
            message = "hi"

            [[strategy]]
            name = "a"
            kind = "nope"
            """)
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.map(\.keyPath) == ["strategy[1].name", "strategy[1].kind"])
    }

    @Test("makeStrategy throwing is a problem on the table")
    func makeStrategyThrows() throws {
        let temp = try TempConfig("""
            [[strategy]]
            name = "echo"
            kind = "test-echo"
            message = "refuse"
            """)
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.count == 1)
        #expect(error.problems[0].keyPath == "strategy[0]")
        #expect(error.problems[0].message == "kind \"test-echo\" could not create the strategy: the echo device is busy")
        #expect(error.problems[0].location == ConfigLocation(file: temp.path, line: 1, column: 1))
    }

    @Test("each kind is resolved once however many strategies use it")
    func kindResolvedOnce() throws {
        final class CountingResolver: KindResolver {
            var resolutions: [String] = []
            func availableKinds() -> [String] { ["test-echo"] }
            func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError> {
                resolutions.append(kind)
                return .success(TestEchoKind())
            }
        }
        let temp = try TempConfig((1...3).map { "[[strategy]]\nname = \"e\($0)\"\nkind = \"test-echo\"\nmessage = \"m\"\n" }.joined())
        let resolver = CountingResolver()
        let config = try load(temp.path, resolver: resolver)
        #expect(config.strategies.map(\.name) == ["e1", "e2", "e3"])
        #expect(resolver.resolutions == ["test-echo"])
    }

    @Test("byte sizes use the SDK syntax")
    func byteSizes() throws {
        let good = try TempConfig("[[strategy]]\nname = \"e\"\nkind = \"test-echo\"\nmessage = \"m\"\nbuffer = \"64KiB\"\n")
        let echo = try #require(try load(good.path).strategies.first?.strategy as? TestEchoStrategy)
        #expect(echo.buffer == 65536)
        let bad = try TempConfig("[[strategy]]\nname = \"e\"\nkind = \"test-echo\"\nmessage = \"m\"\nbuffer = \"-1MB\"\n")
        let error = try #require(loadProblems(bad.path))
        #expect(error.problems.map(\.description) == ["\(bad.path):5:1: strategy[0].buffer: expected a non-negative byte size, found \"-1MB\""])
    }

    @Test("a strategy written as an inline array of tables is located element by element")
    func inlineStrategies() throws {
        let temp = try TempConfig("""
            strategy = [
              { name = "a", kind = "test-echo", message = "m" },
              { name = "b", kind = "test-echo", mesage = "m" },
            ]
            """)
        let error = try #require(loadProblems(temp.path))
        #expect(error.problems.map(\.description) == [
            "\(temp.path):3:3: strategy[1].message: missing required key; expected a string",
            "\(temp.path):3:37: strategy[1].mesage: unknown key \"mesage\" (did you mean \"message\"?)",
        ])
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}

// MARK: source locator

@Suite("Config source locator")
struct ConfigSourceLocatorTests {
    func locate(_ text: String) -> SourceLocator { SourceLocator(text: text, file: "t.toml") }

    func at(_ line: Int, _ column: Int) -> ConfigLocation { ConfigLocation(file: "t.toml", line: line, column: column) }

    @Test("headers, array-of-tables indexes and their sub-tables")
    func headers() {
        let locator = locate("""
            [host]
            a = 1
            [[strategy]]
            name = "x"
              [[strategy]]
            name = "y"
            [strategy.env]
            HOME = "/root"
            [ "quoted table" . inner ]
            k = 1
            """)
        #expect(locator.exactLocation(of: [.key("host")]) == at(1, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("a")]) == at(2, 1))
        #expect(locator.exactLocation(of: [.key("strategy"), .index(0)]) == at(3, 1))
        #expect(locator.exactLocation(of: [.key("strategy"), .index(1)]) == at(5, 3))
        #expect(locator.exactLocation(of: [.key("strategy"), .index(1), .key("name")]) == at(6, 1))
        #expect(locator.exactLocation(of: [.key("strategy"), .index(1), .key("env")]) == at(7, 1))
        #expect(locator.exactLocation(of: [.key("strategy"), .index(1), .key("env"), .key("HOME")]) == at(8, 1))
        #expect(locator.exactLocation(of: [.key("quoted table"), .key("inner"), .key("k")]) == at(10, 1))
    }

    @Test("dotted, quoted and escaped keys")
    func keys() {
        let locator = locate("""
            [host]
            wake.every = "1s"
            "with space" = 1
            'literal.dot' = 2
            "esc\\u0041pe" = 3
              indented   =   4
            """)
        #expect(locator.exactLocation(of: [.key("host"), .key("wake")]) == at(2, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("wake"), .key("every")]) == at(2, 6))
        #expect(locator.exactLocation(of: [.key("host"), .key("with space")]) == at(3, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("literal.dot")]) == at(4, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("escApe")]) == at(5, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("indented")]) == at(6, 3))
    }

    @Test("strings, multi-line strings, arrays and comments never look like keys or headers")
    func valuesAreSkipped() {
        let locator = locate("""
            a = "x = 1 # [fake]"
            b = \"\"\"
            [fake]
            c = 2
            \"\"\"
            d = [  # comment with [fake]
              "e = 3",
              [1, 2],
              { f = 'g' },
            ]
            h = '''
            [[fake]]'''
            i = 1979-05-27 07:32:00Z # date
            j = 'k'
            """)
        let keys = Set(locator.locations.keys.map { $0.map { "\($0)" }.joined(separator: ".") })
        #expect(!keys.contains { $0.contains("fake") || $0.hasPrefix("key(\"c\")") || $0.hasPrefix("key(\"e\")") })
        #expect(locator.exactLocation(of: [.key("d")]) == at(6, 1))
        #expect(locator.exactLocation(of: [.key("d"), .index(0)]) == at(7, 3))
        #expect(locator.exactLocation(of: [.key("d"), .index(1), .index(1)]) == at(8, 7))
        #expect(locator.exactLocation(of: [.key("d"), .index(2), .key("f")]) == at(9, 5))
        #expect(locator.exactLocation(of: [.key("h")]) == at(11, 1))
        #expect(locator.exactLocation(of: [.key("i")]) == at(13, 1))
        #expect(locator.exactLocation(of: [.key("j")]) == at(14, 1))
    }

    @Test("CRLF line endings and a byte-order mark do not shift positions")
    func crlfAndBOM() {
        let locator = locate("\u{FEFF}[host]\r\na = [\r\n  1,\r\n]\r\n  b = \"x\" # c\r\n")
        #expect(locator.exactLocation(of: [.key("host")]) == at(1, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("a")]) == at(2, 1))
        #expect(locator.exactLocation(of: [.key("host"), .key("a"), .index(0)]) == at(3, 3))
        #expect(locator.exactLocation(of: [.key("host"), .key("b")]) == at(5, 3))
    }

    @Test("location(of:) falls back to the nearest located ancestor")
    func fallback() {
        let locator = locate("[[strategy]]\nname = \"x\"\n")
        #expect(locator.location(of: [.key("strategy"), .index(0), .key("missing")]) == at(1, 1))
        #expect(locator.location(of: [.key("nothing")]) == nil)
    }
}
