import VigilKit
#if canImport(Glibc)
import Glibc
#endif

/// The plugin's entry point: the host calls it after dlopen.
@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([PeriodicWakeKind()])
}

/// `periodic-wake`: the Linux counterpart of iOS location-update wakes. Runs a
/// command every `every`, anywhere inside a window of `tolerance` after each
/// nominal time so wakes of the whole host coalesce, optionally aligned to
/// global slots and on a clock that wakes a suspended system.
public struct PeriodicWakeKind: StrategyKind {
    public init() {}
    public var name: String { "periodic-wake" }
    public var summary: String { "run a command on a coalesced, optionally system-waking schedule" }

    public func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let every = config.requirePositiveDuration("every")
        let tolerance = config.duration("tolerance", default: every / 10)
        if tolerance > every {
            config.problem("tolerance", "must not exceed `every` (\(every.vigilDescription)), found \(tolerance.vigilDescription)")
        }
        // `align = true` aligns to multiples of `every`; a duration picks the slot.
        var align: Duration?
        config.declare("align")
        switch config.values["align"] {
        case nil, .boolean(false): align = nil
        case .boolean(true): align = every
        case .string: align = config.positiveDuration("align")
        case let other?: config.problem("align", "expected true, false or a slot duration such as \"5m\", found \(other.typeName)")
        }
        let wakeSystem = config.bool("wake_system", default: false)
        let catchUp = CatchUp(rawValue: config.choice("catch_up", CatchUp.allCases.map(\.rawValue), default: CatchUp.once.rawValue)) ?? .once
        let run = config.requireArgv("run")
        let runTimeout = config.positiveDuration("run_timeout", default: min(every, .seconds(600)))
        let startImmediately = config.bool("run_at_start", default: false)
        let maxCatchUp = config.integer("max_catch_up", default: 10, range: 1...1_000)
        let persistent = config.bool("persistent", default: false)
        let randomizedDelay = config.duration("randomized_delay", default: .zero)
        if randomizedDelay > every {
            config.problem("randomized_delay", "must not exceed `every` (\(every.vigilDescription)), found \(randomizedDelay.vigilDescription)")
        }
        let fixedRandomDelay = config.bool("fixed_random_delay", default: false)
        if fixedRandomDelay, randomizedDelay == .zero {
            config.problem("fixed_random_delay", "only applies with a randomized_delay above zero")
        }
        return PeriodicWake(
            every: every, tolerance: tolerance, align: align, wakeSystem: wakeSystem, catchUp: catchUp,
            run: run, runTimeout: runTimeout, runAtStart: startImmediately, maxCatchUp: Int(maxCatchUp),
            persistent: persistent, randomizedDelay: randomizedDelay,
            fixedDelay: fixedRandomDelay ? Self.fixedDelay(host: HostIdentity.current(), strategy: config.strategyName, within: randomizedDelay) : nil
        )
    }

    /// A delay in [0, `range`] that depends only on the host and the
    /// strategy's name, as systemd's `FixedRandomDelay=` (there: a hash of
    /// the machine id and the unit name), so that hosts sharing a config
    /// spread out while each keeps its own time from run to run.
    static func fixedDelay(host: String, strategy: String, within range: Duration) -> Duration {
        guard range > .zero else { return .zero }
        // FNV-1a (64 bit): stable across processes and builds, unlike Hasher.
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in Array(host.utf8) + [0] + Array(strategy.utf8) {
            hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        }
        return .nanoseconds(Int64(hash % (UInt64(range.nanoseconds) + 1)))
    }
}

/// What to do about wakes missed during a suspend or stall.
public enum CatchUp: String, CaseIterable, Sendable {
    /// Run nothing for missed periods; carry on at the next nominal time.
    case skip
    /// Run once now for all missed periods, then carry on.
    case once
    /// Run once for every missed period (at most `max_catch_up`), then carry on.
    case all
}

