import CVoipSocket
import Glibc
import Synchronization

/// One thread in `epoll_wait` for every socket of the plugin.
///
/// Why one thread: a process holding thousands of keep-alive sockets must not
/// pay a thread, a dispatch source or a polling timer per socket, and must
/// not wake when nothing happens. The thread sleeps in the kernel until a
/// socket has data, can take output, or failed; it reads what is there and
/// hands it to the socket's ``TCPLink``, which resumes whoever awaits it.
/// Timing (keep-alive deadlines, handler and connect timeouts) is not done
/// here: it runs on the host's clock and wake scheduler, so tests can drive it.
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
    /// Why the loop could not start (no epoll fd, no thread), if it failed.
    let startFailure: String?
    private let table = Mutex(Table())

    private init() {
        let fd = vigil_epoll_create()
        epollFD = fd
        guard fd >= 0 else {
            startFailure = "cannot create the socket event loop: epoll_create1: \(String(cString: strerror(errno)))"
            return
        }
        var thread = pthread_t()
        // The loop is a process-lifetime singleton: the thread keeps one
        // reference for ever.
        let context = Unmanaged.passRetained(SocketEventThread(epollFD: fd)).toOpaque()
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

    /// Number of sockets watched (tests, benchmarks).
    var watchedCount: Int { table.withLock { $0.count } }

    fileprivate func link(for token: UInt64) -> TCPLink? {
        table.withLock { $0.link(for: token) }
    }
}

/// The event thread's own state: the event array and the read buffer, used
/// by that thread only.
// Invariant: `run` is called once, on the event thread, which is then the
// only thread touching `events` and `buffer`.
private final class SocketEventThread: @unchecked Sendable {
    let epollFD: Int32
    let events = UnsafeMutablePointer<vigil_socket_event>.allocate(capacity: 256)
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)

    init(epollFD: Int32) { self.epollFD = epollFD }

    func run() {
        let loop = SocketEventLoop.shared
        while true {
            let count = vigil_epoll_wait(epollFD, events, 256, -1)
            if count < 0 { continue }  // EINTR is retried in C; nothing else is expected
            for i in 0..<Int(count) {
                let event = events[i]
                loop.link(for: event.token)?.handle(events: event.events, buffer: buffer)
            }
        }
    }
}
