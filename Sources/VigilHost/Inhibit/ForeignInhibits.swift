import Foundation
import VigilKit

/// `[host] freedesktop_inhibit`, `inhibit_max`, `inhibit_allow`,
/// `inhibit_deny`: how vigild answers apps that ask the desktop's inhibit
/// APIs to keep the machine awake (docs/desktop-integration.md).
public struct InhibitSettings: Sendable, Equatable {
    /// Whether vigild serves the freedesktop inhibit names on its bus.
    public enum Mode: String, CaseIterable, Sendable {
        /// On a session bus (the default), off on the system bus.
        case auto
        case off
    }
    public var mode: Mode = .auto
    /// The longest any foreign inhibit is held: then `Expiring`, then released.
    public var maxDuration: Duration = .seconds(8 * 3600)
    /// When not empty, only apps whose name or executable matches one of
    /// these shell patterns (fnmatch) may inhibit.
    public var allow: [String] = []
    /// Apps whose name or executable matches one of these may not.
    public var deny: [String] = []

    public init() {}

    /// Longest app name and reason accepted: the same as a client lease's
    /// name and reason (docs/security.md), as they become the lease's.
    public static let appLimit = ClientInputLimit("application name", maximum: ClientInputLimit.leaseName.maximum)
    public static let reasonLimit = ClientInputLimit("inhibit reason", maximum: ClientInputLimit.leaseReason.maximum)
    /// Most inhibits one uid may hold at once.
    public static let maxPerUID = 64
}

/// Which API an inhibit came through.
public enum InhibitSource: String, Sendable, CaseIterable {
    case powerManagement = "org.freedesktop.PowerManagement.Inhibit"
    case screenSaver = "org.freedesktop.ScreenSaver"
    case portal = "org.freedesktop.impl.portal.Inhibit"
}

/// Who asked, from the bus's credentials for the caller's connection.
public struct InhibitCaller: Sendable, Hashable {
    /// The unique bus name (`:1.42`).
    public var owner: String
    public var uid: UInt32
    /// 0 when the bus could not tell.
    public var pid: UInt32
    /// `/proc/PID/exe`, when readable.
    public var executable: String?

    public init(owner: String, uid: UInt32, pid: UInt32, executable: String? = nil) {
        self.owner = owner
        self.uid = uid
        self.pid = pid
        self.executable = executable
    }

    /// The executable of `pid`, when this process may read it.
    ///
    /// One readlink(2) into a buffer: it is read for every client lease and
    /// inhibit, and FileManager's `destinationOfSymbolicLink` cost several
    /// times the system call (about 10 µs a lease here).
    public static func executable(of pid: UInt32) -> String? {
        guard pid != 0 else { return nil }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: Int(PATH_MAX)) { buffer -> String? in
            guard let base = buffer.baseAddress else { return nil }
            let length = base.withMemoryRebound(to: CChar.self, capacity: buffer.count) { readlink("/proc/\(pid)/exe", $0, buffer.count) }
            // A target as long as the buffer may have been cut: unknown, as when unreadable.
            guard length > 0, length < buffer.count else { return nil }
            return String(decoding: UnsafeBufferPointer(start: base, count: length), as: UTF8.self)
        }
    }
}


