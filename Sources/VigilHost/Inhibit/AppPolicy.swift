import Foundation
import VigilKit

/// One pattern of `app_max` or `app_budget` and its duration.
public struct AppLimitRule: Sendable, Equatable {
    public var pattern: String
    public var limit: Duration

    public init(_ pattern: String, _ limit: Duration) {
        self.pattern = pattern
        self.limit = limit
    }
}

/// `[host] app_max` and `app_budget`: a cap per app on how long one lease
/// may hold, and a rolling 24-hour budget per app of awake time, for apps'
/// inhibits and for BeginBackgroundTask client leases
/// (docs/desktop-integration.md, "Who may keep this machine awake").
public struct AppLimitSettings: Sendable, Equatable {
    /// Caps by pattern (`app_max`).
    public var caps: [AppLimitRule] = []
    /// Rolling 24-hour budgets by pattern (`app_budget`).
    public var budgets: [AppLimitRule] = []

    public init(caps: [AppLimitRule] = [], budgets: [AppLimitRule] = []) {
        self.caps = caps
        self.budgets = budgets
    }

    /// The window a budget counts over: 24 hours of awake time.
    public static let window: Duration = .seconds(24 * 3600)
}

/// The rule of `rules` that applies to an app: of those whose pattern
/// matches one of `subjects` (the app's name, its executable), a pattern
/// without wildcards first, then the longest, then the first in byte order.
/// So `"mpv"` beats `"mp*"`, which beats `"*"`, whatever the file's order.
func mostSpecific(_ rules: [AppLimitRule], matching subjects: [String]) -> AppLimitRule? {
    rules.filter { rule in subjects.contains { fnmatch(rule.pattern, $0, 0) == 0 } }
        .min { a, b in
            let (wa, wb) = (hasWildcard(a.pattern), hasWildcard(b.pattern))
            if wa != wb { return !wa }
            if a.pattern.utf8.count != b.pattern.utf8.count { return a.pattern.utf8.count > b.pattern.utf8.count }
            return Array(a.pattern.utf8).lexicographicallyPrecedes(Array(b.pattern.utf8))
        }
}

private func hasWildcard(_ pattern: String) -> Bool { pattern.contains { $0 == "*" || $0 == "?" || $0 == "[" } }

