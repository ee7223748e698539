import VigilDBus
import VigilKit

/// When a rate-limited announcement goes: at once when the last one is an
/// interval (1 s) old or there was none, else once at the end of that
/// interval. The pace of each object ``PropertiesChangedLimiter`` tracks,
/// and of the Host's `Leases`, which ``HostBusAPI`` announces under its lock
/// together with the change.
struct AnnouncementPace {
    static let interval: Duration = .seconds(1)

    enum Decision: Equatable {
        /// Announce now (counted as announced).
        case now
        /// Announce at this instant, the end of the interval (then call
        /// ``announced(at:)``).
        case at(VigilInstant)
        /// An announcement at the end of the interval is planned already.
        case planned
    }

    private(set) var announcedAt: VigilInstant?
    /// An announcement waits for the end of the interval.
    private(set) var isPlanned = false

    /// With `startingAt`, an interval runs from then (an export whose
    /// InterfacesAdded carried the values counts as an announcement).
    init(startingAt start: VigilInstant? = nil) { announcedAt = start }

    /// Something changed at `now`: when to announce it.
    mutating func changed(at now: VigilInstant) -> Decision {
        if let last = announcedAt, now - last < Self.interval {
            guard !isPlanned else { return .planned }
            isPlanned = true
            return .at(last + Self.interval)
        }
        announced(at: now)
        return .now
    }

    /// An announcement went at `now`; nothing is planned any more.
    mutating func announced(at now: VigilInstant) {
        announcedAt = now
        isPlanned = false
    }
}

/// Rate-limits `PropertiesChanged`: at most one announcement per object per
/// interval (1 s). A change inside the interval is announced at its end, once,
/// naming every property that changed meanwhile, with the values of that
/// moment (read through the declared getters when the announcement is
/// decided, not when the signal is built later), so the trailing signal
/// carries the newest value. Reads are never limited, only signals.
///
/// One limiter serves every rate-limited object vigild exports: lease
/// objects' `Status` and the child objects strategies export.
actor PropertiesChangedLimiter {
    /// Sends the signal for `values` of `interface` at `path`.
    typealias Announce = @Sendable (_ path: String, _ interface: String, _ values: [(name: String, value: BusValue)]) async throws -> Void

    private struct Object {
        var interface: DBusInterface
        var pace: AnnouncementPace
        var pending: Set<String> = []
        var flush: Task<Void, Never>?
    }

    private let clock: any VigilClock
    private let log: Logger
    private let announce: Announce
    private var objects: [String: Object] = [:]

    init(clock: any VigilClock, log: Logger, announce: @escaping Announce) {
        self.clock = clock
        self.log = log
        self.announce = announce
    }

    deinit {
        for object in objects.values { object.flush?.cancel() }
    }

    /// An object was exported. `startsInterval`: its export counts as an
    /// announcement (InterfacesAdded carried its values), so a change right
    /// after it waits for the interval.
    func track(_ path: String, interface: DBusInterface, startsInterval: Bool) {
        objects[path]?.flush?.cancel()
        objects[path] = Object(interface: interface, pace: AnnouncementPace(startingAt: startsInterval ? clock.now : nil))
    }

    /// The object is gone: nothing more is announced for it.
    func forget(_ path: String) {
        objects.removeValue(forKey: path)?.flush?.cancel()
    }

    /// Forgets every object (the connection is gone).
    func forgetAll() {
        for object in objects.values { object.flush?.cancel() }
        objects = [:]
    }

    /// `properties` of the object at `path` changed. Announced now when the
    /// interval since the last announcement has passed (or `immediately`),
    /// else at its end.
    func changed(_ path: String, properties: Set<String>, immediately: Bool = false) async {
        guard var object = objects[path], !properties.isEmpty else { return }
        object.pending.formUnion(properties)
        let decision = immediately ? .now : object.pace.changed(at: clock.now)
        if case .at(let due) = decision {
            let clock = self.clock
            // Unstructured task: cancelled when the object's next flush replaces it, when the
            // object is tracked again or forgotten, and by forgetAll() and deinit.
            object.flush = Task { [weak self] in
                do { try await clock.sleep(until: due) } catch { return }
                await self?.flushDue(path)
            }
        }
        objects[path] = object
        if decision == .now { await announceNow(path) }
    }

    /// ``changed(_:properties:immediately:)`` for many objects in one call
    /// (a batch of lease statuses: one hop into the actor, not one each).
    func changed(_ paths: [String], properties: Set<String>) async {
        for path in paths { await changed(path, properties: properties) }
    }

    /// A delayed flush came due. It may have been superseded while it waited
    /// for the actor (an immediate announcement cancels it): then it must not
    /// announce, or it would cancel the newer flush and send a second signal
    /// within the interval.
    private func flushDue(_ path: String) async {
        guard !Task.isCancelled else { return }
        await announceNow(path)
    }

    private func announceNow(_ path: String) async {
        guard var object = objects[path] else { return }
        object.flush?.cancel()
        object.flush = nil
        let names = object.pending.sorted()
        object.pending = []
        object.pace.announced(at: clock.now)
        objects[path] = object
        guard !names.isEmpty else { return }
        do {
            var values: [(name: String, value: BusValue)] = []
            for name in names {
                guard let getter = object.interface.property(named: name)?.getter else { continue }
                values.append((name, try await getter(path)))
            }
            try await announce(path, object.interface.name, values)
        } catch {
            log.warning("cannot announce \(path) properties on D-Bus: \(error)")
        }
    }
}
