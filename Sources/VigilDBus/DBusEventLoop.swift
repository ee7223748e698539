import CDBus
import CFDWatch
import Glibc
import VigilKit

/// The thread a connection's libdbus work runs on: it waits in
/// `epoll_wait(2)` on the connection's socket (libdbus's watches) and an
/// eventfd, with the nearest libdbus timeout (present only while a call
/// awaits its reply) as the wait's timeout, so an idle connection causes
/// no wakeups. Work from other threads (``async(execute:)``) is queued and
/// the thread woken through the eventfd; work queued while it is busy, as
/// the dispatching of the messages it just read, costs no wakeup.
///
/// With libdispatch sources (the first design), each message read took
/// three threads: the manager thread's epoll saw the socket readable, a
/// worker ran the read source's handler, and the manager re-armed the
/// source; every toggle of libdbus's write watch was another round through
/// the manager. Here one thread reads, dispatches and writes.
///
/// Each connection has its own loop, and so its own epoll set: a socket
/// number closed by libdbus and reused by another connection can never be
/// confused with it.
final class DBusEventLoop: @unchecked Sendable {
    // Invariant: what other threads share (`Shared`) is behind `shared`.
    // Everything else mutable (`watches`, `registered`, `timeouts`) is
    // touched only on the loop's thread, by the jobs and the libdbus
    // callbacks it runs. `epoll` and `wakeFD` are set in init and closed
    // in deinit, after the thread (which holds the loop) has returned.
    private struct Shared: ~Copyable {
        var jobs: [Job] = []
        /// The thread is running, not waiting: it looks at `jobs` before
        /// it waits again, so queueing needs no wakeup.
        var awake = true
        var stopping = false
        var ended = false
    }
    private let shared = Lock(Shared())
    private let epoll: Int32
    private let wakeFD: Int32

    private var watches: [Int32: [DBusWatchBox]] = [:]
    /// The interest each fd is registered with in `epoll` (absent: none).
    private var registered: [Int32: UInt32] = [:]
    private var timeouts: [ObjectIdentifier: DBusTimeoutBox] = [:]
    /// Run once when their fd becomes writable (``whenWritable(_:_:)``).
    private var writableWaiters: [Int32: () -> Void] = [:]

    /// Work queued for the loop's thread: a closure, or a job of a task
    /// that runs on the loop as its executor (kept as it is, rather than
    /// wrapped in a closure that would cost an allocation per job).
    private enum Job: Sendable {
        case closure(@Sendable () -> Void)
        case task(UnownedJob)
    }

    /// The epoll token of the eventfd; fds are registered as fd + 1.
    private static let wakeToken: UInt64 = 0

    init() throws(DBusError) {
        let epoll = vigil_fdwatch_create()
        guard epoll >= 0 else { throw .failed("cannot create the D-Bus connection's epoll set: \(String(cString: strerror(errno)))") }
        let wakeFD = vigil_fdwatch_eventfd()
        guard wakeFD >= 0, vigil_fdwatch_add(epoll, wakeFD, Self.wakeToken, UInt32(VIGIL_FDWATCH_IN)) == 0 else {
            let message = String(cString: strerror(errno))
            if wakeFD >= 0 { close(wakeFD) }
            close(epoll)
            throw .failed("cannot create the D-Bus connection's wake eventfd: \(message)")
        }
        self.epoll = epoll
        self.wakeFD = wakeFD
        // A bare pthread with a 1 MiB stack (the loop's frames are few):
        // Foundation's Thread would fault in its own machinery, which an
        // idle vigild's memory budget has no room for.
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setstacksize(&attributes, 1 << 20)
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        // The thread holds the loop (released when `run` returns).
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let started = pthread_create(&thread, &attributes, { context in
            guard let context else { return nil }
            let loop = Unmanaged<DBusEventLoop>.fromOpaque(context).takeRetainedValue()
            vigil_fdwatch_name_thread("vigil-dbus")
            loop.run()
            return nil
        }, context)
        guard started == 0 else {
            Unmanaged<DBusEventLoop>.fromOpaque(context).release()
            throw .failed("cannot start the D-Bus connection's thread: \(String(cString: strerror(started)))")
        }
    }

    deinit {
        close(epoll)
        close(wakeFD)
    }

    /// Runs `job` on the loop's thread, after the jobs queued before it.
    /// Dropped once the loop has ended (its connection is gone).
    func async(execute job: @escaping @Sendable () -> Void) {
        post { state in
            guard !state.ended else { return false }
            state.jobs.append(.closure(job))
            return true
        }
    }

    /// Ends the thread once the jobs queued so far have run.
    func stop() {
        post { state in
            state.stopping = true
            return true
        }
    }

    /// Makes `change` to the shared state; when it gave the thread
    /// something to do and the thread waits, wakes it.
    @discardableResult
    private func post(_ change: (inout Shared) -> Bool) -> Bool {
        let (changed, wake) = shared.withLock { state -> (Bool, Bool) in
            guard change(&state) else { return (false, false) }
            guard !state.awake else { return (true, false) }
            state.awake = true
            return (true, true)
        }
        if wake { vigil_fdwatch_eventfd_signal(wakeFD) }
        return changed
    }