/// Every keep-awake request an app made through the freedesktop inhibit
/// APIs or the Inhibit portal, each a lease in the registry (strategy
/// `inhibit`) holding `sleep` or `idle` through the power backend.
///
/// An inhibit ends on UnInhibit (or the portal Request's Close) by the
/// connection that made it, when that connection leaves the bus, when the
/// bus is lost, or after `inhibit_max`: then the registry marks it
/// expiring (a warning) and releases it after the grace time.
///
/// Cookies are random 32-bit numbers, unique among those held. A cookie is
/// only good on the connection that got it: UnInhibit of another
/// connection's cookie is refused exactly like a cookie that does not
/// exist, so the answer tells nothing about other callers.
public actor ForeignInhibits {
    /// What the registry shows as an inhibit lease's strategy.
    public static let strategyName = "inhibit"

    private struct Held {
        var lease: LeaseID
        var caller: InhibitCaller
        var source: InhibitSource
    }

    public nonisolated let registry: LeaseRegistry
    public nonisolated let settings: InhibitSettings
    /// Caps, budgets and live rules, shared with client leases.
    public nonisolated let policy: AppPolicy
    private let grace: Duration
    private let log: Logger
    private var byCookie: [UInt32: Held] = [:]
    private var cookieOfLease: [LeaseID: UInt32] = [:]
    private var generator = SystemRandomNumberGenerator()
    private var following: Task<Void, Never>?
    /// Unique names that left the bus recently (an inhibit racing its
    /// caller's departure is ended at once); bounded, names are never reused.
    private var vanished = VanishedNames()
    /// Inhibits vigild ended itself (at a cap or budget, by `--deny` or
    /// `--release`) whose connection has not said UnInhibit yet: cookie and
    /// connection, oldest first, bounded. That connection's UnInhibit of it
    /// succeeds, as if it came first (wakepy takes a failed UnInhibit for a
    /// bug and raises); any other connection's is refused as before.
    private var endedByHost: [UInt32: String] = [:]
    private var endedOrder: [UInt32] = []
    static let endedCookiesKept = 4096
    /// Inhibits being granted, counted against the per-uid limit.
    private var pending = PendingGrants()
    /// Told when the set of held inhibits goes from empty to not, or back.
    private var onHasInhibitChanged: (@Sendable (Bool) -> Void)?

    public init(registry: LeaseRegistry, settings: InhibitSettings, grace: Duration, logging: HostLogging, policy: AppPolicy? = nil) {
        self.registry = registry
        self.settings = settings
        self.policy = policy ?? AppPolicy(settings: AppLimitSettings(), clock: registry.budgetClock)
        self.grace = grace
        self.log = logging.logger("inhibit")
    }

    /// Follows the registry, so inhibits it ends on its own (expired after
    /// `inhibit_max`, released at shutdown) are forgotten here too. Call once.
    public func start() async {
        let events = await registry.events(LeaseEventFilter(kinds: LeaseEventFilter.endings, strategy: Self.strategyName))
        let policy = self.policy
        // Unstructured task: cancelled by stop().
        following = Task { [weak self] in
            for await event in events {
                await policy.ended(event.lease.id)
                await self?.registryEnded(event.lease.id)
            }
        }
    }

    public func stop() {
        following?.cancel()
        following = nil
    }

    public func onHasInhibitChanged(_ body: @escaping @Sendable (Bool) -> Void) {
        onHasInhibitChanged = body
    }

    /// True while any inhibit is held.
    public var hasInhibit: Bool { !byCookie.isEmpty }

    /// Grants an inhibit: checks the arguments and the policy, then holds
    /// `what` (logind names: "sleep", "idle"; empty: tracked only) as a
    /// lease. Returns the cookie and the lease.
    public func inhibit(source: InhibitSource, app: String, reason: String, what: [String], caller: InhibitCaller) async throws(ClientLeaseError) -> (cookie: UInt32, lease: LeaseID) {
        do {
            try InhibitSettings.appLimit.check(app)
            try InhibitSettings.reasonLimit.check(reason)
        } catch {
            throw ClientLeaseError(.invalidArgument, error.message)
        }
        let name = app.isEmpty ? "unnamed app" : app
        let subjects = [app] + (caller.executable.map { [$0] } ?? [])
        let who = "inhibit by \"\(ClientText.excerpt(app))\" (\(caller.executable.map { ClientText.excerpt($0) } ?? "executable unknown"))"
        let grant = try await policy.admit(app: name, subjects: subjects, who: who)
        if !grant.liveAllowed {
            do {
                try checkPolicy(subjects: subjects, who: who)
            } catch {
                await policy.refused(app: name)
                throw error
            }
        }
        let beingGranted = pending.count(uid: caller.uid)
        let mine = byCookie.values.filter { $0.caller.uid == caller.uid }.count + beingGranted
        guard mine < InhibitSettings.maxPerUID else {
            let under = beingGranted > 0 ? " (\(beingGranted) of them being granted now)" : ""
            throw ClientLeaseError(.limitExceeded, "uid \(caller.uid) already holds \(mine) inhibits\(under), the most allowed (\(InhibitSettings.maxPerUID)); release one first")
        }
        // Counted against the limit from here, before the first suspension
        // point, until the inhibit is held or refused.
        let ticket = pending.reserve(uid: caller.uid)
        let log = self.log
        // inhibit_max is this app's cap unless app_max names one.
        let asked = grant.cap == nil ? settings.maxDuration : nil
        let rule = grant.limitingRule(asked) ?? "inhibit_max (\(settings.maxDuration.vigilDescription))"
        let shown = ClientText.excerpt(name)
        let policy = self.policy
        let request = LeaseRequest(
            holds: what.isEmpty ? "nothing (tracked only)" : what.joined(separator: "+"),
            reason: reason.isEmpty ? name : reason,
            budget: grant.limit(asked), grace: grace,
            power: what.isEmpty ? nil : PowerHold(what: what, mode: "block"),
            onExpire: { expiry in
                await policy.expiring(app: name)
                log.with(lease: expiry.lease).warning("inhibit by \"\(shown)\" reached \(rule); releasing lease \(expiry.lease) in \(expiry.grace.vigilDescription)")
            }
        )
        let id: LeaseID
        do {
            id = try await registry.acquire(strategy: Self.strategyName, request,
                                            client: ClientIdentity(owner: caller.owner, uid: caller.uid, pid: caller.pid, name: name))
        } catch {
            pending.release(ticket)
            throw ClientLeaseError(.failed, "\(error)")
        }
        await registry.setStatus(id, [
            "Interface": .string(source.rawValue), "App": .string(name), "Executable": .string(caller.executable ?? ""),
            "Pid": .uint(UInt64(caller.pid)), "Uid": .uint(UInt64(caller.uid)),
        ])
        // Shown as the cap of an inhibit that no app_max names.
        var recorded = grant
        if recorded.cap == nil {
            recorded.cap = AppLimitRule("*", settings.maxDuration)
            recorded.capIsInhibitMax = true
        }
        if let denied = await policy.began(id, grant: recorded, subjects: subjects) {
            pending.release(ticket)
            await registry.release(id, detail: denied)
            throw ClientLeaseError(.accessDenied, "\(who) is \(denied)")
        }
        // From the cookie to the tables, no suspension point: a concurrent
        // inhibit sees this one in `pending` or in `byCookie`, and never
        // draws the same cookie.
        var cookie: UInt32 = 0
        while cookie == 0 || byCookie[cookie] != nil || endedByHost[cookie] != nil { cookie = generator.next() }
        let wasEmpty = byCookie.isEmpty
        pending.release(ticket)
        byCookie[cookie] = Held(lease: id, caller: caller, source: source)
        log.with(lease: id).info("lease \(id): inhibit by \"\(shown)\" (uid \(caller.uid), pid \(caller.pid)) through \(source.rawValue) holds \(request.holds)")
        cookieOfLease[id] = cookie
        if wasEmpty { onHasInhibitChanged?(true) }
        if vanished.contains(caller.owner) { await end(cookie, detail: "the app left the bus") }
        return (cookie, id)
    }

    /// Ends the inhibit `cookie` for the connection that got it.
    public func uninhibit(_ cookie: UInt32, caller owner: String) async throws(ClientLeaseError) {
        if endedByHost[cookie] == owner {
            endedByHost[cookie] = nil
            return
        }
        guard byCookie[cookie]?.caller.owner == owner else {
            throw ClientLeaseError(.invalidArgument, "this connection holds no inhibit with cookie \(cookie)")
        }
        await end(cookie, detail: "released by the app")
    }

    /// A unique name left the bus: its inhibits end.
    public func ownerVanished(_ owner: String) async {
        vanished.insert(owner)
        for (cookie, held) in byCookie where held.caller.owner == owner {
            await end(cookie, detail: "the app left the bus")
        }
    }

    /// The bus is gone: every caller was on it.
    public func busLost() async {
        for cookie in byCookie.keys.sorted() { await end(cookie, detail: "the bus connection was lost") }
    }

    /// Ends the inhibit that is lease `id` (`vigilctl inhibitors --release`
    /// or `--deny`); false when no inhibit is that lease.
    public func release(_ id: LeaseID, detail: String) async -> Bool {
        guard let cookie = cookieOfLease[id], let owner = byCookie[cookie]?.caller.owner else { return false }
        await end(cookie, detail: detail)
        rememberEnded(cookie, owner: owner)
        return true
    }

    /// Whether lease `id` is an app's inhibit.
    public func holds(_ id: LeaseID) -> Bool { cookieOfLease[id] != nil }

    private func end(_ cookie: UInt32, detail: String) async {
        guard let held = byCookie.removeValue(forKey: cookie) else { return }
        cookieOfLease[held.lease] = nil
        await policy.ended(held.lease)
        log.with(lease: held.lease).info("lease \(held.lease): inhibit of pid \(held.caller.pid) ended: \(detail)")
        if byCookie.isEmpty { onHasInhibitChanged?(false) }
        await registry.release(held.lease, detail: detail)
    }

    private func registryEnded(_ id: LeaseID) {
        guard let cookie = cookieOfLease.removeValue(forKey: id) else { return }
        if let owner = byCookie.removeValue(forKey: cookie)?.caller.owner, !vanished.contains(owner) {
            rememberEnded(cookie, owner: owner)
        }
        if byCookie.isEmpty { onHasInhibitChanged?(false) }
    }

    private func rememberEnded(_ cookie: UInt32, owner: String) {
        endedByHost[cookie] = owner
        endedOrder.append(cookie)
        if endedOrder.count > Self.endedCookiesKept { endedByHost[endedOrder.removeFirst()] = nil }
    }

    /// `inhibit_deny` first, then `inhibit_allow` when it is not empty.
    private func checkPolicy(subjects: [String], who: String) throws(ClientLeaseError) {
        func matches(_ pattern: String) -> Bool { subjects.contains { fnmatch(pattern, $0, 0) == 0 } }
        if let rule = settings.deny.first(where: matches) {
            throw ClientLeaseError(.accessDenied, "\(who) is denied by inhibit_deny pattern \"\(rule)\"")
        }
        if !settings.allow.isEmpty, !settings.allow.contains(where: matches) {
            throw ClientLeaseError(.accessDenied, "\(who) is not allowed: it matches no inhibit_allow pattern (\(settings.allow.map { "\"\($0)\"" }.joined(separator: ", ")))")
        }
    }
}
