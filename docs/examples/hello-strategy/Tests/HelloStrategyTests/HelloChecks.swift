import Foundation
import VigilKit
import VigilKitTesting
@testable import HelloStrategy

/// The strategy run without a host: a manual clock moves time, and the
/// test kit's scheduler, lease recorder and waitable logs stand in for the
/// host's. Plain throwing checks, so the same file runs under `swift test`
/// (HelloStrategyTests.swift) and in the package test against the installed
/// SDK (Tests/Package/run, which has no test framework).
enum HelloChecks {
    struct Failed: Error, CustomStringConvertible {
        var description: String
    }

    static func check(_ condition: Bool, _ message: @autoclosure () -> String) throws {
        if !condition { throw Failed(description: message()) }
    }

    /// Returns once the strategy sleeps on `clock` (it asked for its next
    /// wake), so that moving the clock moves it.
    static func waitForSleeper(_ clock: ManualClock) async throws {
        try await clock.settle(until: "the strategy waits for a wake") { clock.sleeperCount > 0 }
        try check(clock.sleeperCount == 1, "the strategy waits on \(clock.sleeperCount) sleeps, not one")
    }

    /// Two greetings in two seconds, each written under its own lease, each
    /// recorded as an event; nothing before the first second is up.
    static func greetsEachPeriodUnderALease() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("hello-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let clock = ManualClock()
        let leases = RecordingLeases()
        let events = WaitableLog<RecordedEvent>()
        let lines = WaitableLog<LogLine>()
        let context = StrategyContext(
            name: "greeter", kind: "hello", log: lines.logger("greeter"),
            leases: leases, scheduler: ClockDrivenScheduler(clock: clock), hooks: RecordingHookRunner(),
            clock: clock, events: events)
        let run = Task { try await Hello(file: file, every: .seconds(1), greeting: "hi").run(in: context) }
        defer { run.cancel() }

        // Each wake asks for [now + 1 s, now + 1.1 s]; the test scheduler
        // fires it at the end of that window.
        try await waitForSleeper(clock)
        await clock.advance(by: .milliseconds(1_000))
        try check(events.count == 0, "greeted before its window ended: \(events.all)")

        await clock.advance(by: .milliseconds(100))
        try check(await events.wait(for: "greeted"), "no greeting after 1.1 s")
        try await waitForSleeper(clock)
        await clock.advance(by: .milliseconds(1_100))
        try check(await events.wait(forCount: 2) == 2, "not two greetings after 2.2 s: \(events.all)")

        let text = try String(contentsOfFile: file, encoding: .utf8)
        try check(text == "hi from greeter #1\nhi from greeter #2\n", "the file holds \(text.debugDescription)")
        try check(events.all.map { $0.fields["count"] } == ["1", "2"], "events: \(events.all)")
        // Each greeting took a lease on the file and gave it back.
        let acquired = leases.events.all.filter { $0.kind == .acquired }
        try check(acquired.map(\.holds) == ["file \(file)", "file \(file)"], "leases: \(acquired)")
        try check(acquired.allSatisfy { $0.budget == .seconds(10) }, "budgets: \(acquired.map(\.budget))")
        try check(await leases.events.wait { $0.filter { $0.kind == .released }.count == 2 }, "leases not released: \(leases.events.all)")
        try check(leases.held.isEmpty, "still held: \(leases.held)")
        try check(await lines.wait(forLineContaining: "wrote greeting #2"), "log: \(lines.all.map(\.message))")
    }
}
