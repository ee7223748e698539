import Foundation
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost
import VigilKit

/// Who may keep this machine awake (issue 45), in process on a private bus
/// and the manual clock: `app_max` caps per app, the rolling `app_budget`,
/// and the live rules (DenyApp, AllowApp, ReleaseLease). Third-party apps
/// (jeepney, wakepy, gdbus) and Reload's trust rule against another uid are in
/// Tests/EndToEndTests/AppPolicyEndToEndTests.swift.
@Suite struct AppPolicyBusTests {
    static let pm = InhibitBusNames.powerManagementInterface
    static let pmPath = "/org/freedesktop/PowerManagement/Inhibit"

    static func inhibit(_ f: HostBusFixture, _ app: String) async throws -> UInt32 {
        try await f.call(pmPath, pm, "Inhibit", [app, "test"]).argument(0, as: UInt32.self)
    }

    static func lease(_ f: HostBusFixture, app: String) async -> LeaseSnapshot? {
        await f.runtime.registry.active.first { $0.client?.name == app }
    }

    static func dbusError(_ body: () async throws -> Void) async -> DBusError? {
        do { try await body() } catch let error as DBusError { return error } catch { return DBusError.failed("\(error)") }
        return nil
    }

    @Test func appMaxExpiresOneAppAtItsCapAndNotAnother() async throws {
        try await HostBusFixture.with(strategies: "", host: """
            app_max = { "short" = "2s", "long*" = "1h" }
            client_grace = "1s"
            """) { f in
            let events = await f.runtime.registry.events()
            _ = try await Self.inhibit(f, "short")
            _ = try await Self.inhibit(f, "longplayer")
            _ = try await Self.inhibit(f, "other")
            let short = try #require(await Self.lease(f, app: "short"))
            #expect(short.budget == .seconds(2))
            #expect(await Self.lease(f, app: "longplayer")?.budget == .seconds(3600))
            // Without a rule of its own, inhibit_max (8h) caps it.
            #expect(await Self.lease(f, app: "other")?.budget == .seconds(8 * 3600))

            await f.advance(2)
            let expiring = await InhibitBusTests.first(events, within: .seconds(10)) { $0.kind == .expiring }
            #expect(expiring?.lease.id == short.id)
            // An inhibit's expiration handler only logs: it expires at once.
            let expired = await InhibitBusTests.first(events, within: .seconds(10)) { $0.kind == .expired }
            #expect(expired?.lease.id == short.id)
            #expect(await Self.lease(f, app: "short") == nil)
            #expect(await Self.lease(f, app: "longplayer") != nil)
            #expect(!(await f.runtime.registry.history.contains { $0.kind == .expiring && $0.lease.client?.name == "longplayer" }))
            #expect(f.logs.entries.contains { $0.contains("inhibit by \"short\" reached app_max \"short\" (2s)") }, "\(f.logs.entries)")
            // Counted per app for vigilctl cost and the metrics.
            let policy = try await f.typed.appPolicy()
            #expect(policy.apps.contains(AppCountRow(app: "short", refused: 0, expired: 1)), "\(policy.apps)")
            let long = try #require(policy.leases.first { $0.app == "longplayer" })
            #expect(long.rule == "app_max \"long*\" 1h")
            let capLeft: Int64 = 3_598_000_000
            #expect(long.capLeftUsec == capLeft && long.budgetLeftUsec == -1, "\(long)")
        }
    }

