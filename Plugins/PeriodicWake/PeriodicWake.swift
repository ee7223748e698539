import VigilKit

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
        return PeriodicWake(
            every: every, tolerance: tolerance, align: align, wakeSystem: wakeSystem, catchUp: catchUp,
            run: run, runTimeout: runTimeout, runAtStart: startImmediately, maxCatchUp: Int(maxCatchUp)
        )
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

    public func run(in context: StrategyContext) async throws {
        let canWake = context.scheduler.clockInfo.canWakeSystem
        if wakeSystem && !canWake {
            context.log.warning("wake_system is set but this host cannot wake a suspended system: \(context.scheduler.clockInfo.reason); wakes run on \(context.scheduler.clockInfo.clock) and are delayed while suspended")
        }
        var nominal = context.clock.now + (runAtStart ? .zero : every)
        var sequence = 0
        while true {
            try Task.checkCancellation()
            let firing = try await context.scheduler.wake(WakeRequest(
                earliest: nominal, latest: nominal + tolerance, align: align,
                wakeSystem: wakeSystem, label: "\(context.name) periodic-wake"
            ))
            let now = context.clock.now
            // Periods whose whole window passed before we woke (suspend, stall).
            let missed = now > nominal + tolerance ? Int((now - nominal) / every) : 0
            let runs: Int
            switch catchUp {
            case _ where missed == 0: runs = 1
            case .skip: runs = 0
            case .once: runs = 1
            case .all: runs = min(missed + 1, maxCatchUp)
            }
            var fields = [
                "lateness_ms": String(format3(firing.lateness)),
                "batch": String(firing.batchSize),
                "missed": String(missed),
                "alarm_clock": String(firing.onAlarmClock),
            ]
            if missed > 0 {
                context.log.notice("woke \(missed) period(s) late (suspend or stall); catch_up = \(catchUp.rawValue): running \(runs) time(s)")
            }
            for i in 0..<runs {
                sequence += 1
                let result = try await runCommand(context, sequence: sequence, lateness: firing.lateness, catchUpIndex: i)
                fields["exit"] = result.exit.description
                fields["duration_ms"] = String(format3(result.duration))
                fields["sequence"] = String(sequence)
                await context.events.record("wake", fields)
            }
            if runs == 0 { await context.events.record("wake-skipped", fields) }
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
