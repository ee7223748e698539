import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilTestSupport
import VigilKit

/// A strategy gated by `when` in a real vigild: its D-Bus object and
/// `vigilctl strategies` say it is waiting and for what; it runs when the
/// condition comes to hold and stops (lease released) when it no longer does.
extension EndToEnd {
    @Suite(.serialized) struct ConditionEndToEndTests {
        @Test func waitingStrategyShowsWhatItWaitsForAndFollowsItsCondition() async throws {
            let flagDir = try TempDir("vigil-cond")
            let flag = flagDir.file("flag")
            try await BusHost.with(strategies: """
                [[strategy]]
                name = "gated"
                kind = "background-task"
                budget = "1h"
                when = { file_exists = "\(flag)" }
                """) { host in
                let path = VigilAPI.strategyPath("gated")
                let changes = try await host.watcher.signals(matching: DBusMatchRule(
                    sender: BusHost.name, path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"))
                let expected = "file_exists = \"\(flag)\""
                // busctl escapes the quotes inside the string.
                let shown = "s \"file_exists = \\\"\(flag)\\\"\"\n"
                @Sendable func waitingFor() throws -> String {
                    try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Strategy", "WaitingFor"]).stdout
                }
                // The first verdict may land after vigild took its name: then a change announces it.
                try await Self.until(changes) { try waitingFor() == shown }
                let state = try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Strategy", "State"])
                #expect(state.stdout == "s \"waiting\"\n", "\(state.stdout)\(state.stderr)")

                let table = try host.vigilctl("strategies")
                let header = try #require(table.stdout.split(separator: "\n").first.map(String.init), "\(table.stdout)\(table.stderr)")
                #expect(header.contains("WAITING FOR"), "\(table.stdout)")
                let row = try #require(table.stdout.split(separator: "\n").first { $0.hasPrefix("gated") }.map(String.init))
                #expect(row.contains("waiting") && row.hasSuffix(expected), "\(row)")
                let check = try ProcessRunner.run(Build.vigilctl, ["check-config", host.configPath])
                #expect(check.stdout.contains("\n    runs only while: \(expected)\n"), "\(check.stdout)\(check.stderr)")
                let json = try host.vigilctl("strategies", ["--json"])
                #expect(json.stdout.contains("\"waitingFor\" : \"file_exists = \\\"\(flag)\\\"\""), "\(json.stdout)")

                #expect(FileManager.default.createFile(atPath: flag, contents: nil))
                let lease: String
                do { lease = try await host.leaseAcquired(strategy: "gated") } catch {
                    throw DaemonError("\(error)\nvigild output:\n\(host.daemon.output.joined(separator: "\n"))")
                }
                try FileManager.default.removeItem(atPath: flag)
                _ = try await host.signals.first { $0.member == "LeaseReleased" && $0.body.first == .objectPath(lease) }
                try await Self.until(changes) { try waitingFor() == shown }
            }
        }

        /// Returns once `check` holds: now, or after one of the `changes`
        /// announcing it; throws after `timeout` (a broken run).
        static func until(_ changes: AsyncStream<DBusMessage>, timeout: Duration = .seconds(20), _ check: @escaping @Sendable () throws -> Bool) async throws {
            if try check() { return }
            try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    for await _ in changes where try check() { return true }
                    return false
                }
                group.addTask {
                    try await Task.sleep(for: timeout)
                    return false
                }
                let met = try await group.next() ?? false
                group.cancelAll()
                if !met { throw DaemonError("timed out after \(timeout) waiting for a strategy property change") }
            }
        }
    }
}
