import CDBus
import Glibc
import VigilKit

/// A connection's libdbus work, run on the host's event loop (VigilKit's
/// ``EventLoop``): the connection's socket is one of the loop's watches
/// (libdbus's watches, merged per descriptor), its libdbus timeouts (present
/// only while a call awaits its reply) are the loop's monotonic timers, and
/// the work other tasks hand it (``async(execute:)``, the jobs of the tasks
/// that prefer it as their executor) is posted to the loop. An idle
/// connection therefore causes no wakeups, and needs no thread of its own.
///
/// Every libdbus call for the connection happens on the loop's one thread,
/// so the connection's lock in libdbus is never contended, and a message
/// read completes its call's continuation without a context switch (the
/// one exception, a watch toggled from a task's thread, is posted to the
/// loop: ``DBusWatchBox/update(adding:)``). In vigild
/// that thread also runs every Swift job: nothing here, nor in a task that
/// prefers this executor, may wait for the loop (a semaphore, a blocking
/// libdbus call such as `dbus_connection_send_with_reply_and_block` or
/// `dbus_pending_call_block`, a blocking flush), since the loop would be
/// the one waiting. Calls await their reply through a pending call's notify.
///
/// Each connection used to have a thread of its own ("vigil-dbus", until
/// issue 47) with its own epoll set, so that a socket number libdbus closed
/// and another connection reused could not be confused with it. In the one
/// set that is kept by libdbus's order of work: it removes a socket's
/// watches (and so the loop's registration) before it closes the socket.
final class DBusEventLoop: @unchecked Sendable {
    // Invariant: `ended` is behind its lock (read by `async` and `enqueue`
    // on any thread). Everything else mutable is touched only on the host
    // loop's thread, by the posted work, the watch handlers and timer
    // callbacks it runs and the libdbus callbacks those cause.
    private let ended = Lock(false)

    /// libdbus's watches, by descriptor: it usually has two (read, write)
    /// for its one socket, and epoll takes a descriptor only once.
    private var watches: [Int32: [DBusWatchBox]] = [:]
    /// The loop's watch of each descriptor, with what it waits for (absent:
    /// nothing is wanted).
    private var registered: [Int32: (watch: EventLoop.Watch, events: EventLoop.Events)] = [:]
    /// Armed timeouts, cancelled when the loop stops.
    private var timeoutBoxes: [ObjectIdentifier: DBusTimeoutBox] = [:]
    /// Run once when their fd becomes writable (``whenWritable(_:_:)``).
    private var writableWaiters: [Int32: () -> Void] = [:]
    /// Set by tests (``holdReading()``): the sockets are not read.
    private var readingHeld = false
    /// ``stop()``'s teardown ran: nothing is registered any more, nor
    /// will be.
    private(set) var stopped = false

    init() {}

    /// Runs `job` on the loop's thread, after the work queued before it
    /// (the host loop runs its posts in order). Dropped once ``stop()`` was
    /// called (its connection is gone).
    func async(execute job: @escaping @Sendable () -> Void) {
        guard !ended.withLock({ $0 }) else { return }
        EventLoop.post(job)
    }

    /// Ends the connection's watches and timers once the work queued so far
    /// has run; work queued later is dropped.
    func stop() {
        let first = ended.withLock { ended -> Bool in
            defer { ended = true }
            return !ended
        }
        guard first else { return }
        EventLoop.post { [self] in
            stopped = true
            for registration in registered.values { registration.watch.cancel() }
            registered = [:]
            for box in timeoutBoxes.values { box.remove() }
            // Break the box <-> loop references of anything libdbus left.
            watches = [:]
            timeoutBoxes = [:]
            writableWaiters = [:]
            turnEnders = []
        }
    }

    // MARK: turns (loop thread)

    /// Run at the end of the current turn: once the work queued before
    /// the first of them (the other replies of the handlers of the messages
    /// just read, say) has run, since they are posted after it.
    private var turnEnders: [() -> Void] = []
    private var turnEndPosted = false

    func atEndOfTurn(_ body: @escaping () -> Void) {
        turnEnders.append(body)
        guard !turnEndPosted else { return }
        turnEndPosted = true
        async { [self] in endTurn() }
    }

    private func endTurn() {
        while !turnEnders.isEmpty {
            let enders = turnEnders
            turnEnders = []
            for body in enders { body() }
        }
        turnEndPosted = false
    }

    // MARK: watches (loop thread)

