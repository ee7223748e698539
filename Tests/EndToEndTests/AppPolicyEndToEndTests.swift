import Foundation
import Glibc
import Testing
import VigilClient
import VigilDBus
import VigilKit
import VigilKitTesting
import VigilTestSupport

/// Who may keep this machine awake (issue 45), against a real vigild on a
/// real dbus-daemon, with apps Vigil did not write: jeepney
/// (Tests/Fixtures/app-policy-client.py), wakepy 1.0.0 from PyPI, and
/// `gdbus call`; `vigilctl inhibitors --deny/--allow/--release` as the
/// person at the machine, and as another uid through `setpriv`. The same
/// rules on the test clock: Tests/VigilHostTests/AppPolicyBusTests.swift.
extension EndToEnd {
    @Suite struct AppPolicyEndToEndTests {
        static let client = Build.packageRoot.appendingPathComponent("Tests/Fixtures/app-policy-client.py").path
        typealias Host = InhibitEndToEndTests.Host

        /// The Host's signals as vigild sends them, recorded from a connection of the test's own.
        final class Signals: Sendable {
            let log = WaitableLog<HostSignal>()
            let client: VigilClient
            let task: Task<Void, Never>

            init(bus: String) async throws {
                client = try await VigilClient.connect(to: .address(bus))
                let stream = try await client.hostSignals()
                let log = self.log
                task = Task { for await signal in stream { log.append(signal) } }
            }

            /// Waits for a signal `match` picks, and returns what it picked.
            func wait<T: Sendable>(_ match: @escaping @Sendable (HostSignal) -> T?) async -> T? {
                await log.wait(timeout: .seconds(30)) { $0.contains { match($0) != nil } }
                return log.all.lazy.compactMap(match).first
            }

            func stop() async {
                task.cancel()
                await client.connection.close()
            }
        }

        /// Runs `body` with vigild on a private bus; when `body` throws (a
        /// failed `#require`), vigild and the bus are stopped all the same.
        static func withHost(_ extra: String = "", _ body: (Host) async throws -> Void) async throws {
            let host = try await Host(extra: extra)
            do {
                try await body(host)
            } catch {
                host.daemon.signal(SIGKILL)
                _ = await host.daemon.waitForExit()
                host.bus.stop()
                throw error
            }
        }

        /// A jeepney app holding inhibits named `names`, once it printed "waiting".
        static func app(_ host: Host, _ names: [String]) async throws -> Daemon {
            let app = try Daemon(arguments: [], executable: ["/usr/bin/python3", client, host.bus.address] + names)
            try await app.waitForLine(containing: "waiting")
            return app
        }

