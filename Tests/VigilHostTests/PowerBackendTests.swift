import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// The logind stand-in (Tests/Fixtures/logind-standin.py) on a private bus.
final class LogindStandIn: @unchecked Sendable {
    // Invariant: all stored properties are immutable after init.
    let bus: HostBusDaemon
    let process: LogindStandInProcess

    init() throws {
        bus = try HostBusDaemon()
        do {
            process = try LogindStandInProcess(busAddress: bus.address)
        } catch {
            bus.stop()
            throw error
        }
    }

    func call(_ connection: DBusConnection, _ member: String, _ args: [BusValue] = [], test: Bool = false) async throws -> DBusMessage {
        try await connection.call(
            destination: "org.freedesktop.login1", path: "/org/freedesktop/login1",
            interface: test ? "org.vigil.Test.LogindStandIn" : "org.freedesktop.login1.Manager",
            member: member, arguments: args)
    }

    func inhibitors(_ connection: DBusConnection) async throws -> [BusValue] {
        let reply = try await call(connection, "ListInhibitors")
        guard case .array(_, let items)? = reply.body.first else { return [] }
        return items
    }

    /// Waits (on the stand-in's own event, bounded) until `n` inhibitors exist.
    func waitForCount(_ connection: DBusConnection, _ n: UInt32) async throws -> Bool {
        let reply = try await call(connection, "WaitForCount", [.uint32(n), .uint64(5_000_000)], test: true)
        return try reply.argument(0, as: Bool.self)
    }

    func history(_ connection: DBusConnection) async throws -> [String] {
        try await call(connection, "History", test: true).argument(0, as: [String].self)
    }

    func stop() {
        process.stop()
        bus.stop()
    }
}

@Suite(.serialized) struct PowerBackendTests {
    // MARK: wakelock

