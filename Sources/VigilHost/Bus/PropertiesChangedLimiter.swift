import VigilDBus
import VigilKit

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
    typealias Announce = @Sendable (_ path: String, _ interface: String, _ values: [(name: String, value: DBusValue)]) async throws -> Void

    static let interval: Duration = .seconds(1)

    private struct Object {
        var interface: DBusInterface
        var announcedAt: VigilInstant?
        var pending: Set<String> = []
        var flush: Task<Void, Never>?
    }

    private let clock: any VigilClock
    private let log: StrategyLogger
    private let announce: Announce
    private var objects: [String: Object] = [:]

    init(clock: any VigilClock, log: StrategyLogger, announce: @escaping Announce) {
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
        objects[path] = Object(interface: interface, announcedAt: startsInterval ? clock.now : nil)
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
        objects[path] = object
        let now = clock.now
        if !immediately, let last = object.announcedAt, now - last < Self.interval {
            guard object.flush == nil else { return }
            let due = last + Self.interval
            let clock = self.clock
            objects[path]?.flush = Task { [weak self] in
                do { try await clock.sleep(until: due) } catch { return }
                await self?.flushDue(path)
            }
            return
        }
        await announceNow(path)
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
        object.announcedAt = clock.now
        objects[path] = object
        guard !names.isEmpty else { return }
        do {
            var values: [(name: String, value: DBusValue)] = []
            for name in names {
                guard let getter = object.interface.property(named: name)?.getter else { continue }
                values.append((name, try await getter()))
            }
            try await announce(path, object.interface.name, values)
        } catch {
            log.warning("cannot announce \(path) properties on D-Bus: \(error)")
        }
    }
}