    func add(_ box: DBusWatchBox) {
        guard !stopped else { return }
        watches[box.fd, default: []].append(box)
        refresh(box.fd)
    }

    func remove(_ box: DBusWatchBox) {
        watches[box.fd]?.removeAll { $0 === box }
        refresh(box.fd)
    }

    /// Registers `fd` with the loop for what its enabled watches want. An
    /// fd no enabled watch wants leaves the loop: with no interest, a
    /// hung-up socket would still be reported over and over with nobody to
    /// handle it. libdbus removes a socket's watches before it closes the
    /// socket, so the registration never outlives the descriptor.
    func refresh(_ fd: Int32) {
        assert(EventLoop.isCurrent, "libdbus's watches change only on the loop")
        guard !stopped else { return }
        let boxes = watches[fd] ?? []
        if boxes.isEmpty { watches[fd] = nil }
        let waiting: EventLoop.Events = writableWaiters[fd] != nil ? .writable : []
        var wanted = boxes.reduce(waiting) { $0.union($1.interest) }
        if readingHeld { wanted.remove(.readable) }
        let current = registered[fd]
        guard wanted != (current?.events ?? []) else { return }
        if wanted.isEmpty {
            current?.watch.cancel()
            registered[fd] = nil
        } else if let current {
            if current.watch.change(to: wanted) { registered[fd] = (current.watch, wanted) }
        } else {
            // Fails only for a descriptor epoll does not take (closed, or
            // not a socket): libdbus's socket is neither while it has
            // watches. The connection then stays silent, as it would
            // with a socket that never becomes ready.
            let watch = try? EventLoop.watch(fd, for: wanted) { [weak self] events in
                self?.handle(fd: fd, events: events)
            }
            if let watch { registered[fd] = (watch, wanted) }
        }
    }

    /// Runs `body` once, on the loop's thread, when `fd` (one of libdbus's
    /// sockets) can be written to, hangs up or fails; it replaces a `body`
    /// given before for `fd`.
    func whenWritable(_ fd: Int32, _ body: @escaping () -> Void) {
        writableWaiters[fd] = body
        refresh(fd)
    }

    /// Stops reading the connection's sockets until ``resumeReading()``
    /// (on the loop): what peers send waits in the socket. For tests, which
    /// can no longer make a connection's own thread wait: that thread is
    /// every connection's.
    func holdReading() {
        readingHeld = true
        for fd in Array(watches.keys) { refresh(fd) }
    }

    func resumeReading() {
        readingHeld = false
        for fd in Array(watches.keys) { refresh(fd) }
    }

    private func handle(fd: Int32, events: EventLoop.Events) {
        var waiter: (() -> Void)?
        if !events.isDisjoint(with: [.writable, .hangUp, .error]), let body = writableWaiters.removeValue(forKey: fd) {
            waiter = body
            refresh(fd)
        }
        defer { waiter?() }
        guard let boxes = watches[fd] else { return }
        var flags: UInt32 = 0
        if events.contains(.readable), !readingHeld { flags |= DBUS_WATCH_READABLE.rawValue }
        if events.contains(.writable) { flags |= DBUS_WATCH_WRITABLE.rawValue }
        if events.contains(.hangUp) { flags |= DBUS_WATCH_HANGUP.rawValue }
        if events.contains(.error) { flags |= DBUS_WATCH_ERROR.rawValue }
        var connection: DBusConnection?
        for box in boxes where !box.interest.isEmpty {
            let mine = flags & (box.flags | DBUS_WATCH_HANGUP.rawValue | DBUS_WATCH_ERROR.rawValue)
            guard mine != 0, box.handle(mine) else { continue }
            connection = connection ?? box.connection
        }
        // What was read is dispatched now, in this turn: its handlers'
        // replies then leave together at its end.
        connection?.drainDispatch()
    }

    // MARK: timeouts (loop thread)

    func armed(_ box: DBusTimeoutBox) {
        guard !stopped else { return }
        timeoutBoxes[ObjectIdentifier(box)] = box
    }

    func disarmed(_ box: DBusTimeoutBox) { timeoutBoxes[ObjectIdentifier(box)] = nil }
}

/// The loop as a task executor: the tasks of ``DBusMethod/brief(_:in:out:_:)``
/// handlers run their jobs on the loop's thread, between the connection's
/// other work.
extension DBusEventLoop: TaskExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // Never dropped, even once the connection is gone: the task must
        // still finish (a job dropped would leave it suspended for ever).
        EventLoop.post { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }
}

