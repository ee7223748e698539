import CVoipSocket
import Glibc
import Synchronization
import VigilKit

/// One thread in `epoll_wait` for every socket of the plugin.
///
/// Why one thread: a process holding thousands of keep-alive sockets must not
/// pay a thread, a dispatch source or a polling timer per socket, and must
/// not wake when nothing happens. The thread sleeps in the kernel until a
/// socket has data, can take output, or failed; it reads what is there and
/// hands it to the socket's ``TCPLink``, which resumes whoever awaits it.
/// Timing (keep-alive deadlines, handler and connect timeouts) is not done
/// here: it runs on the host's clock and wake scheduler, so tests can drive it.
///
/// The thread also sends the pings of a keep-alive round (``run(_:)``): the
/// pongs come back to this thread, so a round done here touches each
/// connection from one core and takes no lock its pong handling holds (done
/// from the wake's thread, the two threads fought over every link's lock and
/// bounced its cache lines between cores, which was a quarter of a ping's
/// CPU). A round is sent a slice at a time between socket events, so the
/// first pongs are read while the last pings go out.
final class SocketEventLoop: Sendable {
    /// The plugin's loop, started on first use and kept for the life of the process.
    static let shared = SocketEventLoop()

    /// The watched links in slots; an event's token is its slot and the
    /// slot's use count, so finding the link is an array index (a dictionary
    /// lookup per event showed in a ping's cost) and an event still queued
    /// for a link that left its slot cannot reach the slot's next link.
    private struct Table {
        var links: [TCPLink?] = []
        var uses: [UInt32] = []
        var free: [Int] = []
        var count = 0

        static func token(slot: Int, use: UInt32) -> UInt64 { UInt64(use) << 32 | UInt64(slot) }

        func link(for token: UInt64) -> TCPLink? {
            let slot = Int(token & 0xFFFF_FFFF)
            guard slot < links.count, uses[slot] == UInt32(truncatingIfNeeded: token >> 32) else { return nil }
            return links[slot]
        }
    }

    private let epollFD: Int32
    /// Written to wake the thread for queued rounds; watched level-triggered
    /// under ``wakeToken``.
    private let wakeFD: Int32
    /// Why the loop could not start (no epoll fd, no thread), if it failed.
    let startFailure: String?
    private let table = Lock(Table())
    /// Rounds handed over and not yet taken by the thread.
    private let queued = Lock<[KeepAliveSchedule.Due]>([])
    /// Whether `queued` holds rounds: the thread looks between two events
    /// without taking the lock (the eventfd only wakes it from its sleep).
    fileprivate let hasQueued = Atomic<Bool>(false)
    /// The token of ``wakeFD``; no link's (their slot is below 2³²−1).
    fileprivate static let wakeToken = UInt64.max

    private init() {
        let fd = vigil_epoll_create()
        epollFD = fd
        wakeFD = fd >= 0 ? vigil_eventfd() : -1
        guard fd >= 0, wakeFD >= 0, vigil_epoll_add_level_in(fd, wakeFD, Self.wakeToken) == 0 else {
            startFailure = "cannot create the socket event loop: \(fd < 0 ? "epoll_create1" : "eventfd"): \(String(cString: strerror(errno)))"
            return
        }
        var thread = pthread_t()
        // The loop is a process-lifetime singleton: the thread keeps one
        // reference for ever.
        let context = Unmanaged.passRetained(SocketEventThread(epollFD: fd, wakeFD: wakeFD)).toOpaque()
        let rc = pthread_create(&thread, nil, { raw in
            guard let raw else { return nil }
            Unmanaged<SocketEventThread>.fromOpaque(raw).takeUnretainedValue().run()
            return nil
        }, context)
        if rc == 0 {
            pthread_detach(thread)
            startFailure = nil
        } else {
            Unmanaged<SocketEventThread>.fromOpaque(context).release()
            startFailure = "cannot start the socket event thread: \(String(cString: strerror(rc)))"
        }
    }

    /// Watches `fd` for `link`; returns the token the events will carry.
    func register(_ link: TCPLink, fd: Int32) throws(LinkError) -> UInt64 {
        if let startFailure { throw LinkError(startFailure) }
        let token = table.withLock { table -> UInt64 in
            let slot: Int
            if let reused = table.free.popLast() {
                slot = reused
            } else {
                slot = table.links.count
                table.links.append(nil)
                table.uses.append(0)
            }
            table.uses[slot] &+= 1
            table.links[slot] = link
            table.count += 1
            return Table.token(slot: slot, use: table.uses[slot])
        }
        if vigil_epoll_add(epollFD, fd, token) != 0 {
            let why = String(cString: strerror(errno))
            remove(token)
            throw LinkError("cannot watch the socket: epoll_ctl: \(why)")
        }
        return token
    }

