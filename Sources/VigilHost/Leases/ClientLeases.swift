import Foundation
import VigilKit

/// Limits and defaults for leases D-Bus clients begin
/// (`org.vigil.Vigil1.Host.BeginBackgroundTask`), from `[host]`.
public struct ClientLeaseSettings: Sendable, Equatable {
    /// Whether clients may begin leases at all (`client_leases`).
    public var enabled = true
    /// Most leases one uid may hold at once (`client_max_leases_per_uid`).
    public var maxLeasesPerUID = 16
    /// Most budget one uid's leases may have granted at once, summed over
    /// them (`client_max_budget_per_uid`).
    public var maxBudgetPerUID: Duration = .seconds(4 * 3600)
    /// How long a client has, once its budget ran out, to end the lease
    /// after `Expiring` before it is force-released (`client_grace`).
    public var grace: Duration = .seconds(5)
    /// What a client lease holds on the system.
    public var hold = PowerHold(what: ["sleep"], mode: "block")

    public init() {}
}

/// Why a client's lease request or call (or an app's inhibit) was refused; `dbusName` is the
/// D-Bus error the API answers with.
public struct ClientLeaseError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// A bad argument (zero budget, empty name): InvalidArgs.
        case invalidArgument
        /// Over a per-uid limit, or client leases are off.
        case limitExceeded
        /// The lease has ended (or is expiring and can no longer be renewed).
        case ended
        /// The caller does not own the lease.
        case accessDenied
        /// The power backend refused the hold, or a pipe could not be made.
        case failed
        /// vigild has no file descriptors left for the lease pipe: the
        /// message names the limit (``DescriptorLimit``). LimitsExceeded.
        case outOfDescriptors
    }
    public var code: Code
    public var description: String

    public init(_ code: Code, _ description: String) {
        self.code = code
        self.description = description
    }

    public var dbusName: String {
        switch code {
        case .invalidArgument: "org.freedesktop.DBus.Error.InvalidArgs"
        case .limitExceeded, .outOfDescriptors: "org.freedesktop.DBus.Error.LimitsExceeded"
        case .ended: VigilAPI.leaseEndedError
        case .accessDenied: "org.freedesktop.DBus.Error.AccessDenied"
        case .failed: "org.freedesktop.DBus.Error.Failed"
        }
    }
}