public struct PeriodicWake: KeepAliveStrategy {
    public let every: Duration
    public let tolerance: Duration
    public let align: Duration?
    public let wakeSystem: Bool
    public let catchUp: CatchUp
    public let run: [String]
    public let runTimeout: Duration
    public let runAtStart: Bool
    public let maxCatchUp: Int
    /// Keep the last run's time in the store and catch up (per `catchUp`)
    /// on periods missed while the host was stopped, as systemd's `Persistent=`.
    public var persistent = false
    /// Each run is delayed by a random time up to this, as `RandomizedDelaySec=`.
    public var randomizedDelay: Duration = .zero
    /// The delay used instead of a random one (`fixed_random_delay`).
    public var fixedDelay: Duration?

    /// The store key of the last run's wall-clock time (microseconds since
    /// the Unix epoch, in decimal): wall time, since boottime restarts at 0
    /// with each boot.
    static let lastRunKey = "last-run"

    /// This period's extra delay: fixed, or drawn anew.
    private func extraDelay() -> Duration {
        if let fixedDelay { return fixedDelay }
        guard randomizedDelay > .zero else { return .zero }
        return .nanoseconds(Int64.random(in: 0...randomizedDelay.nanoseconds))
    }

    /// Where the schedule starts: the first nominal time, and how many
    /// nominal times passed while the host was stopped (`persistent`: the
    /// first of them is the nominal time returned).
    private func start(_ context: StrategyContext) async -> (nominal: VigilInstant, overdue: Int) {
        let now = context.clock.now
        let fresh = (nominal: now + (runAtStart ? .zero : every), overdue: 0)
        guard persistent else { return fresh }
        let stored: [UInt8]?
        do {
            stored = try await context.store.get(Self.lastRunKey)
        } catch {
            context.log.warning("cannot read the last run's time from the store (\(error)); starting a new schedule")
            return fresh
        }
        guard let stored else { return fresh }
        guard let text = String(validating: stored, as: UTF8.self), text.utf8.count <= 20, let lastWall = Int64(text) else {
            context.log.warning("ignoring a malformed last-run record in the store")
            return fresh
        }
        let elapsed = Duration.microseconds(context.clock.wallMicroseconds - lastWall)
        guard elapsed >= .zero else {
            context.log.warning("the last run is recorded in the future (the wall clock went back); starting a new schedule")
            return fresh
        }
        // The last run on this boot's timeline; its grid continues.
        let last = now - elapsed
        let overdue = Int(elapsed / every)
        return (overdue == 0 && runAtStart ? now : last + every, overdue)
    }

    /// Records that a run begins now.
    private func recordRun(_ context: StrategyContext) async {
        guard persistent else { return }
        do {
            try await context.store.put(Self.lastRunKey, Array(String(context.clock.wallMicroseconds).utf8))
        } catch {
            context.log.warning("cannot record the run's time in the store: \(error)")
        }
    }