/// One libdbus watch (a socket to wait on), on its connection's loop.
///
/// `@unchecked Sendable`: it wraps libdbus's watch and is only used on the
/// loop's thread; another thread only posts it there (``update(adding:)``).
final class DBusWatchBox: @unchecked Sendable {
    let watch: OpaquePointer
    let fd: Int32
    let loop: DBusEventLoop
    weak var connection: DBusConnection?
    /// The libdbus flags (readable, writable) the watch is for.
    private(set) var flags: UInt32 = 0
    /// What the loop waits for on the watch's behalf (none while disabled).
    private(set) var interest: EventLoop.Events = []
    private var removed = false

    init(watch: OpaquePointer, loop: DBusEventLoop, connection: DBusConnection?) {
        self.watch = watch
        self.fd = dbus_watch_get_unix_fd(watch)
        self.loop = loop
        self.connection = connection
    }

    /// Reads the watch's state from libdbus (added or toggled).
    func update(adding: Bool = false) {
        // libdbus toggles the read watch from whichever thread releases the
        // received message that brings the connection's unread messages
        // back under their size limit (live_messages_notify): a task's.
        guard EventLoop.isCurrent else { return EventLoop.post { self.update(adding: adding) } }
        guard !removed else { return }
        flags = dbus_watch_get_flags(watch)
        var wanted: EventLoop.Events = []
        if dbus_watch_get_enabled(watch) != 0 {
            if flags & DBUS_WATCH_READABLE.rawValue != 0 { wanted.insert(.readable) }
            if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { wanted.insert(.writable) }
        }
        interest = wanted
        if adding { loop.add(self) } else { loop.refresh(fd) }
    }

    func remove() {
        guard !removed else { return }
        removed = true
        interest = []
        loop.remove(self)
    }

    /// Lets libdbus handle `flags`; false when the watch was removed.
    func handle(_ flags: UInt32) -> Bool {
        guard !removed else { return false }
        _ = dbus_watch_handle(watch, flags)
        return true
    }
}

/// One libdbus timeout (a reply deadline), as a monotonic timer of the
/// host loop (an ``EventLoop/Timer``). `@unchecked Sendable`: it wraps
/// libdbus's timeout and is only used on the loop's thread, where its
/// timer's callback runs too.
final class DBusTimeoutBox: @unchecked Sendable {
    let timeout: OpaquePointer
    let loop: DBusEventLoop
    weak var connection: DBusConnection?
    /// The scheduled timer, while armed. Its callback holds the box until
    /// it runs or is cancelled.
    private var armed: EventLoop.Timer?
    /// Which arming is current: a callback that finds another arming (or
    /// none) current when it runs is stale.
    private var generation: UInt64 = 0
    private var removed = false

    init(timeout: OpaquePointer, loop: DBusEventLoop, connection: DBusConnection?) {
        self.timeout = timeout
        self.loop = loop
        self.connection = connection
    }

    /// Arms it for its interval from now, or disarms it (added or toggled).
    func update() {
        disarm()
        guard !removed, dbus_timeout_get_enabled(timeout) != 0 else { return }
        arm()
    }

    func remove() {
        removed = true
        disarm()
    }

    private func arm() {
        generation &+= 1
        guard !loop.stopped else { return }
        let interval = Duration.milliseconds(max(0, dbus_timeout_get_interval(timeout)))
        let generation = generation
        // The loop cannot start: the call waits without a deadline, as it
        // would on a connection whose loop never runs.
        guard let timer = try? EventLoop.Timer.after(interval, on: .monotonic, { [self] in fire(generation: generation) }) else { return }
        armed = timer
        loop.armed(self)
    }

    private func disarm() {
        generation &+= 1
        guard let timer = armed else { return }
        armed = nil
        loop.disarmed(self)
        // Not removed when it ran already, or runs now on this thread and
        // finds itself stale.
        timer.cancel()
    }

    /// The deadline passed: libdbus handles it (a call's reply timed out),
    /// and it repeats after its interval unless libdbus removes or toggles
    /// it meanwhile.
    private func fire(generation: UInt64) {
        guard generation == self.generation, !removed else { return }
        // This timer is running: not for `disarm` to cancel.
        armed = nil
        arm()
        _ = dbus_timeout_handle(timeout)
        connection?.drainDispatch()
    }
}