/// Leases that D-Bus clients hold, in the host's lease registry like any
/// other (strategy `client`, with a ``ClientIdentity``).
///
/// A lease ends when its client calls End, closes every copy of the fd it
/// was given (the write end of a pipe whose read end the ``HangupWatcher``
/// watches; the kernel closes it too when the client dies), leaves the bus
/// (``ownerVanished(_:)``), or lets its budget run out without Renew: then
/// the registry marks it expiring (the API emits `Expiring`) and, unless the
/// client ends it within the grace time, force-releases it (`Expired`).
public actor ClientLeases {
    /// What the registry shows as a client lease's strategy.
    public static let strategyName = "client"

    private struct Held {
        var identity: ClientIdentity
        var budget: Duration
        /// The hang-up watch on the lease pipe.
        var watch: UInt64
        /// Resumed when the lease ends while its expiration handler waits.
        var endedWhileExpiring: CheckedContinuation<Void, Never>?
    }

    public nonisolated let registry: LeaseRegistry
    public nonisolated let settings: ClientLeaseSettings
    /// Caps, budgets and live rules per app (`app_max`, `app_budget`,
    /// `vigilctl inhibitors --deny`), shared with apps' inhibits.
    public nonisolated let policy: AppPolicy
    private let log: Logger?
    private var held: [LeaseID: Held] = [:]
    private var following: Task<Void, Never>?
    private var watcher: HangupWatcher?
    /// Unique names that left the bus recently: a client that disconnects
    /// while its BeginBackgroundTask is still being answered is caught here.
    /// Unique names are never reused on a bus, so a bounded memory suffices.
    private var vanished = VanishedNames()
    /// Leases being begun, counted against the per-uid limits.
    private var pending = PendingGrants()

    public init(registry: LeaseRegistry, settings: ClientLeaseSettings, policy: AppPolicy? = nil, logging: HostLogging? = nil) {
        self.registry = registry
        self.settings = settings
        self.policy = policy ?? AppPolicy(settings: AppLimitSettings(), clock: registry.budgetClock)
        self.log = logging?.logger("client")
    }

    /// Begins a lease for `identity`. Returns it as the registry's
    /// `acquired` event shows it, and the write end of the lease pipe,
    /// which the caller hands to the client and then closes.
    public func begin(_ identity: ClientIdentity, reason: String, budgetMicros: UInt64) async throws(ClientLeaseError) -> (lease: LeaseSnapshot, fd: Int32) {
        guard !refusing else {
            // A lease begun now would end with the host a moment later.
            throw ClientLeaseError(.limitExceeded, "vigild is shutting down; begin the lease with the next vigild")
        }
        guard settings.enabled else {
            throw ClientLeaseError(.limitExceeded, "client leases are turned off in this vigild's config ([host] client_leases = false)")
        }
        guard !identity.name.unicodeScalars.allSatisfy({ $0.properties.isWhitespace }) else {
            throw ClientLeaseError(.invalidArgument, "name must not be empty: say what the task is, e.g. \"backup\"")
        }
        let asked = try Self.budget(budgetMicros)
        // The app is the task's name and the caller's executable, as for inhibits.
        let executable = InhibitCaller.executable(of: identity.pid)
        let subjects = [identity.name] + (executable.map { [$0] } ?? [])
        // Described only for a refusal: a granted lease never shows it.
        let who = { @Sendable in "background task \"\(ClientText.excerpt(identity.name))\" (\(executable.map { ClientText.excerpt($0) } ?? "executable unknown"))" }
        let grant = try await policy.admit(app: identity.name, subjects: subjects, who: who())
        let budget = grant.limit(asked) ?? asked
        let rule = grant.limitingRule(asked)
        let uid = identity.uid
        let beingBegun = pending.count(uid: uid)
        let holding = held.values.filter { $0.identity.uid == uid }.count + beingBegun
        guard holding < settings.maxLeasesPerUID else {
            let under = beingBegun > 0 ? " (\(beingBegun) of them being begun now)" : ""
            throw ClientLeaseError(.limitExceeded, "uid \(uid) already holds \(holding) client leases\(under), the most allowed ([host] client_max_leases_per_uid = \(settings.maxLeasesPerUID)); end one first")
        }
        try checkTotalBudget(uid: uid, adding: budget, besides: nil)

        let pipe: (token: UInt64, writeEnd: Int32)
        do {
            pipe = try fdWatcher().makeWatchedPipe()
        } catch let error as DescriptorsExhausted {
            throw ClientLeaseError(.outOfDescriptors, error.description)
        } catch {
            throw ClientLeaseError(.failed, "\(error)")
        }
        // Counted against the limits from here, before the first suspension
        // point, until the lease is held or refused.
        let ticket = pending.reserve(uid: uid, budget: budget)
        let log = self.log
        let policy = self.policy
        let app = identity.name
        let request = LeaseRequest(
            holds: "background task \"\(identity.name)\" of \(identity.owner) (uid \(identity.uid), pid \(identity.pid))",
            reason: reason.isEmpty ? identity.name : reason,
            budget: budget, grace: settings.grace, power: settings.hold,
            onExpire: { [weak self] expiry in
                await policy.expiring(app: app)
                if let rule {
                    log?.with(lease: expiry.lease).warning("background task \"\(ClientText.excerpt(app))\" reached \(rule); releasing lease \(expiry.lease) in \(expiry.grace.vigilDescription) unless it ends first")
                }
                await self?.waitForEnd(expiry.lease)
            }
        )
        let lease: LeaseSnapshot
        do {
            lease = try await registry.acquireSnapshot(strategy: Self.strategyName, request, client: identity)
        } catch {
            pending.release(ticket)
            watcher?.forget(pipe.token)
            close(pipe.writeEnd)
            throw ClientLeaseError(.failed, "\(error)")
        }
        if let denied = await policy.began(lease.id, grant: grant, subjects: subjects) {
            pending.release(ticket)
            watcher?.forget(pipe.token)
            close(pipe.writeEnd)
            await registry.release(lease.id, detail: denied)
            throw ClientLeaseError(.accessDenied, "\(who()) is \(denied)")
        }
        // Still reserved until it is held: no suspension point in between.
        pending.release(ticket)
        held[lease.id] = Held(identity: identity, budget: budget, watch: pipe.token)
        if vanished.contains(identity.owner) {
            await end(lease.id, detail: "the client left the bus")
        }
        return (lease, pipe.writeEnd)
    }

    /// Renews a client lease for `budgetMicros` more. Only its owner (or an
    /// administrator, `privileged`) may.
    @discardableResult
    public func renew(_ id: LeaseID, caller: String, privileged: Bool, budgetMicros: UInt64) async throws(ClientLeaseError) -> LeaseSnapshot {
        let asked = try Self.budget(budgetMicros)
        let entry = try owned(id, caller: caller, privileged: privileged, action: "renew")
        // A cap counts from the lease's start, a budget over the app's last 24h.
        let (budget, rule) = await policy.renewalLimit(id, asked: asked)
        guard budget > .zero else {
            throw ClientLeaseError(.limitExceeded, "lease \(id) has reached \(rule ?? "its limit"); it cannot be renewed")
        }
        guard held[id] != nil else {
            throw ClientLeaseError(.ended, "lease \(id) has ended; begin a new one with BeginBackgroundTask")
        }
        try checkTotalBudget(uid: entry.identity.uid, adding: budget, besides: id)
        // The new budget counts from before the first suspension point, so
        // concurrent renewals and Begins see it; a refused renewal restores
        // the old one.
        held[id]?.budget = budget
        do {
            return try await registry.renew(id, budget: budget)
        } catch let error as LeaseError where error.code == .ended {
            restoreBudget(id, from: budget, to: entry.budget)
            throw ClientLeaseError(.ended, "lease \(id) cannot be renewed: \(error.message)")
        } catch {
            restoreBudget(id, from: budget, to: entry.budget)
            throw ClientLeaseError(.failed, "\(error)")
        }
    }

    /// Puts back the budget a refused renewal reserved, unless another
    /// renewal replaced it meanwhile.
    private func restoreBudget(_ id: LeaseID, from reserved: Duration, to previous: Duration) {
        if held[id]?.budget == reserved { held[id]?.budget = previous }
    }

    /// Ends a client lease at its owner's (or an administrator's) request.
    public func endByClient(_ id: LeaseID, caller: String, privileged: Bool) async throws(ClientLeaseError) {
        _ = try owned(id, caller: caller, privileged: privileged, action: "end")
        await end(id, detail: "ended by the client")
    }

    /// A unique name left the bus: its leases end.
    public func ownerVanished(_ owner: String) async {
        vanished.insert(owner)
        for (id, entry) in held where entry.identity.owner == owner {
            await end(id, detail: "the client left the bus")
        }
    }

    /// The bus connection the leases were begun on is gone: every holder
    /// was a peer on that bus, so every client lease ends.
    public func busLost() async {
        for id in held.keys.sorted() { await end(id, detail: "the bus connection was lost") }
    }

    /// Follows the registry so leases it ends on its own (expired after the
    /// grace time) are forgotten here too. Call once. Every other end of a
    /// client lease is made here (End, the fd closed, the client gone, the
    /// bus lost) and forgotten before the registry hears of it, except the
    /// host's release of everything at shutdown, which ``stop()`` follows:
    /// so an End wakes no follower of its own.
    public func start() async {
        let events = await registry.events(LeaseEventFilter(kinds: [.expired], strategy: Self.strategyName))
        // Unstructured task: cancelled by stop().
        following = Task { [weak self] in
            for await event in events where event.lease.client != nil {
                await self?.registryEnded(event.lease.id)
            }
        }
    }

    /// The registry ended a lease on its own: forget it.
    private func registryEnded(_ id: LeaseID) async {
        await policy.ended(id)
        guard let entry = held.removeValue(forKey: id) else { return }
        watcher?.forget(entry.watch)
        entry.endedWhileExpiring?.resume()
    }

    /// How many client leases are held.
    public var count: Int { held.count }

    /// Set when the host starts shutting down: no new leases.
    private var refusing = false

    /// Refuses every later `begin` (the host is shutting down).
    public func refuseNewLeases() { refusing = true }

    /// Stops watching fds (host shutdown; the registry releases the leases).
    public func stop() {
        following?.cancel()
        following = nil
        watcher?.stop()
        watcher = nil
        // The host released every lease (shutdown): nothing is held.
        for entry in held.values { entry.endedWhileExpiring?.resume() }
        held = [:]
    }

    // MARK: internals

    private static func budget(_ micros: UInt64) throws(ClientLeaseError) -> Duration {
        guard micros > 0 else {
            throw ClientLeaseError(.invalidArgument, "budget_usec must be greater than 0 (microseconds, e.g. 600000000 for 10 minutes)")
        }
        // Beyond Int64 microseconds no limit could allow it anyway.
        return .microseconds(Int64(clamping: micros))
    }

    /// Throws unless `uid`'s granted budgets (without lease `replaced`, whose
    /// share a renewal replaces) plus `budget` stay within the limit.
    private func checkTotalBudget(uid: UInt32, adding budget: Duration, besides replaced: LeaseID?) throws(ClientLeaseError) {
        let beingBegun = pending.budget(uid: uid)
        let granted = held.filter { $0.key != replaced && $0.value.identity.uid == uid }.values.reduce(Duration.zero) { $0 + $1.budget } + beingBegun
        guard granted + budget <= settings.maxBudgetPerUID else {
            let under = beingBegun > .zero ? " (\(beingBegun.vigilDescription) of it for leases being begun now)" : ""
            throw ClientLeaseError(.limitExceeded, "a budget of \(budget.vigilDescription) would bring uid \(uid)'s client leases to \((granted + budget).vigilDescription), over the limit of \(settings.maxBudgetPerUID.vigilDescription) ([host] client_max_budget_per_uid); \(granted.vigilDescription) is granted now\(under)")
        }
    }

    private func owned(_ id: LeaseID, caller: String, privileged: Bool, action: String) throws(ClientLeaseError) -> Held {
        guard let entry = held[id] else {
            throw ClientLeaseError(.ended, "lease \(id) has ended; begin a new one with BeginBackgroundTask")
        }
        guard privileged || entry.identity.owner == caller else {
            throw ClientLeaseError(.accessDenied, "lease \(id) belongs to \(entry.identity.owner); only its owner, root or vigild's uid may \(action) it")
        }
        return entry
    }

    /// Ends client lease `id` whoever holds it (`vigilctl inhibitors
    /// --release` or `--deny`); false when no client lease is that lease.
    public func release(_ id: LeaseID, detail: String) async -> Bool {
        guard held[id] != nil else { return false }
        await end(id, detail: detail)
        return true
    }

    private func end(_ id: LeaseID, detail: String) async {
        guard let entry = held.removeValue(forKey: id) else { return }
        await policy.ended(id)
        watcher?.forget(entry.watch)
        await registry.release(id, detail: detail)
        entry.endedWhileExpiring?.resume()
    }

    /// The watcher, made with the first client lease.
    private func fdWatcher() throws -> HangupWatcher {
        if let watcher { return watcher }
        let made = try HangupWatcher { [weak self] token in
            guard let self else { return }
            // Unstructured task: not cancelled: one hop into the actor per hang-up, from the
            // event loop (which must not wait for the actor).
            Task { await self.hungUp(token) }
        }
        watcher = made
        return made
    }

    /// A lease pipe lost its last writer: the client closed every copy of
    /// its fd (or died). The watcher already closed the read end.
    private func hungUp(_ token: UInt64) async {
        guard let (id, entry) = held.first(where: { $0.value.watch == token }) else { return }
        held.removeValue(forKey: id)
        await policy.ended(id)
        await registry.release(id, detail: "the client closed its lease fd")
        entry.endedWhileExpiring?.resume()
    }

    /// The expiration handler of a client lease: the client's part is the
    /// `Expiring` signal; the handler finishes when the lease ends (End,
    /// fd closed, disconnect) or when the registry gives up after the grace
    /// time and cancels it.
    private func waitForEnd(_ id: LeaseID) async {
        guard held[id] != nil else { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if held[id] == nil {
                    continuation.resume()
                } else {
                    held[id]?.endedWhileExpiring = continuation
                }
            }
        } onCancel: {
            // Unstructured task: not cancelled: one hop into the actor to withdraw the wait, from a
            // synchronous cancellation handler.
            Task { await self.cancelWait(id) }
        }
    }

    private func cancelWait(_ id: LeaseID) {
        held[id]?.endedWhileExpiring?.resume()
        held[id]?.endedWhileExpiring = nil
    }
}
