import VigilDBus
import VigilKit

/// When a rate-limited announcement goes: at once when the last one is an
/// interval (1 s) old or there was none, else once at the end of that
/// interval. The pace of each object ``PropertiesChangedLimiter`` tracks,
/// and of the Host's `Leases` and `Strategies`, which ``HostBusAPI``
/// announces under its lock together with the change.
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

    /// The earliest a change at `now` may be announced: now, or the end of
    /// the interval of the last announcement.
    func earliest(after now: VigilInstant) -> VigilInstant {
        guard let last = announcedAt else { return now }
        return max(now, last + Self.interval)
    }

    /// An announcement went at `now`; nothing is planned any more.
    mutating func announced(at now: VigilInstant) {
        announcedAt = now
        isPlanned = false
    }
}

/// Rate-limits `PropertiesChanged`, per object and for the whole host.
///
/// Per object: at most one announcement per interval (1 s). A change
/// inside the interval is announced at its end, once, naming every property
/// that changed meanwhile, with the values of that moment (read through the
/// declared getters when the announcement is made), so the trailing signal
/// carries the newest value.
///
/// For the host: at most ``announcementsPerSecond`` announcements a second
/// in all (a burst of one second's worth). Objects whose announcement is
/// due wait in one queue, earliest due first; each flush of the queue
/// takes what the budget allows and sends it in one hop to the
/// connection. So a few objects are announced as before, while 10,000
/// voip-socket leases whose `Status` changes with every ping (1,000 changes
/// a second at a 10 s interval) cost the bus a bounded number of signals: each
/// lease is announced in turn, with its newest status, rather than once per
/// ping (per ping, they were 10,000 signals, tasks and hops to the
/// connection per round, and most of vigild's CPU). A change is never
/// dropped: an object stays queued until it is announced, with the status
/// of that moment. Changes made `immediately` (a download's end) go at
/// once, outside the budget. Reads are never limited, only signals.
///
/// One limiter serves every rate-limited object vigild exports: lease
/// objects' `Status` and the child objects strategies export.
actor PropertiesChangedLimiter {
    /// One announcement: `values` of `interface` at `path`.
    struct Announcement: Sendable {
        var path: String
        var interface: String
        var values: [(name: String, value: BusValue)]
    }

    /// Sends the signals of `announcements`, in order.
    typealias Announce = @Sendable (_ announcements: [Announcement]) async throws -> Void

    /// The host-wide budget vigild uses. Each PropertiesChanged of a
    /// voip-socket lease's `Status` costs vigild about 28 µs of CPU (the
    /// status read and encoded, the message built and sent): measured with
    /// 10,000 connections pinging every 10 s, a budget of 10 a second cost
    /// 236 ms of CPU per round, 100 a second about 300 ms and 1,000 a
    /// second 504 ms, against about 230 ms without any announcement
    /// (docs/benchmarks.md). 20 keeps that cost under 6 ms a round, and
    /// still lets 20 objects changing every second be announced each second.
    static let defaultAnnouncementsPerSecond = 20
    /// While the budget is spent, the next flush waits this long (a quarter
    /// of a second's budget goes then), not for each single announcement.
    static let backlogFlushSpacing: Duration = .milliseconds(250)

    private struct Object {
        /// Its interface's name and properties: not the whole declaration
        /// (48 bytes in each of thousands of entries, against 24), whose
        /// methods and signals announcing never reads.
        var interface: String
        var properties: [DBusProperty]
        var pace: AnnouncementPace
        var pending: Set<String> = []
        /// Its number in `queue` (ids of the heap).
        var number: UInt64
        /// When it is due in `queue`; nil when not queued.
        var queuedAt: VigilInstant?
    }

    private let clock: any VigilClock
    private let log: Logger
    private let announce: Announce
    let announcementsPerSecond: Int
    private var objects: [String: Object] = [:]
    /// Objects' paths by number.
    private var paths: [UInt64: String] = [:]
    private var nextNumber: UInt64 = 0
    /// Objects with an announcement due, by when; an entry whose object
    /// was forgotten, announced or queued again since is stale and skipped.
    private var queue = InstantHeap()
    /// Announcements the budget still allows, and when it was last topped up.
    private var budget: Double
    private var budgetAt: VigilInstant?
    /// The one task waiting for the next flush; `number` tells it from a
    /// replaced one that woke before its cancel.
    private var flush: (at: VigilInstant, number: UInt64, task: Task<Void, Never>)?
    private var lastFlushNumber: UInt64 = 0
    /// Announcements made so far (tests and benchmarks read it).
    private(set) var announcements = 0

    init(clock: any VigilClock, log: Logger, announcementsPerSecond: Int = PropertiesChangedLimiter.defaultAnnouncementsPerSecond,
         announce: @escaping Announce) {
        self.clock = clock
        self.log = log
        self.announce = announce
        self.announcementsPerSecond = max(1, announcementsPerSecond)
        self.budget = Double(max(1, announcementsPerSecond))
    }

    /// A limiter whose announcements are PropertiesChanged signals of
    /// `server`'s objects, each flush in one hop to its connection.
    init(clock: any VigilClock, log: Logger, server: DBusObjectServer,
         announcementsPerSecond: Int = PropertiesChangedLimiter.defaultAnnouncementsPerSecond) {
        self.init(clock: clock, log: log, announcementsPerSecond: announcementsPerSecond) { announcements in
            try await server.apply(announcements.map {
                .propertiesChangedValues(path: $0.path, interface: $0.interface, values: $0.values)
            })
        }
    }

    deinit {
        flush?.task.cancel()
    }

    /// An object was exported. `startsInterval`: its export counts as an
    /// announcement (InterfacesAdded carried its values), so a change right
    /// after it waits for the interval.
    func track(_ path: String, interface: DBusInterface, startsInterval: Bool) {
        forget(path)
        nextNumber += 1
        objects[path] = Object(interface: interface.name, properties: interface.properties, pace: AnnouncementPace(startingAt: startsInterval ? clock.now : nil), number: nextNumber)
        paths[nextNumber] = path
    }

    /// The object is gone: nothing more is announced for it.
    func forget(_ path: String) {
        guard let object = objects.removeValue(forKey: path) else { return }
        paths[object.number] = nil
    }

    /// Forgets every object (the connection is gone).
    func forgetAll() {
        flush?.task.cancel()
        flush = nil
        objects = [:]
        paths = [:]
        queue = InstantHeap()
    }

    /// `properties` of the object at `path` changed. Announced when the
    /// interval since its last announcement has passed and the host's
    /// budget allows, else later (`immediately`: now, whatever the interval
    /// and the budget).
    func changed(_ path: String, properties: Set<String>, immediately: Bool = false) async {
        guard immediately else { return await changed([path], properties: properties) }
        guard !properties.isEmpty, var object = objects[path] else { return }
        object.pending.formUnion(properties)
        // Its place in the queue, if any, goes stale.
        object.queuedAt = nil
        guard let announcement = take(&object, path: path, at: clock.now) else { return }
        objects[path] = object
        await send([announcement])
    }

    /// ``changed(_:properties:immediately:)`` for many objects in one call
    /// (a batch of lease statuses: one hop into the actor, one flush).
    func changed(_ objectPaths: [String], properties: Set<String>) async {
        guard !properties.isEmpty else { return }
        let now = clock.now
        for path in objectPaths { mark(path, properties, now) }
        await flushDue()
    }

    /// Notes the change and queues the object if it is not queued yet.
    private func mark(_ path: String, _ properties: Set<String>, _ now: VigilInstant) {
        guard let index = objects.index(forKey: path) else { return }
        // In place: reading the entry out of the table copies it. An empty
        // set takes `properties` as it is (shared, not a set made per change).
        if objects.values[index].pending.isEmpty {
            objects.values[index].pending = properties
        } else {
            objects.values[index].pending.formUnion(properties)
        }
        guard objects.values[index].queuedAt == nil else { return }
        let due = objects.values[index].pace.earliest(after: now)
        objects.values[index].queuedAt = due
        enqueue(objects.values[index].number, at: due)
    }

    /// Whether the queue's entry (`at`, `number`) is still an object's place.
    private func isQueued(_ at: VigilInstant, _ number: UInt64) -> Bool {
        guard let path = paths[number] else { return false }
        return objects[path]?.queuedAt == at
    }

    private func enqueue(_ number: UInt64, at due: VigilInstant) {
        if queue.count >= 2 * objects.count + 64 {
            queue.rebuild { paths[$0].flatMap { objects[$0]?.queuedAt } != nil }
        }
        queue.push(due, number)
    }

    /// Announces the objects that are due, as far as the budget allows, in
    /// one batch; then waits for the next.
    private func flushDue() async {
        let now = clock.now
        topUpBudget(now)
        var batch: [Due] = []
        while let top = queue.top, top.at <= now, budget >= 1 {
            queue.pop()
            guard let path = paths[top.id], var object = objects[path], object.queuedAt == top.at else { continue }
            object.queuedAt = nil
            let announcement = take(&object, path: path, at: now)
            objects[path] = object
            guard let announcement else { continue }
            budget -= 1
            batch.append(announcement)
        }
        planFlush(now)
        if !batch.isEmpty { await send(batch) }
    }

    /// What an object announces now: its pending properties, whose values
    /// ``send(_:)`` reads (nil when nothing is pending).
    private struct Due {
        var path: String
        var interface: String
        var properties: [DBusProperty]
        var names: [String]
    }

    /// Takes `object`'s pending properties for an announcement now.
    private func take(_ object: inout Object, path: String, at now: VigilInstant) -> Due? {
        let names = object.pending.sorted()
        object.pending = []
        object.pace.announced(at: now)
        guard !names.isEmpty else { return nil }
        return Due(path: path, interface: object.interface, properties: object.properties, names: names)
    }

    private func topUpBudget(_ now: VigilInstant) {
        let rate = Double(announcementsPerSecond)
        if let at = budgetAt {
            budget = min(rate, budget + rate * (now - at).seconds)
        }
        budgetAt = now
    }

    /// Waits for the next queued object's due time; while the budget is
    /// spent, for ``backlogFlushSpacing``.
    private func planFlush(_ now: VigilInstant) {
        while let top = queue.top, !isQueued(top.at, top.id) { queue.pop() }
        guard let top = queue.top else { return }
        let at = top.at <= now ? now + Self.backlogFlushSpacing : top.at
        if let flush, flush.at <= at { return }
        flush?.task.cancel()
        lastFlushNumber += 1
        let number = lastFlushNumber
        let clock = self.clock
        // Unstructured task: cancelled when the next planned flush replaces it, by
        // forgetAll() and by deinit.
        flush = (at, number, Task { [weak self] in
            do { try await clock.sleep(until: at) } catch { return }
            await self?.flushCame(number)
        })
    }

    private func flushCame(_ number: UInt64) async {
        guard flush?.number == number else { return }
        flush = nil
        await flushDue()
    }

    /// Reads each announcement's values through the declared getters (the
    /// values of this moment), then sends them all. A batch that fails (an
    /// object removed meanwhile: its lease ended) is sent again one by one,
    /// so one gone object does not hold back the others (those sent before
    /// it go twice, with the same values).
    private func send(_ due: [Due]) async {
        var batch: [Announcement] = []
        batch.reserveCapacity(due.count)
        for object in due {
            do {
                var values: [(name: String, value: BusValue)] = []
                for name in object.names {
                    guard let getter = object.properties.first(where: { $0.name == name })?.getter else { continue }
                    values.append((name, try await getter(object.path)))
                }
                batch.append(Announcement(path: object.path, interface: object.interface, values: values))
            } catch {
                log.warning("cannot announce \(object.path) properties on D-Bus: \(error)")
            }
        }
        guard !batch.isEmpty else { return }
        announcements += batch.count
        do {
            try await announce(batch)
        } catch {
            guard batch.count > 1 else {
                log.warning("cannot announce \(batch[0].path) properties on D-Bus: \(error)")
                return
            }
            for announcement in batch {
                do {
                    try await announce([announcement])
                } catch {
                    log.warning("cannot announce \(announcement.path) properties on D-Bus: \(error)")
                }
            }
        }
    }
}