    @Test func anAppThatReinhibitsInALoopIsRefusedOnceItsBudgetIsSpent() async throws {
        try await HostBusFixture.with(strategies: "", host: "app_budget = { \"looper\" = \"10s\" }\nclient_grace = \"1s\"") { f in
            // 3 s held per round: 9 s after three rounds, two inhibits at once count once.
            for _ in 0..<3 {
                let a = try await Self.inhibit(f, "looper")
                let b = try await Self.inhibit(f, "looper")
                await f.advance(3)
                try await f.call(Self.pmPath, Self.pm, "UnInhibit", [a])
                try await f.call(Self.pmPath, Self.pm, "UnInhibit", [b])
            }
            // The fourth gets what is left: 1 s, then expires.
            _ = try await Self.inhibit(f, "looper")
            let last = try #require(await Self.lease(f, app: "looper"))
            #expect(last.budget == .seconds(1))
            let left = try await f.typed.appPolicy().leases.first { $0.lease == last.id.rawValue }
            #expect(left?.budgetLeftUsec == 1_000_000 && left?.rule == "inhibit_max 8h; app_budget \"looper\" 10s per 24h", "\(String(describing: left))")
            // No app_max names it: its cap is inhibit_max.
            let eightHours: Int64 = 8 * 3600 * 1_000_000
            #expect(left?.capLeftUsec == eightHours)
            let events = await f.runtime.registry.events()
            await f.advance(1)
            _ = await InhibitBusTests.first(events, within: .seconds(10)) { $0.kind == .expiring }
            let expired = await InhibitBusTests.first(events, within: .seconds(10)) { $0.kind == .expired }
            #expect(expired?.lease.id == last.id)
            #expect(await Self.lease(f, app: "looper") == nil)
            #expect(f.logs.entries.contains { $0.contains("reached app_budget \"looper\" (10s per 24h)") }, "\(f.logs.entries)")
            // Spent: refused, naming the budget.
            let refused = await Self.dbusError { _ = try await Self.inhibit(f, "looper") }
            #expect(refused?.name == DBusError.Name.limitsExceeded, "\(String(describing: refused))")
            #expect(refused?.message.contains("its whole app_budget \"looper\" of 10s per 24h") == true, "\(refused?.message ?? "")")
            // Another app is not affected.
            _ = try await Self.inhibit(f, "other")
            // 24 hours of awake time later the window has moved on.
            await f.advance(24 * 3600 + 1)
            _ = try await Self.inhibit(f, "looper")
            let apps = try await f.typed.appPolicy().apps
            #expect(apps.contains(AppCountRow(app: "looper", refused: 1, expired: 1)), "\(apps)")
        }
    }