    private func run() {
        var tokens = [UInt64](repeating: 0, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        // The batch being run and the queue swap buffers, so neither
        // array is reallocated as jobs come and go.
        var batch: [Job] = []
        while true {
            let stop = shared.withLock { state -> Bool in
                if state.jobs.isEmpty {
                    if state.stopping {
                        state.ended = true
                    } else {
                        state.awake = false
                    }
                    return state.stopping
                }
                swap(&state.jobs, &batch)
                return false
            }
            if stop { break }
            if !batch.isEmpty {
                for job in batch {
                    switch job {
                    case .closure(let body): body()
                    case .task(let job): job.runSynchronously(on: asUnownedTaskExecutor())
                    }
                }
                batch.removeAll(keepingCapacity: true)
                endTurn()
                continue
            }
            let ready = vigil_fdwatch_wait(epoll, &tokens, &events, Int32(tokens.count), nextTimeoutMilliseconds())
            shared.withLock { $0.awake = true }
            if ready < 0 {
                // Only EINTR is expected: the set and the buffers are ours.
                continue
            }
            for index in 0..<Int(ready) {
                if tokens[index] == Self.wakeToken {
                    vigil_fdwatch_eventfd_drain(wakeFD)
                } else {
                    handle(fd: Int32(truncatingIfNeeded: tokens[index] - 1), events: events[index])
                }
            }
            fireDueTimeouts()
            endTurn()
        }
        // Break the box <-> loop references of anything libdbus left.
        watches = [:]
        timeouts = [:]
        writableWaiters = [:]
        turnEnders = []
    }

    /// Run at the end of the current turn (a batch of jobs, or the events
    /// of one wait), before the loop looks for more work.
    private var turnEnders: [() -> Void] = []

    func atEndOfTurn(_ body: @escaping () -> Void) { turnEnders.append(body) }

    private func endTurn() {
        while !turnEnders.isEmpty {
            let enders = turnEnders
            turnEnders = []
            for body in enders { body() }
        }
    }

    // MARK: watches (loop thread)

    func add(_ box: DBusWatchBox) {
        watches[box.fd, default: []].append(box)
        refresh(box.fd)
    }

    func remove(_ box: DBusWatchBox) {
        watches[box.fd]?.removeAll { $0 === box }
        refresh(box.fd)
    }

    /// Registers `fd` for what its enabled watches want. An fd no enabled
    /// watch wants leaves the set: registered with no interest, a hung-up
    /// socket would be reported over and over with nobody to handle it.
    func refresh(_ fd: Int32) {
        let boxes = watches[fd] ?? []
        if boxes.isEmpty { watches[fd] = nil }
        let waiting = writableWaiters[fd] != nil ? UInt32(VIGIL_FDWATCH_OUT) : 0
        let wanted = boxes.reduce(waiting) { $0 | $1.interest }
        let current = registered[fd]
        guard wanted != (current ?? 0) else { return }
        let token = UInt64(UInt32(bitPattern: fd)) + 1
        if wanted == 0 {
            _ = vigil_fdwatch_remove(epoll, fd)
            registered[fd] = nil
        } else if current == nil {
            if vigil_fdwatch_add(epoll, fd, token, wanted) == 0 { registered[fd] = wanted }
        } else {
            if vigil_fdwatch_modify(epoll, fd, token, wanted) == 0 { registered[fd] = wanted }
        }
    }

    /// Runs `body` once, on the loop's thread, when `fd` (one of libdbus's
    /// sockets) can be written to, hangs up or fails; it replaces a `body`
    /// given before for `fd`.
    func whenWritable(_ fd: Int32, _ body: @escaping () -> Void) {
        writableWaiters[fd] = body
        refresh(fd)
    }

    private func handle(fd: Int32, events: UInt32) {
        let wakes = UInt32(VIGIL_FDWATCH_OUT | VIGIL_FDWATCH_HUP | VIGIL_FDWATCH_ERR)
        var waiter: (() -> Void)?
        if events & wakes != 0, let body = writableWaiters.removeValue(forKey: fd) {
            waiter = body
            refresh(fd)
        }
        defer { waiter?() }
        guard let boxes = watches[fd] else { return }
        var flags: UInt32 = 0
        if events & UInt32(VIGIL_FDWATCH_IN) != 0 { flags |= DBUS_WATCH_READABLE.rawValue }
        if events & UInt32(VIGIL_FDWATCH_OUT) != 0 { flags |= DBUS_WATCH_WRITABLE.rawValue }
        if events & UInt32(VIGIL_FDWATCH_HUP) != 0 { flags |= DBUS_WATCH_HANGUP.rawValue }
        if events & UInt32(VIGIL_FDWATCH_ERR) != 0 { flags |= DBUS_WATCH_ERROR.rawValue }
        var connection: DBusConnection?
        for box in boxes where box.interest != 0 {
            let mine = flags & (box.flags | DBUS_WATCH_HANGUP.rawValue | DBUS_WATCH_ERROR.rawValue)
            guard mine != 0, box.handle(mine) else { continue }
            connection = connection ?? box.connection
        }
        connection?.drainDispatch()
    }

    // MARK: timeouts (loop thread)

    func arm(_ box: DBusTimeoutBox) { timeouts[ObjectIdentifier(box)] = box }

    func disarm(_ box: DBusTimeoutBox) { timeouts[ObjectIdentifier(box)] = nil }

    private func nextTimeoutMilliseconds() -> Int32 {
        guard let nearest = timeouts.values.lazy.map(\.deadline).min() else { return -1 }
        let now = Self.now()
        guard nearest > now else { return 0 }
        return Int32(clamping: (nearest - now + 999_999) / 1_000_000)
    }

    private func fireDueTimeouts() {
        guard !timeouts.isEmpty else { return }
        let now = Self.now()
        let due = timeouts.values.filter { $0.deadline <= now }
        for box in due { box.fire(now: now) }
    }

    /// CLOCK_MONOTONIC in nanoseconds, the clock epoll_wait's timeout counts.
    static func now() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}

/// The loop as a task executor: the tasks of ``DBusMethod/brief(_:in:out:_:)``
/// handlers run their jobs on the loop's thread, between its other work.
extension DBusEventLoop: TaskExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let queued = post { state in
            guard !state.ended else { return false }
            state.jobs.append(.task(job))
            return true
        }
        // The connection is gone: the task still finishes, on the global
        // pool (a job dropped would leave it suspended for ever).
        if !queued { globalConcurrentExecutor.enqueue(ExecutorJob(job)) }
    }
}