/// Who may keep the machine awake, and for how long: the caps and rolling
/// budgets of `[host] app_max` / `app_budget`, and the rules added live
/// (`vigilctl inhibitors --deny` / `--allow`, which last until vigild
/// stops). One policy serves apps' inhibits (``ForeignInhibits``) and
/// client leases (``ClientLeases``).
///
/// An app's budget counts the awake time during which it held at least one
/// lease (two leases held at once count once), over the last 24 hours of
/// awake time, on the registry's budget clock. A lease's budget is the
/// least of what was asked, its cap and what is left of the app's budget
/// when it is granted; time that later leaves the 24-hour window is not
/// given back to a lease already held.
public actor AppPolicy {
    /// A rule added live.
    public struct LiveRule: Sendable, Equatable {
        public enum Action: String, Sendable { case deny, allow }
        public var pattern: String
        public var action: Action
        /// When it lapses, on the budget clock; nil: until vigild stops.
        public var until: VigilInstant?
    }

    /// What the policy decided for a lease about to be granted.
    public struct Grant: Sendable, Equatable {
        /// The app the budget is counted for.
        public var app: String
        /// The cap and the rule it comes from.
        public var cap: AppLimitRule?
        /// The budget rule, and what was left of it at the grant.
        public var budget: AppLimitRule?
        public var budgetLeft: Duration?
        /// A live `--allow` matched: the config's deny and allow lists do not apply.
        public var liveAllowed: Bool
        /// The cap is `inhibit_max` (an inhibit no `app_max` names), not an `app_max` rule.
        public var capIsInhibitMax = false

        /// The least of `asked`, the cap and what is left of the budget.
        public func limit(_ asked: Duration?) -> Duration? {
            [asked, cap?.limit, budgetLeft].compactMap { $0 }.min()
        }

        /// Which rule ends a lease granted `asked`: "app_max \"mpv\" (3h)", or nil for its own budget.
        public func limitingRule(_ asked: Duration?) -> String? {
            guard let limit = limit(asked) else { return nil }
            if let cap, cap.limit == limit, asked.map({ $0 > limit }) ?? true {
                return "app_max \"\(ClientText.excerpt(cap.pattern))\" (\(cap.limit.vigilDescription))"
            }
            if let budget, let left = budgetLeft, left == limit, asked.map({ $0 > limit }) ?? true {
                return "app_budget \"\(ClientText.excerpt(budget.pattern))\" (\(budget.limit.vigilDescription) per 24h)"
            }
            return nil
        }
    }

    /// A held lease, as ``limits()`` shows it.
    public struct HeldLimit: Sendable, Equatable {
        public var lease: LeaseID
        public var app: String
        /// "app_max \"mpv\" 3h; app_budget \"*\" 6h per 24h", or "" when no rule applies.
        public var rule: String
        /// Time left under the cap and under the budget; nil: no such rule.
        public var capLeft: Duration?
        public var budgetLeft: Duration?
    }

    /// Refusals and expiries of one app since vigild started.
    public struct AppCount: Sendable, Equatable {
        public var app: String
        public var refused: UInt64 = 0
        public var expired: UInt64 = 0

        public init(app: String, refused: UInt64 = 0, expired: UInt64 = 0) {
            self.app = app
            self.refused = refused
            self.expired = expired
        }
    }

    private struct Usage {
        /// Closed spans of holding time, oldest first.
        var spans: [(start: VigilInstant, end: VigilInstant)] = []
        /// Since when the app holds at least one lease.
        var openSince: VigilInstant?
        var holding = 0
        var lastUsed: VigilInstant
    }

    private struct Held {
        var app: String
        var subjects: [String]
        var cap: AppLimitRule?
        var capIsInhibitMax: Bool
        var budget: AppLimitRule?
        var acquiredAt: VigilInstant
    }

    /// Most live rules at once; most apps whose usage and counts are kept.
    public static let maxLiveRules = 256
    public static let maxTrackedApps = 1024
    /// Most spans of holding time kept per app.
    static let maxSpansPerApp = 512
    /// The least budget a lease is granted: less left of an app's budget is spent.
    public static let leastGrant: Duration = .seconds(1)
    /// Longest a timed deny may last.
    public static let longestDeny: Duration = .seconds(3650 * 86400)
    /// Longest pattern a live rule takes, as the config's patterns.
    public static let patternLimit = ClientInputLimit("pattern", maximum: 256)
    /// Where counts of apps beyond ``maxTrackedApps`` go.
    public static let otherApps = "(other apps)"

    public nonisolated let settings: AppLimitSettings
    private let clock: any VigilClock
    private var live: [LiveRule] = []
    private var usage: [String: Usage] = [:]
    private var held: [LeaseID: Held] = [:]
    private var counts: [String: AppCount] = [:]
    /// Leases that ended before ``began(_:grant:subjects:)`` was told of
    /// them (a lease can expire or be released while its grant is still
    /// being recorded): they never count. Bounded; lease ids are not reused.
    private var endedFirst: Set<LeaseID> = []
    private var endedFirstOrder: [LeaseID] = []

    public init(settings: AppLimitSettings, clock: any VigilClock) {
        self.settings = settings
        self.clock = clock
    }

    // MARK: deciding

    /// Whether `subjects` (app name, executable) may hold a lease now, and
    /// with which limits. Throws, counting a refusal for `app`, when a live
    /// deny matches or the app's budget is spent.
    public func admit(app: String, subjects: [String], who: @autoclosure @Sendable () -> String) throws(ClientLeaseError) -> Grant {
        let now = clock.now
        dropLapsedRules(now)
        var grant = Grant(app: app, cap: mostSpecific(settings.caps, matching: subjects),
                          budget: mostSpecific(settings.budgets, matching: subjects), liveAllowed: false)
        if let rule = liveRule(matching: subjects) {
            if rule.action == .deny {
                count(app) { $0.refused += 1 }
                let until = rule.until.map { " for \(($0 - now).vigilDescription) more" } ?? " until vigild restarts"
                throw ClientLeaseError(.accessDenied, "\(who()) is denied by vigilctl inhibitors --deny \"\(ClientText.excerpt(rule.pattern))\"\(until)")
            }
            grant.liveAllowed = true
        }
        if let budget = grant.budget {
            let used = self.used(app, now: now)
            let left = budget.limit - used
            // Less than a second left is spent: a lease that would expire
            // before it is recorded is never granted.
            guard left >= Self.leastGrant else {
                count(app) { $0.refused += 1 }
                let rest = left > .zero ? " (\(left.vigilDescription) left, under the least grant of \(Self.leastGrant.vigilDescription))" : ""
                throw ClientLeaseError(.limitExceeded, "\(who()) is refused: it has held the machine for \(used.vigilDescription) of awake time in the last 24h, its whole app_budget \"\(ClientText.excerpt(budget.pattern))\" of \(budget.limit.vigilDescription) per 24h\(rest)")
            }
            grant.budgetLeft = left
        }
        return grant
    }

    /// Counts a refusal made elsewhere (the config's deny and allow lists).
    public func refused(app: String) { count(app) { $0.refused += 1 } }

    /// A lease was granted under `grant`: the app's budget counts from now.
    /// Returns why it may not be held after all: a live deny that came
    /// while it was being granted (after ``admit(app:subjects:who:)``, whose
    /// answer did not see it, and before ``deny(_:for:)`` could see the
    /// lease); then nothing is recorded, a refusal is counted, and the caller
    /// releases the lease.
    @discardableResult
    public func began(_ lease: LeaseID, grant: Grant, subjects: [String]) -> String? {
        guard endedFirst.remove(lease) == nil else { return nil }
        let now = clock.now
        dropLapsedRules(now)
        if let rule = liveRule(matching: subjects), rule.action == .deny {
            count(grant.app) { $0.refused += 1 }
            return "denied by vigilctl inhibitors --deny \"\(ClientText.excerpt(rule.pattern))\""
        }
        held[lease] = Held(app: grant.app, subjects: subjects, cap: grant.cap, capIsInhibitMax: grant.capIsInhibitMax, budget: grant.budget, acquiredAt: now)
        trackUsage(grant.app, now: now) { usage in
            if usage.holding == 0 { usage.openSince = now }
            usage.holding += 1
        }
        return nil
    }

    /// A lease of `app` reached its limit and is expiring (counted for
    /// `vigilctl cost` and the metrics).
    public func expiring(app: String) { count(app) { $0.expired += 1 } }

    /// A lease ended (any way): the app's budget stops counting when it held its last.
    public func ended(_ lease: LeaseID) {
        guard let entry = held.removeValue(forKey: lease) else {
            endedFirst.insert(lease)
            endedFirstOrder.append(lease)
            if endedFirstOrder.count > 1024 { endedFirst.remove(endedFirstOrder.removeFirst()) }
            return
        }
        let now = clock.now
        // Changed in place: a copy taken out of the table shares its spans,
        // and the append would copy all of them (up to maxSpansPerApp) on
        // every lease's end.
        guard let index = usage.index(forKey: entry.app) else { return }
        Self.close(&usage.values[index], now: now)
    }

    /// One lease of the app ended at `now`: when it held its last, the open
    /// span closes.
    private static func close(_ usage: inout Usage, now: VigilInstant) {
        usage.holding -= 1
        if usage.holding == 0, let since = usage.openSince {
            usage.spans.append((since, now))
            usage.openSince = nil
            // Bounded: past the limit the two oldest spans become one,
            // the gap between them counted as held (never less budget used).
            if usage.spans.count > Self.maxSpansPerApp {
                let merged = (start: usage.spans[0].start, end: usage.spans[1].end)
                usage.spans.replaceSubrange(0..<2, with: CollectionOfOne(merged))
            }
        }
        usage.lastUsed = now
    }

    /// How long a renewal of `lease` may last from now: the cap counts from
    /// the lease's start, the budget from what the app has left.
    public func renewalLimit(_ lease: LeaseID, asked: Duration) -> (limit: Duration, rule: String?) {
        guard let entry = held[lease] else { return (asked, nil) }
        let now = clock.now
        var limit = asked
        var rule: String?
        if let cap = entry.cap, cap.limit - (now - entry.acquiredAt) < limit {
            limit = cap.limit - (now - entry.acquiredAt)
            rule = "app_max \"\(ClientText.excerpt(cap.pattern))\" (\(cap.limit.vigilDescription))"
        }
        if let budget = entry.budget, budget.limit - used(entry.app, now: now) < limit {
            limit = budget.limit - used(entry.app, now: now)
            rule = "app_budget \"\(ClientText.excerpt(budget.pattern))\" (\(budget.limit.vigilDescription) per 24h)"
        }
        return (limit, rule)
    }

    // MARK: live rules

    /// Adds a live deny of `pattern` (replacing live rules of the same
    /// pattern), for `duration` or until vigild stops. Returns the held
    /// leases it matches, which the caller releases.
    public func deny(_ pattern: String, for duration: Duration?) throws(ClientLeaseError) -> [LeaseID] {
        try checkPattern(pattern)
        if let duration, duration > Self.longestDeny {
            // Past this the lapse time could overflow the clock; a deny that long is one until vigild stops.
            throw ClientLeaseError(.invalidArgument, "a deny lasts at most \(Self.longestDeny.vigilDescription); give 0 for one until vigild restarts")
        }
        let now = clock.now
        dropLapsedRules(now)
        live.removeAll { $0.pattern == pattern }
        guard live.count < Self.maxLiveRules else {
            throw ClientLeaseError(.limitExceeded, "there are \(live.count) live rules already, the most allowed (\(Self.maxLiveRules)); --allow some first")
        }
        live.append(LiveRule(pattern: pattern, action: .deny, until: duration.map { now + $0 }))
        return held.filter { entry in entry.value.subjects.contains { fnmatch(pattern, $0, 0) == 0 } }.keys.sorted()
    }

    /// Adds a live allow of `pattern`: it replaces a live deny of the same
    /// pattern, and overrides the config's `inhibit_deny` and `inhibit_allow`
    /// for the apps it matches, until vigild stops. Returns whether a live
    /// deny of that pattern was lifted.
    @discardableResult
    public func allow(_ pattern: String) throws(ClientLeaseError) -> Bool {
        try checkPattern(pattern)
        dropLapsedRules(clock.now)
        let lifted = live.contains { $0.pattern == pattern && $0.action == .deny }
        live.removeAll { $0.pattern == pattern }
        guard live.count < Self.maxLiveRules else {
            throw ClientLeaseError(.limitExceeded, "there are \(live.count) live rules already, the most allowed (\(Self.maxLiveRules))")
        }
        live.append(LiveRule(pattern: pattern, action: .allow, until: nil))
        return lifted
    }

    /// The live rules in force, oldest first, with the time each has left.
    public func liveRules() -> [(rule: LiveRule, left: Duration?)] {
        let now = clock.now
        dropLapsedRules(now)
        return live.map { ($0, $0.until.map { $0 - now }) }
    }

    // MARK: what the person sees

    /// Every held lease under the policy, with its rule and time left.
    public func limits() -> [HeldLimit] {
        let now = clock.now
        return held.keys.sorted().compactMap { id in
            guard let entry = held[id] else { return nil }
            let capLeft = entry.cap.map { max(.zero, $0.limit - (now - entry.acquiredAt)) }
            let budgetLeft = entry.budget.map { max(.zero, $0.limit - used(entry.app, now: now)) }
            var rules: [String] = []
            if let cap = entry.cap {
                rules.append(entry.capIsInhibitMax ? "inhibit_max \(cap.limit.vigilDescription)" : "app_max \"\(cap.pattern)\" \(cap.limit.vigilDescription)")
            }
            if let budget = entry.budget { rules.append("app_budget \"\(budget.pattern)\" \(budget.limit.vigilDescription) per 24h") }
            return HeldLimit(lease: id, app: entry.app, rule: rules.joined(separator: "; "), capLeft: capLeft, budgetLeft: budgetLeft)
        }
    }

    /// Refusals and expiries per app since vigild started, by app name.
    public func appCounts() -> [AppCount] {
        counts.values.sorted { Array($0.app.utf8).lexicographicallyPrecedes(Array($1.app.utf8)) }
    }

    /// The same by app name, as the survival log stores them.
    public func appCountsByName() -> [String: AppRequestCount] {
        counts.mapValues { AppRequestCount(refused: $0.refused, expired: $0.expired) }
    }

    /// Awake time `app` held the machine in the 24 hours before `now`.
    public func used(_ app: String, now: VigilInstant) -> Duration {
        guard let usage = usage[app] else { return .zero }
        let windowStart = now - AppLimitSettings.window
        var total = Duration.zero
        for span in usage.spans where span.end > windowStart {
            total += span.end - max(span.start, windowStart)
        }
        if let since = usage.openSince { total += now - max(since, windowStart) }
        return total
    }

    /// Spans of holding time kept for `app` (bounded by ``maxSpansPerApp``).
    func spanCount(_ app: String) -> Int { usage[app]?.spans.count ?? 0 }

    // MARK: internals

    private func checkPattern(_ pattern: String) throws(ClientLeaseError) {
        do {
            try Self.patternLimit.check(pattern)
        } catch {
            throw ClientLeaseError(.invalidArgument, error.message)
        }
        guard !pattern.isEmpty, !pattern.utf8.contains(0) else {
            throw ClientLeaseError(.invalidArgument, "expected a shell pattern such as \"steam\" or \"/usr/bin/*\", found \"\(ClientText.excerpt(pattern))\"")
        }
    }

    /// The newest live rule that matches one of `subjects`.
    private func liveRule(matching subjects: [String]) -> LiveRule? {
        live.last { rule in subjects.contains { fnmatch(rule.pattern, $0, 0) == 0 } }
    }

    private func dropLapsedRules(_ now: VigilInstant) {
        live.removeAll { $0.until.map { $0 <= now } ?? false }
    }

    private func count(_ app: String, _ change: (inout AppCount) -> Void) {
        let key = counts[app] != nil || counts.count < Self.maxTrackedApps ? app : Self.otherApps
        var entry = counts[key] ?? AppCount(app: key)
        change(&entry)
        counts[key] = entry
    }

    /// Changes `app`'s usage; forgets the usage of apps that hold nothing
    /// and used nothing within the window, and, past ``maxTrackedApps``,
    /// the least recently used of those that hold nothing.
    private func trackUsage(_ app: String, now: VigilInstant, _ change: (inout Usage) -> Void) {
        let windowStart = now - AppLimitSettings.window
        // Changed in place (the default subscript's modify): a copy taken
        // out of the table would share its spans and copy them on change.
        func track(_ entry: inout Usage) {
            change(&entry)
            entry.lastUsed = now
            entry.spans.removeAll { $0.end <= windowStart }
        }
        track(&usage[app, default: Usage(lastUsed: now)])
        guard usage.count > Self.maxTrackedApps else { return }
        usage = usage.filter { $0.value.holding > 0 || $0.value.lastUsed > windowStart }
        while usage.count > Self.maxTrackedApps,
              let oldest = usage.filter({ $0.value.holding == 0 }).min(by: { $0.value.lastUsed < $1.value.lastUsed }) {
            usage[oldest.key] = nil
        }
    }
}