    @Test func clientLeasesAreCappedAndBudgetedByTheirName() async throws {
        try await HostBusFixture.with(strategies: "", host: "app_max = { \"sync\" = \"5s\" }\napp_budget = { \"sync\" = \"8s\" }") { f in
            let begun = try await f.typed.beginBackgroundTask(name: "sync", reason: "sync", budgetMicros: 3600_000_000)
            let id = try #require(VigilAPI.leaseID(path: begun.path))
            #expect(await f.runtime.registry.lease(id)?.budget == .seconds(5))
            // A renewal is cut to what is left under the cap, counted from the start.
            await f.advance(2)
            try await f.typed.renewLease(at: begun.path, budgetMicros: 3600_000_000)
            #expect(await f.runtime.registry.lease(id)?.budget == .seconds(3))
            try await f.typed.endLease(at: begun.path)
            // 2 s of the 8 s budget used: the next is granted its cap, 5 s;
            // the one after that 1 s; then none.
            let second = try await f.typed.beginBackgroundTask(name: "sync", reason: "", budgetMicros: 3600_000_000)
            #expect(await f.runtime.registry.lease(try #require(VigilAPI.leaseID(path: second.path)))?.budget == .seconds(5))
            await f.advance(5)
            try await f.typed.endLease(at: second.path)
            let third = try await f.typed.beginBackgroundTask(name: "sync", reason: "", budgetMicros: 3600_000_000)
            #expect(await f.runtime.registry.lease(try #require(VigilAPI.leaseID(path: third.path)))?.budget == .seconds(1))
            await f.advance(1)
            try? await f.typed.endLease(at: third.path)
            let refused = await Self.dbusError { _ = try await f.typed.beginBackgroundTask(name: "sync", reason: "", budgetMicros: 1_000_000) }
            #expect(refused?.name == DBusError.Name.limitsExceeded && refused?.message.contains("app_budget \"sync\"") == true,
                    "\(String(describing: refused))")
        }
    }

    @Test func denyReleasesAtOnceAndRefusesAllowLetsInAgainReleaseEndsOne() async throws {
        try await HostBusFixture.with(strategies: "", host: "inhibit_deny = [\"blocked\"]") { f in
            let steamCookie = try await Self.inhibit(f, "steam")
            _ = try await Self.inhibit(f, "steam")
            _ = try await Self.inhibit(f, "mpv")
            let task1 = try await f.typed.beginBackgroundTask(name: "steam", reason: "", budgetMicros: 60_000_000)
            #expect(try await f.typed.denyApp("ste*", forMicros: 0) == 3)
            #expect(await Self.lease(f, app: "steam") == nil)
            #expect(await Self.lease(f, app: "mpv") != nil)
            let reasons = await f.runtime.registry.history.filter { $0.kind == .released && $0.lease.client?.name == "steam" }.map(\.detail)
            #expect(reasons.count == 3 && reasons.allSatisfy { $0 == "denied by vigilctl inhibitors --deny \"ste*\" (uid \(getuid()))" }, "\(reasons)")
            _ = task1
            // The app's own UnInhibit of a cookie vigild ended succeeds (wakepy
            // raises on a failed one); another connection's is refused as ever.
            let other = try await f.bus.connect()
            let foreign = await Self.dbusError {
                _ = try await other.call(destination: f.hostName, path: Self.pmPath, interface: Self.pm, member: "UnInhibit",
                                         arguments: [.uint32(steamCookie)])
            }
            await other.close()
            #expect(foreign?.name == DBusError.Name.invalidArgs)
            try await f.call(Self.pmPath, Self.pm, "UnInhibit", [steamCookie])
            #expect(await Self.dbusError { try await f.call(Self.pmPath, Self.pm, "UnInhibit", [steamCookie]) }?.name == DBusError.Name.invalidArgs)
            let denied = await Self.dbusError { _ = try await Self.inhibit(f, "steam") }
            #expect(denied?.name == DBusError.Name.accessDenied, "\(String(describing: denied))")
            #expect(denied?.message.contains("denied by vigilctl inhibitors --deny \"ste*\" until vigild restarts") == true, "\(denied?.message ?? "")")
            let deniedTask = await Self.dbusError { _ = try await f.typed.beginBackgroundTask(name: "steam", reason: "", budgetMicros: 1_000_000) }
            #expect(deniedTask?.name == DBusError.Name.accessDenied)
            #expect(try await f.typed.appPolicy().rules == [AppRuleRow(pattern: "ste*", action: "deny", leftUsec: -1)])

            // Allow lifts it; a live allow also overrides the config's inhibit_deny.
            #expect(try await f.typed.allowApp("ste*"))
            _ = try await Self.inhibit(f, "steam")
            #expect(await Self.dbusError { _ = try await Self.inhibit(f, "blocked") }?.name == DBusError.Name.accessDenied)
            #expect(try await !f.typed.allowApp("blocked"))
            _ = try await Self.inhibit(f, "blocked")

            // Release ends one lease; a strategy's or an unknown lease is refused.
            let mpv = try #require(await Self.lease(f, app: "mpv"))
            try await f.typed.releaseLease(mpv.id.rawValue)
            #expect(await Self.lease(f, app: "mpv") == nil)
            let gone = await Self.dbusError { try await f.typed.releaseLease(mpv.id.rawValue) }
            #expect(gone?.name == VigilAPI.leaseEndedError)
            #expect(await f.runtime.registry.history.contains { $0.kind == .released && $0.lease.id == mpv.id && $0.detail == "released by vigilctl inhibitors --release (uid \(getuid()))" })

            // A timed deny lapses on the clock.
            let forever = await Self.dbusError { _ = try await f.typed.denyApp("mpv", forMicros: .max) }
            #expect(forever?.name == DBusError.Name.invalidArgs && forever?.message.contains("a deny lasts at most") == true, "\(String(describing: forever))")
            #expect(try await f.typed.denyApp("mpv", forMicros: 10_000_000) == 0)
            #expect(await Self.dbusError { _ = try await Self.inhibit(f, "mpv") }?.message.contains("for 10s more") == true)
            await f.advance(10)
            _ = try await Self.inhibit(f, "mpv")
            #expect(try await f.typed.appPolicy().apps.first { $0.app == "steam" }?.refused == 2)
        }
    }

    @Test func aDenyRacingManyInhibitsAndTasksLeavesNoneOfThemHeld() async throws {
        try await HostBusFixture.with(strategies: "") { f in
            var connections: [DBusConnection] = []
            for _ in 0..<4 { connections.append(try await f.bus.connect()) }
            let hostName = f.hostName
            let typed = f.typed
            // 40 inhibits and 8 client leases of "racer" in flight when the deny comes.
            await withTaskGroup(of: Void.self) { group in
                for i in 0..<40 {
                    let connection = connections[i % connections.count]
                    group.addTask {
                        _ = try? await connection.call(destination: hostName, path: Self.pmPath, interface: Self.pm, member: "Inhibit",
                                                       arguments: [.string("racer"), .string("")], timeout: .seconds(10))
                    }
                    if i == 20 { group.addTask { _ = try? await typed.denyApp("racer") } }
                }
                for _ in 0..<8 {
                    group.addTask { _ = try? await typed.beginBackgroundTask(name: "racer", reason: "", budgetMicros: 60_000_000) }
                }
            }
            // Whatever order they ran in, each was refused, released by the deny, or let go when it saw the deny.
            #expect(await f.runtime.registry.active.filter { $0.client?.name == "racer" }.isEmpty)
            #expect(try await f.typed.appPolicy().leases.isEmpty)
            #expect(await f.runtime.inhibits.hasInhibit == false)
            for connection in connections { await connection.close() }
        }
    }

    @Test func hostileNamesAndPatternsAreBoundedAndEscaped() async throws {
        try await HostBusFixture.with(strategies: "", host: "app_max = { \"*\" = \"1h\" }") { f in
            let evil = "\u{1B}]0;owned\u{07}\u{1B}[31mred\nfake line"
            _ = try await Self.inhibit(f, evil)
            #expect(f.logs.all.allSatisfy { !$0.message.contains("\u{1B}") && !$0.message.contains("\nfake line") }, "\(f.logs.entries)")
            let huge = String(repeating: "x", count: 65536)
            let tooLong = await Self.dbusError { _ = try await Self.inhibit(f, huge) }
            #expect(tooLong?.name == DBusError.Name.invalidArgs && tooLong?.message == "the application name has 65536 bytes, over the limit of 256 bytes")
            let hugePattern = await Self.dbusError { _ = try await f.typed.denyApp(huge) }
            #expect(hugePattern?.name == DBusError.Name.invalidArgs && (hugePattern?.message.utf8.count ?? 0) < 200, "\(String(describing: hugePattern))")
            #expect(try await f.typed.denyApp(evil) == 1)
            let refused = await Self.dbusError { _ = try await Self.inhibit(f, evil) }
            #expect(refused?.message.contains("\u{1B}") == false && refused?.message.contains("\\e]0;owned") == true, "\(String(describing: refused))")
            #expect(f.logs.all.allSatisfy { !$0.message.contains("\u{1B}") }, "\(f.logs.entries)")
        }
    }
}

