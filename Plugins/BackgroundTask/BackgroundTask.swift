import VigilKit

@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([BackgroundTaskKind()])
}

/// `background-task`: iOS `beginBackgroundTask` with renewal, on Linux. Holds
/// a lease with a budget on the system (logind inhibitor or wake lock, per the
/// host's power backend), checks it every `check_every` and renews it when the
/// remaining time falls below `renew_when`. It ends when `command` exits, or
/// after `max_duration` (then `on_complete` runs), or never.
public struct BackgroundTaskKind: StrategyKind {
    public init() {}
    public var name: String { "background-task" }
    public var summary: String { "hold the system awake with a renewable, budgeted lease around a job or command" }

    static let whats = ["sleep", "idle", "shutdown", "handle-power-key", "handle-suspend-key", "handle-hibernate-key", "handle-lid-switch"]

    public func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let what = config.stringArray("what") ?? ["sleep"]
        for w in what where !Self.whats.contains(w) {
            let hint = Spelling.suggestion(for: w, among: Self.whats).map { " (did you mean \"\($0)\"?)" } ?? ""
            config.problem("what", "unknown inhibitor \"\(w)\"\(hint); expected some of \(Self.whats.joined(separator: ", "))")
        }
        if what.isEmpty { config.problem("what", "expected at least one of \(Self.whats.joined(separator: ", "))") }
        let mode = config.choice("mode", ["block", "delay"], default: "block")
        if mode == "delay", what.contains(where: { $0 != "sleep" && $0 != "shutdown" }) {
            config.problem("mode", "delay locks only apply to sleep and shutdown")
        }
        let budget = config.positiveDuration("budget", default: .seconds(180))
        let renewWhen = Self.renewThreshold(config, budget: budget)
        let checkEvery = config.positiveDuration("check_every", default: max(.seconds(1), min(renewWhen / 2, .seconds(25))))
        if checkEvery >= renewWhen {
            config.problem("check_every", "must be shorter than renew_when (\(renewWhen.vigilDescription)), or a check can miss the renewal window")
        }
        let maxDuration = config.positiveDuration("max_duration")
        let command = config.argv("command")
        let onExpire = config.argv("on_expire")
        let onComplete = config.argv("on_complete")
        let hookTimeout = config.positiveDuration("hook_timeout", default: .seconds(30))
        let grace = config.positiveDuration("grace", default: .seconds(5))
        let reason = config.string("reason", default: command.map { "running \($0[0])" } ?? "background task")
        return BackgroundTask(
            hold: PowerHold(what: what, mode: mode), budget: budget, renewWhen: renewWhen, checkEvery: checkEvery,
            maxDuration: maxDuration, command: command, onExpire: onExpire, onComplete: onComplete,
            hookTimeout: hookTimeout, grace: grace, reason: reason)
    }

    /// `renew_when`: a duration ("60s") or a fraction of the budget (0.25 or
    /// "25%"); default a quarter of the budget.
    static func renewThreshold(_ config: ConfigReader, budget: Duration) -> Duration {
        config.declare("renew_when")
        let fraction: Double
        switch config.values["renew_when"] {
        case nil:
            fraction = 0.25
        case .float(let f)?:
            fraction = f
        case .string(let s)? where s.hasSuffix("%"):
            guard let p = Double(s.dropLast()) else {
                config.problem("renew_when", "expected a percentage such as \"25%\", found \"\(s)\"")
                return budget / 4
            }
            fraction = p / 100
        case .string?, .integer?:
            guard let d = config.positiveDuration("renew_when") else { return budget / 4 }
            if d >= budget {
                config.problem("renew_when", "must be less than the budget (\(budget.vigilDescription)), found \(d.vigilDescription)")
            }
            return d
        case let other?:
            config.problem("renew_when", "expected a duration (\"60s\") or a fraction of the budget (0.25 or \"25%\"), found \(other.typeName)")
            return budget / 4
        }
        guard fraction > 0, fraction < 1 else {
            config.problem("renew_when", "a fraction of the budget must be between 0 and 1 (exclusive), found \(fraction)")
            return budget / 4
        }
        return .nanoseconds(Int64(Double(budget.nanoseconds) * fraction))
    }
}

public struct BackgroundTask: KeepAliveStrategy {
    let hold: PowerHold
    let budget: Duration
    let renewWhen: Duration
    let checkEvery: Duration
    let maxDuration: Duration?
    let command: [String]?
    let onExpire: [String]?
    let onComplete: [String]?
    let hookTimeout: Duration
    let grace: Duration
    let reason: String