/// One libdbus watch (a socket to wait on), on its connection's loop.
/// Only used on the loop's thread.
final class DBusWatchBox {
    let watch: OpaquePointer
    let fd: Int32
    let loop: DBusEventLoop
    weak var connection: DBusConnection?
    /// The libdbus flags (readable, writable) the watch is for.
    private(set) var flags: UInt32 = 0
    /// What the loop waits for on the watch's behalf (0 while disabled).
    private(set) var interest: UInt32 = 0
    private var removed = false

    init(watch: OpaquePointer, loop: DBusEventLoop, connection: DBusConnection?) {
        self.watch = watch
        self.fd = dbus_watch_get_unix_fd(watch)
        self.loop = loop
        self.connection = connection
    }

    /// Reads the watch's state from libdbus (added or toggled).
    func update(adding: Bool = false) {
        guard !removed else { return }
        flags = dbus_watch_get_flags(watch)
        var wanted: UInt32 = 0
        if dbus_watch_get_enabled(watch) != 0 {
            if flags & DBUS_WATCH_READABLE.rawValue != 0 { wanted |= UInt32(VIGIL_FDWATCH_IN) }
            if flags & DBUS_WATCH_WRITABLE.rawValue != 0 { wanted |= UInt32(VIGIL_FDWATCH_OUT) }
        }
        interest = wanted
        if adding { loop.add(self) } else { loop.refresh(fd) }
    }

    func remove() {
        guard !removed else { return }
        removed = true
        interest = 0
        loop.remove(self)
    }

    /// Lets libdbus handle `flags`; false when the watch was removed.
    func handle(_ flags: UInt32) -> Bool {
        guard !removed else { return false }
        _ = dbus_watch_handle(watch, flags)
        return true
    }
}

/// One libdbus timeout (a reply deadline), on its connection's loop. Only
/// used on the loop's thread.
final class DBusTimeoutBox {
    let timeout: OpaquePointer
    let loop: DBusEventLoop
    weak var connection: DBusConnection?
    /// When it fires next (CLOCK_MONOTONIC ns), while armed.
    private(set) var deadline: UInt64 = 0
    private var removed = false

    init(timeout: OpaquePointer, loop: DBusEventLoop, connection: DBusConnection?) {
        self.timeout = timeout
        self.loop = loop
        self.connection = connection
    }

    /// Arms it for its interval from now, or disarms it (added or toggled).
    func update() {
        guard !removed, dbus_timeout_get_enabled(timeout) != 0 else { return loop.disarm(self) }
        deadline = DBusEventLoop.now() + Self.nanoseconds(dbus_timeout_get_interval(timeout))
        loop.arm(self)
    }

    func remove() {
        removed = true
        loop.disarm(self)
    }

    /// The deadline passed: libdbus handles it (a call's reply timed out),
    /// and it repeats after its interval unless libdbus removed it.
    func fire(now: UInt64) {
        guard !removed else { return }
        deadline = now + Self.nanoseconds(dbus_timeout_get_interval(timeout))
        _ = dbus_timeout_handle(timeout)
        connection?.drainDispatch()
    }

    private static func nanoseconds(_ milliseconds: Int32) -> UInt64 {
        UInt64(max(0, milliseconds)) * 1_000_000
    }
}