    public func run(in context: StrategyContext) async throws {
        let canWake = context.scheduler.clockInfo.canWakeSystem
        if wakeSystem && !canWake {
            context.log.warning("wake_system is set but this host cannot wake a suspended system: \(context.scheduler.clockInfo.reason); wakes run on \(context.scheduler.clockInfo.clock) and are delayed while suspended")
        }
        var (nominal, overdueAtStart) = await start(context)
        if overdueAtStart > 0 {
            context.log.notice("persistent: \(overdueAtStart) run(s) fell due while the host was stopped; catch_up = \(catchUp.rawValue)")
        }
        var sequence = 0
        // run_at_start: the first run is due now (`start`).
        var dueNow = nominal <= context.clock.now
        while true {
            try Task.checkCancellation()
            // Overdue at start: at once, without a random delay.
            let catchingUp = overdueAtStart > 0
            // Overdue, or the run at start: at once, without a random delay
            // and not moved to a slot (which could be a whole tolerance away).
            let immediate = catchingUp || dueNow
            dueNow = false
            let delay = immediate ? .zero : extraDelay()
            let earliest = immediate ? context.clock.now : nominal + delay
            let firing = try await context.scheduler.wake(WakeRequest(
                earliest: earliest, latest: earliest + (immediate ? .zero : tolerance), align: immediate ? nil : align,
                wakeSystem: wakeSystem, label: "\(context.name) periodic-wake"
            ))
            let now = context.clock.now
            // Periods after the first whose time passed before we woke:
            // while the host was stopped (persistent), suspended or stalled.
            let missed = catchingUp ? overdueAtStart - 1 : now > earliest + tolerance ? Int((now - earliest) / every) : 0
            overdueAtStart = 0
            let runs: Int
            switch catchUp {
            case _ where missed == 0 && !catchingUp: runs = 1
            case .skip: runs = 0
            case .once: runs = 1
            case .all: runs = min(missed + 1, maxCatchUp)
            }
            var fields: [String: String] = [
                "lateness_ms": String(format3(firing.lateness)),
                "batch": String(firing.batchSize),
                "missed": String(missed),
                "alarm_clock": String(firing.onAlarmClock),
            ]
            if randomizedDelay > .zero { fields["random_delay_ms"] = String(format3(delay)) }
            if missed > 0 && !catchingUp {
                context.log.notice("woke \(missed) period(s) late (suspend or stall); catch_up = \(catchUp.rawValue): running \(runs) time(s)")
            }
            if runs > 0 { await recordRun(context) }
            for i in 0..<runs {
                sequence += 1
                let result = try await runCommand(context, sequence: sequence, lateness: firing.lateness, catchUpIndex: i)
                fields["exit"] = result.exit.description
                fields["duration_ms"] = String(format3(result.duration))
                fields["sequence"] = String(sequence)
                await context.events.record("wake", fields)
            }
            if runs == 0 {
                // Skipped periods count as done: a later start does not catch up on them again.
                await recordRun(context)
                await context.events.record("wake-skipped", fields)
            }
            // The next nominal time after now, on the original grid.
            nominal = nominal + every * (missed + 1)
            while nominal + tolerance < context.clock.now { nominal = nominal + every }
        }
    }

    private func runCommand(_ context: StrategyContext, sequence: Int, lateness: Duration, catchUpIndex: Int) async throws -> HookResult {
        // A short lease covers the command, budgeted at its timeout: a command
        // that hangs cannot hold the system forever.
        let request = LeaseRequest(
            holds: "command \(run[0])", reason: "periodic-wake run #\(sequence)",
            budget: runTimeout + .seconds(5), grace: .seconds(1), power: PowerHold(what: ["sleep"], mode: "block")
        )
        return try await context.leases.withLease(request) { _ in
            let result = await context.hooks.run(
                HookCommand(argv: run, timeout: runTimeout),
                event: "wake",
                variables: ["sequence": String(sequence), "lateness_ms": String(format3(lateness)), "catch_up_index": String(catchUpIndex)]
            )
            if result.exit.succeeded {
                context.log.info("run #\(sequence) \(result.exit) after \(format3(result.duration)) ms (woke \(format3(lateness)) ms late)")
            } else {
                context.log.warning("run #\(sequence) \(result.exit) after \(format3(result.duration)) ms")
            }
            return result
        }
    }
}

/// Milliseconds with three decimals, for logs and event fields.
func format3(_ d: Duration) -> Double {
    (Double(d.nanoseconds) / 1_000).rounded() / 1_000
}

/// What identifies this host for `fixed_random_delay`.
enum HostIdentity {
    /// The machine id (`/etc/machine-id`, 32 hex digits), else the host name.
    static func current() -> String {
        if let id = machineID() { return id }
        var name = [CChar](repeating: 0, count: 256)
        guard gethostname(&name, name.count - 1) == 0 else { return "" }
        return String(cString: name)
    }

    private static func machineID() -> String? {
        let fd = open("/etc/machine-id", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        // 32 hex digits and a newline; anything longer is not a machine id.
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = read(fd, &buffer, buffer.count)
        guard n > 0 else { return nil }
        let id = String(decoding: buffer[0..<n], as: UTF8.self).filter { !$0.isWhitespace }
        guard id.utf8.count == 32, id.allSatisfy({ $0.isHexDigit }) else { return nil }
        return id
    }
}