    public func run(in context: StrategyContext) async throws {
        let hooks = context.hooks
        let onExpire = self.onExpire
        let timeout = min(hookTimeout, grace)
        let lease = try await context.leases.acquire(LeaseRequest(
            holds: command.map { "command \($0.joined(separator: " "))" } ?? "background task",
            reason: reason, budget: budget, grace: grace, power: hold,
            onExpire: { expiry in
                context.log.with(lease: expiry.lease).warning("lease \(expiry.lease) ran out of budget; expiration handler has \(expiry.grace.vigilDescription)")
                if let onExpire {
                    _ = await hooks.run(HookCommand(argv: onExpire, timeout: timeout), event: "expire", variables: ["lease": String(expiry.lease.rawValue)])
                }
            }))
        // The lines about this lease say which one (lease=<id>).
        let log = context.log.with(lease: lease.id)
        let started = context.clock.now
        var deadline = started + budget
        await context.events.record("task-started", ["lease": String(lease.id.rawValue), "budget_ms": String(budget.microseconds / 1_000)])

        // The job: a command, or nothing (hold until max_duration or stop).
        let outcome = JobOutcome()
        let job: Task<HookResult?, Never>? = command.map { argv in
            // Unstructured task: cancelled by the defer below when run(in:) returns or throws (the
            // strategy stopped).
            Task {
                let result = await hooks.run(HookCommand(argv: argv, timeout: maxDuration ?? .seconds(365 * 86_400)), event: "command", variables: [:])
                await outcome.finish(result)
                return result
            }
        }
        defer { job?.cancel() }

        let end = maxDuration.map { started + $0 }
        while true {
            if let result = await outcome.result {
                await lease.release()
                log.info("command \(result.exit)")
                await context.events.record("task-finished", ["exit": result.exit.description])
                return
            }
            if let end, context.clock.now >= end {
                await lease.release()
                log.info("max_duration \(maxDuration?.vigilDescription ?? "") reached")
                await context.events.record("task-completed", ["max_duration": maxDuration?.vigilDescription ?? ""])
                if let onComplete {
                    let result = await hooks.run(HookCommand(argv: onComplete, timeout: hookTimeout), event: "complete", variables: [:])
                    await context.events.record("on_complete", ["exit": result.exit.description])
                }
                return
            }
            // Next check: every check_every, but not past the end.
            var next = context.clock.now + checkEvery
            if let end { next = min(next, end) }
            if job != nil {
                // Wake early when the command exits.
                try await waitUntil(next, orFinished: outcome, context)
            } else {
                _ = try await context.scheduler.wake(WakeRequest(earliest: next, latest: next, label: "\(context.name) check"))
            }
            let remaining = deadline - context.clock.now
            if remaining < renewWhen, await lease.state == .active {
                try await lease.renew(budget: budget)
                deadline = context.clock.now + budget
                log.debug("renewed with \(remaining.vigilDescription) left")
            }
        }
    }

    /// Returns at `instant`, or earlier when the command exits. Neither
    /// waiter outlives the other: awaiting the job's task itself (as this
    /// did) ignores cancellation, so the group waited for the command's end
    /// at every check (no renewal while it ran) and at shutdown (vigild did
    /// not stop while a long command ran).
    private func waitUntil(_ instant: VigilInstant, orFinished outcome: JobOutcome, _ context: StrategyContext) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await outcome.finished() }
            group.addTask { _ = try await context.scheduler.wake(WakeRequest(earliest: instant, latest: instant, label: "\(context.name) check")) }
            try await group.next()
            group.cancelAll()
        }
        // Stopped: the command's waiter returns at once when cancelled, so
        // the group can end without the clock's error; without this check
        // the loop above would go round without waiting.
        try Task.checkCancellation()
    }
}

/// The command's result once it has exited.
actor JobOutcome {
    private(set) var result: HookResult?
    private var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    private var nextWaiter = 0

    func finish(_ r: HookResult) {
        result = r
        for waiter in waiters.values { waiter.resume() }
        waiters = [:]
    }

    /// Returns once the command has exited, or as soon as the calling task
    /// is cancelled.
    func finished() async {
        guard result == nil else { return }
        let id = nextWaiter
        nextWaiter += 1
        await withTaskCancellationHandler {
            await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
                if result != nil || Task.isCancelled {
                    waiter.resume()
                } else {
                    waiters[id] = waiter
                }
            }
        } onCancel: {
            // Unstructured task: not cancelled: one hop into this actor to end one wait.
            Task { await self.stopWaiting(id) }
        }
    }

    private func stopWaiting(_ id: Int) {
        waiters.removeValue(forKey: id)?.resume()
    }
}