    /// Stops watching `fd`; call before closing it.
    func unregister(token: UInt64, fd: Int32) {
        _ = vigil_epoll_del(epollFD, fd)
        remove(token)
    }

    private func remove(_ token: UInt64) {
        table.withLock { table in
            let slot = Int(token & 0xFFFF_FFFF)
            guard slot < table.links.count, table.uses[slot] == UInt32(truncatingIfNeeded: token >> 32), table.links[slot] != nil else { return }
            table.links[slot] = nil
            table.free.append(slot)
            table.count -= 1
        }
    }

    /// Runs the rounds' `due` on the event thread, in order, a slice at a
    /// time between socket events; at once, here, when the loop did not
    /// start (then no link is open and each round settles as failed).
    func run(_ rounds: [KeepAliveSchedule.Due]) {
        guard startFailure == nil else {
            for round in rounds { round.keeper.due(generation: round.generation) }
            return
        }
        let wake = queued.withLock { queue in
            defer {
                queue.append(contentsOf: rounds)
                hasQueued.store(true, ordering: .releasing)
            }
            return queue.isEmpty
        }
        guard wake else { return }  // a wake is on its way already
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    fileprivate func takeQueued(into pending: inout [KeepAliveSchedule.Due]) {
        queued.withLock { queue in
            hasQueued.store(false, ordering: .relaxed)
            if pending.isEmpty { swap(&pending, &queue) } else { pending.append(contentsOf: queue); queue = [] }
        }
    }

    /// Number of sockets watched (tests, benchmarks).
    var watchedCount: Int { table.withLock { $0.count } }

    fileprivate func link(for token: UInt64) -> TCPLink? {
        table.withLock { $0.link(for: token) }
    }
}

/// The event thread's own state: the event array, the read buffer and the
/// rounds it is sending, used by that thread only.
// Invariant: `run` is called once, on the event thread, which is then the
// only thread touching `events`, `buffer`, `pending` and the indexes.
private final class SocketEventThread: @unchecked Sendable {
    let epollFD: Int32
    let wakeFD: Int32
    static let eventCapacity: Int32 = 256
    let events = UnsafeMutablePointer<vigil_socket_event>.allocate(capacity: Int(eventCapacity))
    /// Events from the last wait; those before `nextEvent` are handled.
    var eventCount = 0
    var nextEvent = 0
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
    /// Rounds taken from the queue; those before `nextRound` are done.
    var pending: [KeepAliveSchedule.Due] = []
    var nextRound = 0
    /// Rounds run in a turn: each is a send, so the pongs of a large round
    /// wait for at most this many sends.
    static let roundsPerTurn = 64
    /// While rounds wait, how long a turn of socket events may take before
    /// the rounds get the thread back (TLS handshakes of thousands of
    /// connections at once must not make their pings late).
    static let eventTurnNanoseconds: UInt64 = 1_000_000

    init(epollFD: Int32, wakeFD: Int32) {
        self.epollFD = epollFD
        self.wakeFD = wakeFD
    }

    func run() {
        let loop = SocketEventLoop.shared
        while true {
            let roundsWait = nextRound < pending.count
            if nextEvent == eventCount {
                // With rounds to send, only look at what is ready; else sleep.
                let count = vigil_epoll_wait(epollFD, events, Self.eventCapacity, roundsWait ? 0 : -1)
                eventCount = max(0, Int(count))  // EINTR is retried in C; nothing else is expected
                nextEvent = 0
            }
            let turnEnd = roundsWait ? monotonicNanoseconds() + Self.eventTurnNanoseconds : UInt64.max
            while nextEvent < eventCount {
                let event = events[nextEvent]
                nextEvent += 1
                if event.token == SocketEventLoop.wakeToken {
                    var value: UInt64 = 0
                    _ = read(wakeFD, &value, 8)
                } else {
                    loop.link(for: event.token)?.handle(events: event.events, buffer: buffer)
                }
                // Rounds came, or waited long enough: their turn.
                if roundsWait ? monotonicNanoseconds() > turnEnd : loop.hasQueued.load(ordering: .relaxed) { break }
            }
            if loop.hasQueued.load(ordering: .acquiring) {
                if nextRound == pending.count {
                    pending.removeAll(keepingCapacity: pending.capacity <= 1024)
                    nextRound = 0
                }
                loop.takeQueued(into: &pending)
            }
            let end = min(pending.count, nextRound + Self.roundsPerTurn)
            while nextRound < end {
                let round = pending[nextRound]
                nextRound += 1
                round.keeper.due(generation: round.generation)
            }
        }
    }

    private func monotonicNanoseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) &* 1_000_000_000 &+ UInt64(now.tv_nsec)
    }
}