@Suite struct AppPolicyTests {
    @Test func theMostSpecificPatternWinsWhateverTheOrder() {
        let rules = [AppLimitRule("*", .seconds(1)), AppLimitRule("mp*", .seconds(2)), AppLimitRule("mpv", .seconds(3)), AppLimitRule("m*", .seconds(4))]
        #expect(mostSpecific(rules, matching: ["mpv"])?.limit == .seconds(3))
        #expect(mostSpecific(rules.reversed(), matching: ["mpv"])?.limit == .seconds(3))
        #expect(mostSpecific(rules, matching: ["mpg123"])?.limit == .seconds(2))
        #expect(mostSpecific(rules, matching: ["vlc", "/usr/bin/vlc"])?.limit == .seconds(1))
        #expect(mostSpecific(rules.filter { $0.pattern != "*" }, matching: ["vlc"]) == nil)
    }

    @Test func aLeaseThatEndedBeforeItsGrantWasRecordedNeverCounts() async throws {
        let clock = ManualClock()
        let policy = AppPolicy(settings: AppLimitSettings(budgets: [AppLimitRule("*", .seconds(10))]), clock: clock)
        let grant = try await policy.admit(app: "quick", subjects: ["quick"], who: "quick")
        // The registry ended lease 1 (its tiny budget ran out) before the grant was recorded.
        await policy.ended(LeaseID(1))
        await policy.began(LeaseID(1), grant: grant, subjects: ["quick"])
        await clock.advance(by: .seconds(60))
        #expect(await policy.used("quick", now: clock.now) == .zero)
        #expect(await policy.limits().isEmpty)
    }

    @Test func aReloadNamesTheChangedKeysThatNeedARestart() {
        let before = HostSettings(stateDir: "/tmp/x")
        var after = before
        after.appLimits.budgets = [AppLimitRule("*", .seconds(3600))]
        #expect(ConfigDiff.differingKeys(before, after) == ["app_budget"])
        after.appLimits.caps = [AppLimitRule("mpv", .seconds(60))]
        #expect(ConfigDiff.differingKeys(before, after) == ["app_max", "app_budget"])
    }

    @Test func theBudgetRollsOverTwentyFourHoursAndStaysBounded() async throws {
        let clock = ManualClock()
        let policy = AppPolicy(settings: AppLimitSettings(budgets: [AppLimitRule("*", .seconds(3600))]), clock: clock)
        // More short leases than spans are kept: merged, never counting less than held.
        let rounds = AppPolicy.maxSpansPerApp + 20
        for i in 0..<rounds {
            let grant = try await policy.admit(app: "loop", subjects: ["loop"], who: "loop")
            await policy.began(LeaseID(UInt64(i + 1)), grant: grant, subjects: ["loop"])
            await clock.advance(by: .milliseconds(1))
            await policy.ended(LeaseID(UInt64(i + 1)))
        }
        #expect(await policy.used("loop", now: clock.now) == .milliseconds(rounds))
        #expect(await policy.spanCount("loop") <= AppPolicy.maxSpansPerApp)
        await clock.advance(by: AppLimitSettings.window)
        #expect(await policy.used("loop", now: clock.now) == .zero)
    }
}