    func sysfs() throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-power-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for f in ["wake_lock", "wake_unlock"] { FileManager.default.createFile(atPath: "\(dir)/\(f)", contents: nil) }
        return dir
    }

    func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    @Test func wakelockWritesNameAndTimeoutAndUnlocks() async throws {
        let dir = try sysfs()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let backend = WakelockPowerBackend(directory: dir, margin: .seconds(30))
        let registry = LeaseRegistry(clock: ManualClock(), backend: backend)
        let id = try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r", budget: .seconds(60), power: PowerHold()))
        let name = "vigil-\(getpid())-1"
        #expect(lines("\(dir)/wake_lock") == ["\(name) 90000000000"])
        #expect(await registry.lease(id)?.power == "wake lock \(name)")
        // Renewal re-arms the same lock with the new timeout: no gap.
        try await registry.renew(id, budget: .seconds(120))
        #expect(lines("\(dir)/wake_lock") == ["\(name) 90000000000", "\(name) 150000000000"])
        #expect(lines("\(dir)/wake_unlock").isEmpty)
        await registry.release(id)
        #expect(lines("\(dir)/wake_unlock") == [name])
    }

    @Test func wakelockWithoutBudgetStillTimesOut() async throws {
        let dir = try sysfs()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let backend = WakelockPowerBackend(directory: dir, unbudgetedTimeout: .seconds(600))
        let token = try await backend.hold(PowerHold(), who: "w", why: "y", budget: nil)
        #expect(lines("\(dir)/wake_lock").first?.hasSuffix(" 600000000000") == true)
        await token.release()
    }

    @Test func unwritableWakelockFailsTheLeaseClearly() async throws {
        let backend = WakelockPowerBackend(directory: "/nonexistent/power")
        let registry = LeaseRegistry(clock: ManualClock(), backend: backend)
        do {
            try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r", budget: .seconds(5), power: PowerHold()))
            Issue.record("acquired a lease without a wake lock")
        } catch let error as LeaseError {
            #expect(error.code == .backendFailed)
            #expect(error.message.contains("cannot open /nonexistent/power/wake_lock: No such file or directory"))
        }
        #expect(await registry.history.map(\.kind) == [.failed])
        #expect(!WakelockPowerBackend.isUsable(directory: "/nonexistent/power"))
    }

    // MARK: logind

    @Test func logindInhibitorLivesExactlyAsLongAsTheLease() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let observer = try await standIn.bus.connect()
        #expect(await LogindPowerBackend.isAvailable(on: host))
        let registry = LeaseRegistry(clock: ManualClock(), backend: LogindPowerBackend(connection: host))
        let id = try await registry.acquire(strategy: "focus", LeaseRequest(
            holds: "focus session", reason: "25-minute focus timer", budget: .seconds(60), power: PowerHold(what: ["sleep", "idle"], mode: "block")))
        let held = try await standIn.inhibitors(observer)
        try #require(held.count == 1)
        guard case .structure(let fields) = held[0] else { Issue.record("not a struct"); return }
        #expect(fields[0] == .string("sleep:idle"))
        #expect(fields[1] == .string("vigil: focus"))
        #expect(fields[2] == .string("25-minute focus timer"))
        #expect(fields[3] == .string("block"))
        #expect(fields[4] == .uint32(getuid()))

        // Renewal takes the new inhibitor before closing the old one.
        for _ in 0..<5 { try await registry.renew(id) }
        #expect(try await standIn.waitForCount(observer, 1))
        await registry.release(id)
        #expect(try await standIn.waitForCount(observer, 0))
        let history = try await standIn.history(observer)
        // One inhibitor at first; each renewal adds its new one while the
        // old is still held (so at 2 or more: the stand-in may see the old
        // fd close after the next renewal's Inhibit, a CI run met 3);
        // zero only at the end.
        #expect(history.first == "add 1")
        #expect(history.last == "remove 0")
        #expect(!history.dropLast().contains("remove 0"), "a moment without an inhibitor: \(history)")
        let adds = history.filter { $0.hasPrefix("add ") }.compactMap { Int($0.dropFirst(4)) }
        #expect(adds.count == 6 && adds.dropFirst().allSatisfy { $0 >= 2 }, "\(history)")
    }

    /// Real logind answers Inhibit with OperationInProgress while its own
    /// sleep operation finishes, right after a resume: a lease taken or
    /// renewed then waits for it (bounded) instead of failing.
    @Test func sleepInProgressIsWaitedOutNotAFailure() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let observer = try await standIn.bus.connect()
        let registry = LeaseRegistry(clock: ManualClock(), backend: LogindPowerBackend(connection: host))
        let hold = PowerHold(what: ["sleep"], mode: "block")

        _ = try await standIn.call(observer, "RefuseInhibits", [.uint32(3)], test: true)
        let id = try await registry.acquire(strategy: "tick", LeaseRequest(holds: "run", reason: "woken run", budget: .seconds(60), power: hold))
        #expect(await registry.state(of: id) == .active)

        _ = try await standIn.call(observer, "RefuseInhibits", [.uint32(3)], test: true)
        let renewed = try await registry.renew(id)
        #expect(renewed.state == .active && renewed.renewals == 1)
        let history = try await standIn.history(observer)
        #expect(history.filter { $0 == "refused" }.count == 6, "\(history)")
        #expect(try await standIn.waitForCount(observer, 1))
        await registry.release(id)
    }

    @Test func badInhibitRequestsAreRefusedClearly() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let registry = LeaseRegistry(clock: ManualClock(), backend: LogindPowerBackend(connection: host))
        do {
            try await registry.acquire(strategy: "s", LeaseRequest(holds: "h", reason: "r", power: PowerHold(what: ["naptime"], mode: "block")))
            Issue.record("logind accepted an unknown what")
        } catch let error as LeaseError {
            #expect(error.code == .backendFailed)
            #expect(error.message.contains("logind refused Inhibit(naptime, block)"), "\(error.message)")
        }
    }

    @Test func delayLockHoldsSleepUntilOnSleepFinishes() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let observer = try await standIn.bus.connect()
        let backend = LogindPowerBackend(connection: host)
        let ran = Counter()
        let watch = try await backend.watchSleep(who: "vigil") {
            // An on_sleep hook that takes a while: sleep must wait for it.
            try? await Task.sleep(for: .milliseconds(300))
            await ran.increment()
        }
        defer { watch.cancel() }
        #expect(try await standIn.waitForCount(observer, 1))
        let reply = try await standIn.call(observer, "SimulateSleep", [.uint64(5_000_000)], test: true)
        let waited = try reply.argument(0, as: UInt64.self)
        let timedOut = try reply.argument(1, as: Bool.self)
        #expect(!timedOut)
        #expect(await ran.value == 1, "on_sleep finished before the system was let to sleep")
        #expect(waited >= 300_000, "sleep waited \(waited) µs for a 300 ms hook")
        // After resume the delay lock is taken again for the next sleep.
        #expect(try await standIn.waitForCount(observer, 1))
    }

    /// A peer's unicast PrepareForSleep reaches vigild's connection whatever
    /// its match rules say; only logind's current owner counts.
    @Test func forgedPrepareForSleepIsIgnored() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let host = try await standIn.bus.connect()
        let observer = try await standIn.bus.connect()
        let forger = try await standIn.bus.connect()
        let backend = LogindPowerBackend(connection: host)
        let ran = Counter()
        let watch = try await backend.watchSleep(who: "vigil") { await ran.increment() }
        defer { watch.cancel() }
        #expect(try await standIn.waitForCount(observer, 1))
        try await forger.emitSignal(path: "/org/freedesktop/login1", interface: "org.freedesktop.login1.Manager",
                                    name: "PrepareForSleep", arguments: [.bool(true)], destination: await host.uniqueName)
        // Through the bus and back: the forgery is queued to vigild before the real sleep.
        _ = try await forger.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                  interface: "org.freedesktop.DBus", member: "GetId")
        _ = try await standIn.call(observer, "SimulateSleep", [.uint64(5_000_000)], test: true)
        // Re-taken after the resume: both PrepareForSleep(true) were handled by now.
        #expect(try await standIn.waitForCount(observer, 1))
        let runs = await ran.value
        #expect(runs == 1, "on_sleep ran \(runs) times for one real sleep")
        for connection in [host, observer, forger] { await connection.close() }
    }
}