        static func vigilctl(_ host: Host, _ arguments: [String]) throws -> CommandResult {
            try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address] + arguments)
        }

        /// `vigilctl inhibitors --json`, vigild's holders by app.
        static func holders(_ host: Host) throws -> [String: [String: Any]] {
            let listed = try vigilctl(host, ["--json", "--logind-bus", host.bus.address])
            try #require(listed.status == 0, "\(listed.stderr)")
            let all = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
            return Dictionary(all.filter { $0["source"] as? String == "vigil" }.map { ($0["who"] as? String ?? "", $0) }, uniquingKeysWith: { a, _ in a })
        }

        static func lease(_ path: String) -> UInt64? { VigilAPI.leaseID(path: path)?.rawValue }

        /// The lease id of a `vigilctl inhibitors --json` holder.
        static func leaseID(_ holder: [String: Any]?) -> UInt64? { number(holder?["lease"]).map { UInt64($0) } }

        /// A JSON number as JSONSerialization gives it.
        static func number(_ value: Any?) -> Int64? { (value as? NSNumber)?.int64Value }

        @Test func anAppIsExpiredAtItsCapOfAwakeTimeAndAnotherIsNot() async throws {
            try await Self.withHost("app_max = { \"short-app\" = \"2s\", \"long-*\" = \"1h\" }\nclient_grace = \"1s\"") { host in
                let signals = try await Signals(bus: host.bus.address)
                let started = ContinuousClock.now
                let app = try await Self.app(host, ["short-app", "long-app"])
                defer { app.signal(SIGKILL) }
                let holders = try Self.holders(host)
                let short = try #require(Self.leaseID(holders["short-app"]), "\(holders)")
                let long = try #require(Self.leaseID(holders["long-app"]), "\(holders)")
                #expect(holders["short-app"]?["rule"] as? String == "app_max \"short-app\" 2s", "\(holders)")
                #expect((Self.number(holders["long-app"]?["cap_left_usec"]) ?? 0) > 3_500_000_000, "\(holders)")
                let text = try Self.vigilctl(host, ["--logind-bus", host.bus.address])
                #expect(text.stdout.contains("RULE") && text.stdout.contains("CAP LEFT") && text.stdout.contains("BUDGET LEFT"), "\(text.stdout)")

                let expiring = await signals.wait { if case .leaseExpiring(let s) = $0 { Self.lease(s.lease) } else { nil } }
                let elapsed = ContinuousClock.now - started
                #expect(expiring == short)
                #expect(elapsed >= .seconds(2), "expiring after \(elapsed)")
                let expired = await signals.wait { if case .leaseExpired(let s) = $0 { Self.lease(s.lease) } else { nil } }
                #expect(expired == short)
                let line = try await host.daemon.waitForLine(containing: "reached app_max")
                #expect(line.contains("inhibit by \"short-app\" reached app_max \"short-app\" (2s); releasing lease \(short)"), "\(line)")
                // The other app is still held, and never was expiring.
                let after = try Self.holders(host)
                #expect(after["long-app"] != nil && after["short-app"] == nil, "\(after)")
                #expect(!signals.log.all.contains { if case .leaseExpiring(let s) = $0 { Self.lease(s.lease) == long } else { false } })
                await signals.stop()
                await host.stop()
                // Counted per app in the survival log: APP REFUSED EXPIRED RUNS.
                let cost = try ProcessRunner.run(Build.vigilctl, ["cost", "--state-dir", host.dir.file("state")])
                #expect(cost.status == 0, "\(cost.stderr)")
                #expect(cost.stdout.contains("Apps refused and expired:") && cost.stdout.range(of: #"\nshort-app\s+0\s+1\s+1\n"#, options: .regularExpression) != nil,
                        "\(cost.stdout)")
                #expect(!cost.stdout.contains("long-app"), "\(cost.stdout)")
            }
        }

        @Test func wakepyLoopingIsRefusedOnceItsBudgetIsSpent() async throws {
            try await Self.withHost("app_budget = { \"wakepy\" = \"2s\" }\nclient_grace = \"1s\"") { host in
                let python = try installWakepy(in: host.dir.path)
                // keep.running() again and again, each held a moment, until wakepy cannot get it.
                let script = """
                    import sys, time
                    from wakepy import keep
                    for round in range(100):
                        with keep.running(on_fail="pass") as m:
                            sys.stderr.write("round %d active %s\\n" % (round, m.active))
                            sys.stderr.flush()
                            if not m.active:
                                break
                            time.sleep(0.5)
                    """
                let app = try Daemon(arguments: [], environment: ["DBUS_SESSION_BUS_ADDRESS": host.bus.address, "XDG_SESSION_DESKTOP": ""],
                                     executable: [python, "-c", script])
                defer { app.signal(SIGKILL) }
                let refused = try await app.waitForLine(containing: "active False")
                let rounds = Int(refused.split(separator: " ")[1]) ?? 0
                // 2 s of budget in rounds of at least 0.5 s: at most 4 (and 1 more cut short).
                #expect(rounds >= 2 && rounds <= 6, "\(app.output)")
                // The refusal names the budget (wakepy does not show it: gdbus call does).
                let again = try ProcessRunner.run("/usr/bin/gdbus", ["call", "--address", host.bus.address, "--dest", "org.freedesktop.PowerManagement",
                                                                     "--object-path", "/org/freedesktop/PowerManagement/Inhibit",
                                                                     "--method", "org.freedesktop.PowerManagement.Inhibit.Inhibit", "wakepy", "again"])
                #expect(again.status != 0 && again.stderr.contains("LimitsExceeded"), "\(again.stderr)")
                #expect(again.stderr.contains("its whole app_budget \"wakepy\" of 2s per 24h"), "\(again.stderr)")
                await host.stop()
                let cost = try ProcessRunner.run(Build.vigilctl, ["cost", "--json", "--state-dir", host.dir.file("state")])
                #expect(cost.status == 0, "\(cost.stderr)")
                let apps = (try JSONSerialization.jsonObject(with: Data(cost.stdout.utf8)) as? [String: Any])?["apps"] as? [[String: Any]] ?? []
                let wakepy = apps.first { $0["app"] as? String == "wakepy" }
                // wakepy's refused round and gdbus's call.
                #expect(Self.number(wakepy?["refused"]) ?? 0 >= 2, "\(cost.stdout)")
            }
        }

        @Test func denyReleasesAtOnceAllowLetsInAndReleaseEndsALease() async throws {
            try await Self.withHost { host in
                let signals = try await Signals(bus: host.bus.address)
                let app = try await Self.app(host, ["steam"])
                defer { app.signal(SIGKILL) }
                let player = try await Self.app(host, ["mpv"])
                defer { player.signal(SIGKILL) }
                var holders = try Self.holders(host)
                let steam = try #require(Self.leaseID(holders["steam"]), "\(holders)")
                let mpv = try #require(Self.leaseID(holders["mpv"]), "\(holders)")

                let denied = try Self.vigilctl(host, ["--deny", "steam", "--for", "1h"])
                #expect(denied.status == 0 && denied.stdout == "denied \"steam\" for 1h; released 1 held lease\n", "\(denied.stdout)\(denied.stderr)")
                // Released at once: gone from the list when vigilctl returned, with the reason in the signal.
                holders = try Self.holders(host)
                #expect(holders["steam"] == nil && holders["mpv"] != nil, "\(holders)")
                let reason = await signals.wait { if case .leaseReleased(let s) = $0, Self.lease(s.lease) == steam { s.reason } else { nil } }
                #expect(reason?.hasPrefix("denied by vigilctl inhibitors --deny \"steam\" (uid ") == true, "\(reason ?? "none")")
                let listed = try Self.vigilctl(host, ["--logind-bus", host.bus.address])
                #expect(listed.stdout.contains("deny \"steam\" (") && listed.stdout.contains("left)"), "\(listed.stdout)")

                // Its next Inhibit, from gdbus and from the app itself, is refused.
                let gdbus = ["call", "--address", host.bus.address, "--dest", "org.freedesktop.PowerManagement",
                             "--object-path", "/org/freedesktop/PowerManagement/Inhibit", "--method", "org.freedesktop.PowerManagement.Inhibit.Inhibit", "steam", "playing"]
                let refused = try ProcessRunner.run("/usr/bin/gdbus", gdbus)
                #expect(refused.status != 0 && refused.stderr.contains("AccessDenied") && refused.stderr.contains("--deny \"steam\""), "\(refused.stderr)")
                app.signal(SIGUSR1)
                try await app.waitForLine(containing: "waiting", after: 1)
                #expect(app.output.contains { $0.hasPrefix("inhibit steam error org.freedesktop.DBus.Error.AccessDenied") }, "\(app.output)")

                // --allow lets it in again.
                let allowed = try Self.vigilctl(host, ["--allow", "steam"])
                #expect(allowed.status == 0 && allowed.stdout.contains("its deny is lifted"), "\(allowed.stdout)\(allowed.stderr)")
                let again = try ProcessRunner.run("/usr/bin/gdbus", gdbus)
                #expect(again.status == 0 && again.stdout.hasPrefix("(uint32 "), "\(again.stdout)\(again.stderr)")
                app.signal(SIGUSR1)
                try await app.waitForLine(containing: "waiting", after: 2)
                #expect(app.output.filter { $0.hasPrefix("inhibit steam ok") }.count == 2, "\(app.output)")

                // --release N ends lease N.
                let released = try Self.vigilctl(host, ["--release", String(mpv)])
                #expect(released.status == 0 && released.stdout == "released lease \(mpv)\n", "\(released.stdout)\(released.stderr)")
                let ended = await signals.wait { if case .leaseReleased(let s) = $0, Self.lease(s.lease) == mpv { s.reason } else { nil } }
                #expect(ended?.hasPrefix("released by vigilctl inhibitors --release (uid ") == true, "\(ended ?? "none")")
                holders = try Self.holders(host)
                #expect(holders["mpv"] == nil && holders["steam"] != nil, "\(holders)")
                let unknown = try Self.vigilctl(host, ["--release", String(mpv)])
                #expect(unknown.status == 1 && unknown.stderr.contains("LeaseEnded"), "\(unknown.stderr)")
                await signals.stop()
                await host.stop()
            }
        }

        @Test func anotherUIDCannotDenyAllowOrRelease() async throws {
            try await Self.withHost { host in
                let app = try await Self.app(host, ["steam"])
                defer { app.signal(SIGKILL) }
                let steam = try #require(Self.leaseID(try Self.holders(host)["steam"]))
                for action in [["--deny", "steam"], ["--allow", "steam"], ["--release", String(steam)]] {
                    let result = try asNobody(Build.vigilctl, ["inhibitors", "--bus", host.bus.address] + action)
                    #expect(result.status == 1, "\(action): \(result.stdout)\(result.stderr)")
                    #expect(result.stderr.contains("AccessDenied") && result.stderr.contains("allowed only to root and to uid \(getuid())")
                            && result.stderr.contains("the caller runs as uid 65534"), "\(action): \(result.stderr)")
                }
                // Nothing changed: the lease is held, no rule was added; reading is open to that uid.
                let read = try asNobody(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--json", "--logind-bus", host.bus.address])
                #expect(read.status == 0 && read.stdout.contains("\"steam\""), "\(read.stdout)\(read.stderr)")
                #expect(!read.stdout.contains("deny"))
                #expect(try Self.holders(host)["steam"] != nil)
                await host.stop()
            }
        }

        @Test func hostileAppNamesAreBoundedAndEscapedWhereverShown() async throws {
            try await Self.withHost("app_max = { \"*\" = \"1h\" }") { host in
                // The NUL goes first: the bus drops the connection that sent it (and
                // what it held); the app then asks on a new one.
                let app = try await Self.app(host, ["@nul", "@64k", "@evil", "plain"])
                defer { app.signal(SIGKILL) }
                let lines = app.output
                #expect(lines.contains { $0.hasPrefix("inhibit @evil ok ") }, "\(lines)")
                // 64 KiB: refused before any work, naming the limit, quoting none of it.
                let big = try #require(lines.first { $0.hasPrefix("inhibit @64k ") })
                #expect(big == "inhibit @64k error org.freedesktop.DBus.Error.InvalidArgs the application name has 65536 bytes, over the limit of 256 bytes", "\(big)")
                // A NUL is not a D-Bus string: the bus refuses it before vigild sees it.
                let nul = try #require(lines.first { $0.hasPrefix("inhibit @nul ") })
                #expect(!nul.contains(" ok "), "\(nul)")
                #expect(lines.contains { $0.hasPrefix("inhibit plain ok ") }, "\(lines)")

                // vigilctl shows the name escaped, in the table and in --deny's answer.
                let text = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--logind-bus", host.bus.address])
                #expect(text.status == 0)
                #expect(!text.stdout.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{07}" }, "\(text.stdout)")
                #expect(text.stdout.contains("\\e]0;owned") && text.stdout.contains("red\\nfake vigild line"), "\(text.stdout)")
                let evil = "\u{1B}]0;owned\u{07}\u{1B}[31mred\nfake vigild line"
                let denied = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--deny", evil])
                #expect(denied.status == 0 && denied.stdout.contains("released 1 held lease"), "\(denied.stdout)\(denied.stderr)")
                #expect(!denied.stdout.unicodeScalars.contains { $0 == "\u{1B}" } && denied.stdout.split(separator: "\n").count == 1, "\(denied.stdout)")
                let listed = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--logind-bus", host.bus.address])
                #expect(!listed.stdout.unicodeScalars.contains { $0 == "\u{1B}" } && listed.stdout.contains("deny \"\\e]0;owned"), "\(listed.stdout)")
                // A 64 KiB pattern is refused naming the limit, not echoed.
                let huge = try ProcessRunner.run(Build.vigilctl, ["inhibitors", "--bus", host.bus.address, "--deny", String(repeating: "y", count: 65536)])
                #expect(huge.status == 1 && huge.stderr.contains("the pattern has 65536 bytes, over the limit of 256 bytes") && huge.stderr.utf8.count < 1024, "\(huge.stderr.prefix(300))")

                // vigild's own log: no raw escape, no forged line; and it still serves.
                #expect(!host.daemon.output.contains { $0.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{07}" } }, "\(host.daemon.output)")
                #expect(!host.daemon.output.contains { $0.hasPrefix("fake vigild line") }, "\(host.daemon.output)")
                #expect(host.daemon.output.contains { $0.contains("\\e]0;owned") }, "\(host.daemon.output.suffix(10))")
                #expect(try Self.holders(host)["plain"] != nil)
                await host.stop()
            }
        }
    }
}
