import Foundation
import Testing
import VigilKit
@testable import VigilHost

/// `when` / `when_any` in the config: what is read, and each mistake's
/// specific error with file, line and key path.
@Suite struct ConditionConfigTests {
    /// A test-echo strategy's first four lines: `[[strategy]]`, name, kind, message.
    static func echo(_ name: String) -> String {
        "[[strategy]]\nname = \"\(name)\"\nkind = \"test-echo\"\nmessage = \"hi\""
    }

    func validate(_ text: String) throws -> Result<VigilConfig, ConfigError> {
        let document = try ConfigLoader.parseDocument(text: text, path: "/etc/vigil/vigil.toml")
        return ConfigLoader.validate(document, resolver: TestResolver())
    }

    func problems(_ text: String) throws -> [String] {
        guard case .failure(let error) = try validate(text) else { return [] }
        return error.problems.map(\.description)
    }

    @Test func conditionsAreRead() throws {
        let config = try validate("""
            \(Self.echo("player"))

            \(Self.echo("spdif"))
            [strategy.when]
            lease_active = "player"
            ac_power = true
            battery_above = "20%"
            time = ["mon-fri 09:00-18:00", "sat 10:00-12:00"]

            \(Self.echo("either"))
            when_any = [{ network = "unmetered", process = "mpv" }, { file_exists = "/run/x/../flag" }]
            """).get()
        let spdif = try #require(config.strategies.first { $0.name == "spdif" }?.conditions)
        #expect(spdif.tables.count == 1)
        #expect(Set(spdif.all.map(\.written)) == [
            "lease_active = \"player\"", "ac_power = true", "battery_above = \"20%\"",
            "time = [\"mon-fri 09:00-18:00\", \"sat 10:00-12:00\"]",
        ])
        let either = try #require(config.strategies.first { $0.name == "either" }?.conditions)
        #expect(either.tables.count == 2)
        #expect(either.tables[1] == [.fileExists("/run/flag")])
        #expect(config.strategies.first { $0.name == "player" }?.conditions == nil)
    }

    @Test func unknownConditionGetsDidYouMean() throws {
        #expect(try problems("""
            \(Self.echo("a"))
            [strategy.when]
            ac_pwer = true
            """) == [
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.ac_pwer: unknown condition \"ac_pwer\" (did you mean \"ac_power\"?); conditions are ac_power, battery_above, network, time, lease_active, process, file_exists",
        ])
    }

    @Test func badTimeRangesAreNamed() throws {
        let found = try problems("""
            \(Self.echo("a"))
            [strategy.when]
            time = ["mon-fri 09:00-25:00", "mon-fir 09:00-18:00", "10:00-10:00", "9-17"]
            """)
        #expect(found == [
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.time: window 0 \"mon-fri 09:00-25:00\": bad end time \"25:00\": expected HH:MM from 00:00 to 24:00",
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.time: window 1 \"mon-fir 09:00-18:00\": unknown day \"fir\" (did you mean \"fri\"?); days are mon, tue, wed, thu, fri, sat, sun",
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.time: window 2 \"10:00-10:00\": empty time range \"10:00-10:00\": start and end are the same",
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.time: window 3 \"9-17\": bad start time \"9\": expected HH:MM from 00:00 to 23:59",
        ])
    }

    @Test func unknownStrategyInLeaseActive() throws {
        #expect(try problems("""
            \(Self.echo("player"))

            \(Self.echo("spdif"))
            when = { lease_active = "playr" }
            """) == [
            "/etc/vigil/vigil.toml:10:10: strategy[1].when.lease_active: lease_active names \"playr\", which is not a strategy in this config (did you mean \"player\"?); write \"client:<task>\" for a D-Bus client's lease",
        ])
    }

    @Test func leaseCyclesAreRefused() throws {
        #expect(try problems("""
            \(Self.echo("self"))
            when = { lease_active = "self" }
            """) == [
            "/etc/vigil/vigil.toml:5:10: strategy[0].when.lease_active: strategy \"self\" waits for its own lease (lease_active = \"self\"): it could never start",
        ])
        #expect(try problems("""
            \(Self.echo("a"))
            when = { lease_active = "b" }

            \(Self.echo("b"))
            when_any = [{ ac_power = true }, { lease_active = "c" }]

            \(Self.echo("c"))
            when = { lease_active = "a" }
            """) == [
            "/etc/vigil/vigil.toml:5:10: strategy[0].when.lease_active: lease_active cycle a → b → c → a: each waits for the next one's lease, so none could ever start",
        ])
    }

    @Test func otherMistakes() throws {
        let found = try problems("""
            \(Self.echo("a"))
            [strategy.when]
            network = "onlin"
            battery_above = "120%"
            process = "a-very-long-process-name"
            file_exists = "relative/path"
            ac_power = "yes"
            """)
        #expect(found == [
            "/etc/vigil/vigil.toml:6:1: strategy[0].when.network: unknown network requirement \"onlin\" (did you mean \"online\"?); expected \"online\" or \"unmetered\"",
            "/etc/vigil/vigil.toml:7:1: strategy[0].when.battery_above: expected a percentage from \"0%\" to \"99%\" such as \"20%\", found \"120%\"",
            "/etc/vigil/vigil.toml:8:1: strategy[0].when.process: expected a process name as the kernel keeps it (at most 15 bytes, no \"/\"; see /proc/PID/comm), found \"a-very-long-process-name\"",
            "/etc/vigil/vigil.toml:9:1: strategy[0].when.file_exists: expected an absolute path, found \"relative/path\"",
            "/etc/vigil/vigil.toml:10:1: strategy[0].when.ac_power: expected true (on mains) or false (on battery), found a string",
        ])
        #expect(try problems("""
            \(Self.echo("a"))
            when = { ac_power = true }
            when_any = [{ ac_power = false }]
            """).count == 1)
    }
}
