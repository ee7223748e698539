import VigilDBus
import VigilKit

/// `Host.AppPolicy`, `DenyApp`, `AllowApp` and `ReleaseLease`: who may keep
/// the machine awake, changed live (`vigilctl inhibitors --deny`, `--allow`,
/// `--release`). The three that change something follow Reload's trust
/// rule: root and vigild's uid only (docs/security.md).
extension HostBusAPI {
    nonisolated func appPolicy() async -> AppPolicyReply {
        let policy = parts.inhibits.policy
        func micros(_ d: Duration?) -> Int64 { d.map { max(0, $0.microseconds) } ?? -1 }
        var reply = AppPolicyReply()
        reply.rules = await policy.liveRules().map { AppRuleRow(pattern: $0.rule.pattern, action: $0.rule.action.rawValue, leftUsec: micros($0.left)) }
        reply.leases = await policy.limits().map {
            AppLimitRow(lease: $0.lease.rawValue, app: $0.app, rule: $0.rule, capLeftUsec: micros($0.capLeft), budgetLeftUsec: micros($0.budgetLeft))
        }
        reply.apps = await policy.appCounts().map { AppCountRow(app: $0.app, refused: $0.refused, expired: $0.expired) }
        return reply
    }

    nonisolated func denyApp(_ call: DBusMethodCall, _ pattern: String, forMicros: UInt64) async throws -> BusTuple<UInt32> {
        let caller = try await requireMayMutate(call, VigilAPI.Host.denyApp)
        let duration: Duration? = forMicros == 0 ? nil : .microseconds(Int64(clamping: forMicros))
        let held: [LeaseID]
        do {
            held = try await parts.inhibits.policy.deny(pattern, for: duration)
        } catch {
            throw error.dbusError
        }
        let shown = ClientText.excerpt(pattern)
        let span = duration.map { "for \($0.vigilDescription)" } ?? "until vigild restarts"
        log.notice("uid \(caller) denied apps matching \"\(shown)\" \(span); releasing \(held.count) held lease\(held.count == 1 ? "" : "s")")
        let detail = "denied by vigilctl inhibitors --deny \"\(shown)\" (uid \(caller))"
        var released: UInt32 = 0
        for id in held where await release(id, detail: detail) { released += 1 }
        return BusTuple(released)
    }

    nonisolated func allowApp(_ call: DBusMethodCall, _ pattern: String) async throws -> BusTuple<Bool> {
        let caller = try await requireMayMutate(call, VigilAPI.Host.allowApp)
        let lifted: Bool
        do {
            lifted = try await parts.inhibits.policy.allow(pattern)
        } catch {
            throw error.dbusError
        }
        log.notice("uid \(caller) allowed apps matching \"\(ClientText.excerpt(pattern))\"\(lifted ? ", lifting its deny" : "") until vigild restarts")
        return BusTuple(lifted)
    }

    nonisolated func releaseLease(_ call: DBusMethodCall, _ lease: UInt64) async throws {
        let caller = try await requireMayMutate(call, VigilAPI.Host.releaseLease)
        let id = LeaseID(lease)
        if await release(id, detail: "released by vigilctl inhibitors --release (uid \(caller))") {
            log.notice("uid \(caller) released lease \(id)")
            return
        }
        if let lease = await parts.registry.lease(id) {
            throw DBusError.invalidArgs("lease \(id) is held by strategy \"\(ClientText.excerpt(lease.strategy))\", not by an app; stop or reconfigure that strategy instead")
        }
        throw DBusError(name: VigilAPI.leaseEndedError, message: "lease \(id) is not held (it ended, or never was)")
    }

    /// Ends an app's inhibit or a client's lease; false when `id` is neither.
    private nonisolated func release(_ id: LeaseID, detail: String) async -> Bool {
        if await parts.inhibits.release(id, detail: detail) { return true }
        return await parts.clientLeases.release(id, detail: detail)
    }

    /// The caller's uid, after Reload's trust rule.
    nonisolated func requireMayMutate<each In, Out>(_ call: DBusMethodCall, _ method: Method<repeat each In, Out>) async throws -> UInt32 {
        let uid = try await credentials.of(call.sender).uid
        try Self.requireMayMutate(callerUID: uid, hostUID: hostUID, method: "\(method.interface).\(method.name)")
        return uid
    }
}
