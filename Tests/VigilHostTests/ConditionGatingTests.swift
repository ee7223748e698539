import Foundation
import Testing
@testable import VigilHost
import VigilKit

/// `when` conditions gate a strategy: it runs while they hold, is stopped
/// (leases released) when they stop holding, and starts again.
@Suite(.serialized) struct ConditionGatingTests {
    /// Voluntary context switches of this process's threads named `name`, by thread id.
    static func switches(ofThreadsNamed name: String) -> [String: Int] {
        var out: [String: Int] = [:]
        for task in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? [] {
            let base = "/proc/self/task/" + task
            guard (try? String(contentsOfFile: base + "/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) == name,
                  let status = try? String(contentsOfFile: base + "/status", encoding: .utf8),
                  let line = status.split(separator: "\n").first(where: { $0.hasPrefix("voluntary_ctxt_switches:") }),
                  let count = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) else { continue }
            out[task] = count
        }
        return out
    }

    @Test func fileExistsStartsAndStopsTheStrategy() async throws {
        let dir = try ConditionTempDir()
        let flag = dir.path + "/sub/flag"
        let host = try GatedSupervisor()
        let status = await host.start("gated", StrategyConditions(tables: [[.fileExists(flag)]]))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "file_exists = \"\(flag)\"")
        #expect(await host.activeLeases(of: "gated") == 0)

        // The parent directory does not exist yet: the watch moves down as it appears.
        try dir.write("sub/flag", "")
        try await status.next(.running)
        try await eventuallyLeases(host, "gated", 1)

        try FileManager.default.removeItem(atPath: flag)
        try await status.next(.waiting)
        #expect(await host.activeLeases(of: "gated") == 0)
        await host.stop()
    }

    @Test func acPowerStopsWithinASecondOfUnpluggingAndRestartsOnPlugging() async throws {
        let tree = try ConditionTempDir()
        try tree.write("AC/type", "Mains")
        try tree.write("AC/online", "1")
        try tree.write("BAT0/type", "Battery")
        try tree.write("BAT0/capacity", "80")
        try tree.write("BAT0/status", "Charging")
        let host = try GatedSupervisor(settings: ConditionMonitor.Settings(powerSupplyDir: tree.path))
        let status = await host.start("download", StrategyConditions(tables: [[.acPower(true)]]))
        try await status.next(.running)
        try await eventuallyLeases(host, "download", 1)

        // While nothing changes, the power source does not wake (issue 47;
        // it used to be counted on its thread's context switches, and is
        // now counted where its descriptors are handed to it): not on the
        // loop's next turns (a descriptor left ready would be handed to it
        // on every one), and not in a second of real time (the second only
        // bounds how slow a periodic wake it would catch: the count must
        // not move at all). The tree was written before the watch began,
        // so nothing is pending.
        await loopTurns()
        let idle = await host.monitor.sourceWakeups
        try await Task.sleep(for: .seconds(1))
        await loopTurns()
        let afterIdle = await host.monitor.sourceWakeups
        #expect(afterIdle == idle, "the power source woke \(afterIdle - idle) times with nothing changed")

        let clock = ContinuousClock()
        let unplugged = clock.now
        try tree.write("AC/online", "0")
        let waiting = try await status.next(.waiting)
        let stoppedAfter = clock.now - unplugged
        #expect(stoppedAfter < .seconds(1), "stopped \(stoppedAfter) after unplugging")
        #expect(waiting.waitingFor == "ac_power = true")
        #expect(await host.activeLeases(of: "download") == 0)
        // The count above counts: the unplugging woke the source. And once
        // the loop has handed it what the write queued, it is quiet again
        // (what woke it was read, not left ready).
        #expect(await host.monitor.sourceWakeups > afterIdle)
        await loopTurns()
        let settled = await host.monitor.sourceWakeups
        await loopTurns()
        #expect(await host.monitor.sourceWakeups == settled, "the power source keeps waking after one change")

        try tree.write("AC/online", "1")
        try await status.next(.running)
        try await eventuallyLeases(host, "download", 1)

        // The lease history shows the gap: held, released, held again.
        let history = await host.registry.history.filter { $0.lease.strategy == "download" }.map(\.kind)
        #expect(history == [.acquired, .released, .acquired])

        // The watcher is a watch on the event loop, not a thread of its own
        // (issue 47).
        #expect(Self.switches(ofThreadsNamed: "vigil-power").isEmpty)
        await host.stop()
    }

    @Test func batteryAboveFollowsTheLowestBattery() async throws {
        let tree = try ConditionTempDir()
        try tree.write("BAT0/type", "Battery")
        try tree.write("BAT0/capacity", "50")
        try tree.write("BAT0/status", "Discharging")
        let host = try GatedSupervisor(settings: ConditionMonitor.Settings(powerSupplyDir: tree.path))
        let status = await host.start("backup", StrategyConditions(tables: [[.batteryAbove(20)]]))
        try await status.next(.running)
        try tree.write("BAT0/capacity", "19")
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "battery_above = \"20%\"")
        try tree.write("BAT0/capacity", "21")
        try await status.next(.running)
        await host.stop()
    }

    @Test func whenAnyRunsWhileOneTableHoldsAndNamesWhatEachWaitsFor() async throws {
        let dir = try ConditionTempDir()
        let a = dir.path + "/a", b = dir.path + "/b"
        let host = try GatedSupervisor()
        let status = await host.start("either", StrategyConditions(tables: [[.fileExists(a)], [.fileExists(b)]]))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "(file_exists = \"\(a)\") or (file_exists = \"\(b)\")")
        try dir.write("b", "")
        try await status.next(.running)
        try FileManager.default.removeItem(atPath: b)
        try await status.next(.waiting)
        await host.stop()
    }

    /// The registry publishes the acquire after the strategy's state
    /// changed; wait for it through the registry's own events.
    func eventuallyLeases(_ host: GatedSupervisor, _ strategy: String, _ count: Int) async throws {
        let events = await host.registry.events()
        if await host.activeLeases(of: strategy) == count { return }
        for await _ in events {
            if await host.activeLeases(of: strategy) == count { return }
        }
    }
}