@Suite(.serialized) struct PowerChoiceTests {
    struct NoBus: Error {}

    func sysfs() throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-power-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for f in ["wake_lock", "wake_unlock"] { FileManager.default.createFile(atPath: "\(dir)/\(f)", contents: nil) }
        return dir
    }

    @Test func autoPrefersLogindThenWakelockThenNone() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let dir = try sysfs()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // A generous probe: the whole suite on two cores once kept the
        // stand-in's answer past the default 3 s.
        let logind = try await PowerChoice.auto.select(wakelockDir: dir, probeTimeout: .seconds(30)) { try await standIn.bus.connect() }
        #expect(logind.name == "logind")
        #expect(logind.reason.contains("org.freedesktop.login1 owns its name"))
        let wakelock = try await PowerChoice.auto.select(wakelockDir: dir) { throw NoBus() }
        #expect(wakelock.name == "wakelock")
        #expect(wakelock.reason == "auto: no system bus (none, or no answer within 3s); \(dir)/wake_lock is writable")
        let none = try await PowerChoice.auto.select(wakelockDir: "/nonexistent") { throw NoBus() }
        #expect(none.name == "none")
        #expect(none.reason == "auto: no system bus (none, or no answer within 3s), /nonexistent/wake_lock is not writable; leases are tracked only")
    }

    /// A user service without polkit's consent: logind owns its name but
    /// refuses the user's inhibitors, so auto falls through to what works.
    @Test func autoSkipsALogindThatRefusesThisUser() async throws {
        let standIn = try LogindStandIn()
        defer { standIn.stop() }
        let observer = try await standIn.bus.connect()
        _ = try await standIn.call(observer, "DenyInhibits", [.bool(true)], test: true)
        let chosen = try await PowerChoice.auto.select(wakelockDir: "/nonexistent", probeTimeout: .seconds(30)) { try await standIn.bus.connect() }
        #expect(chosen.name == "none")
        #expect(chosen.reason.hasPrefix("auto: logind refuses this user's inhibitors ("), "\(chosen.reason)")
        #expect(chosen.reason.contains("AccessDenied"), "\(chosen.reason)")
        // Granted again: logind it is, and its probe left no inhibitor.
        _ = try await standIn.call(observer, "DenyInhibits", [.bool(false)], test: true)
        let logind = try await PowerChoice.auto.select(wakelockDir: "/nonexistent", probeTimeout: .seconds(30)) { try await standIn.bus.connect() }
        #expect(logind.name == "logind")
        #expect(try await standIn.waitForCount(observer, 0))
        await observer.close()
    }

    @Test func autoSkipsABusWithoutLogind() async throws {
        let bus = try HostBusDaemon()
        defer { bus.stop() }
        let chosen = try await PowerChoice.auto.select(wakelockDir: "/nonexistent") { try await bus.connect() }
        #expect(chosen.name == "none")
        #expect(chosen.reason.hasPrefix("auto: logind is not on the system bus"))
    }

    @Test func autoDoesNotWaitForASystemBusThatNeverAnswers() async throws {
        let started = ContinuousClock.now
        let chosen = try await PowerChoice.auto.select(wakelockDir: "/nonexistent", probeTimeout: .milliseconds(200)) {
            try await Task.sleep(for: .seconds(30))
            throw NoBus()
        }
        #expect(chosen.name == "none")
        #expect(chosen.reason.hasPrefix("auto: no system bus (none, or no answer within 200ms)"))
        #expect(ContinuousClock.now - started < .seconds(10), "start-up waited for a silent bus")
    }

    @Test func explicitChoicesThatCannotWorkAreErrors() async throws {
        await #expect(throws: PowerBackendError.self) {
            try await PowerChoice.wakelock.select(wakelockDir: "/nonexistent") { throw NoBus() }
        }
        do {
            _ = try await PowerChoice.logind.select(wakelockDir: "/sys/power") { throw NoBus() }
            Issue.record("logind chosen without a system bus")
        } catch let error as PowerBackendError {
            #expect(error.description.hasPrefix("power = \"logind\", but the system bus is unreachable"))
        }
        let none = try await PowerChoice.none.select(wakelockDir: "/nonexistent") { throw NoBus() }
        #expect(none.name == "none")
    }
}
