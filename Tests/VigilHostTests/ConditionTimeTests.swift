import Foundation
import Testing
import VigilHost
import VigilKit
import VigilKitTesting

/// `time` windows on the test clock, in a zone with daylight saving time.
@Suite struct ConditionTimeTests {
    static let berlin = TimeZone(identifier: "Europe/Berlin")!

    /// A test clock whose wall clock reads `utc` (seconds since the epoch):
    /// ManualClock's wall time is 1_700_000_000 s plus its boottime reading.
    static func clock(atUTC utc: Int64) -> ManualClock {
        ManualClock(start: VigilInstant(nanoseconds: (utc - 1_700_000_000) * 1_000_000_000))
    }

    func gated(_ clock: ManualClock, _ windows: [String]) async throws -> (GatedSupervisor, StatusWaiter) {
        let parsed = try windows.map { try TimeWindow.parse($0).get() }
        let host = try GatedSupervisor(settings: ConditionMonitor.Settings(timeZone: Self.berlin), clock: clock)
        let status = await host.start("office", StrategyConditions(tables: [[.time(parsed)]]))
        return (host, status)
    }

    func state(_ host: GatedSupervisor) async -> StrategyRunState? {
        await host.supervisor.statuses.first?.state
    }

    /// Friday 27 March 2026, 17:00 CET. The window closes at 18:00 and opens
    /// again on Monday at 09:00 CEST: 62 hours later, not 63, because the
    /// clocks went forward on Sunday.
    @Test func workingHoursAcrossTheSpringForwardWeekend() async throws {
        let clock = Self.clock(atUTC: 1_774_627_200)
        let (host, status) = try await gated(clock, ["mon-fri 09:00-18:00"])
        try await status.next(.running)
        await clock.advance(by: .seconds(59 * 60))
        #expect(await state(host) == .running)
        await clock.advance(by: .seconds(60))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "time = [\"mon-fri 09:00-18:00\"]")
        await clock.advance(by: .seconds(61 * 3600 + 59 * 60))
        #expect(await state(host) == .waiting)
        await clock.advance(by: .seconds(60))
        try await status.next(.running)
        await host.stop()
    }

    /// Saturday 24 October 2026, 22:00 CEST. "sat 23:00-04:00" runs past
    /// midnight into Sunday, when the clocks go back an hour at 03:00: it
    /// opens at 23:00 CEST and lasts six hours, to 04:00 CET.
    @Test func windowPastMidnightAcrossTheFallBackNight() async throws {
        let clock = Self.clock(atUTC: 1_792_872_000)
        let (host, status) = try await gated(clock, ["sat 23:00-04:00"])
        try await status.next(.waiting)
        await clock.advance(by: .seconds(59 * 60))
        #expect(await state(host) == .waiting)
        await clock.advance(by: .seconds(60))
        try await status.next(.running)
        await clock.advance(by: .seconds(5 * 3600 + 59 * 60))
        #expect(await state(host) == .running)
        await clock.advance(by: .seconds(60))
        try await status.next(.waiting)
        await host.stop()
    }

    @Test func windowsParseDaysRangesAndWraps() throws {
        let weekend = try TimeWindow.parse("fri-mon 22:00-02:00").get()
        #expect(weekend.days == [5, 6, 7, 1])
        #expect(weekend.start == 22 * 60 && weekend.end == 2 * 60)
        #expect(try TimeWindow.parse("00:00-24:00").get().days.count == 7)
        #expect(try TimeWindow.parse("mon,wed 08:30-09:00").get().days == [1, 3])
    }
}
