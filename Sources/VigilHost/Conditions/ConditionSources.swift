import CConditions
import Foundation
import VigilDBus
import VigilKit

/// What a watcher learned; the ``ConditionMonitor`` applies facts in order.
enum ConditionFact: Sendable {
    case power(PowerReading)
    /// Path → exists, for every watched path.
    case files([String: Bool])
    case online(Bool)
    /// NetworkManager's Metered property says metered (nil: unknown or no NetworkManager).
    case metered(Bool?)
    /// The active leases.
    case leases([LeaseSnapshot])
    /// The windows (as configured) and whether now is inside one.
    case time([TimeWindow], Bool)
    /// The watched process names that run now.
    case processes(Set<String>)
}

typealias FactSink = @Sendable (ConditionFact) -> Void

// MARK: files

/// `file_exists`: an inotify watch on the nearest existing directory above
/// each path, re-armed as directories come and go.
final class FileExistenceWatcher: @unchecked Sendable {
    // Invariant: `thread` is set in init and only stopped afterwards; the
    // rest is in `state` (the watch's handler on the loop and `add` both take its lock).
    private struct State {
        var paths: Set<String> = []
        var reported: [String: Bool] = [:]
        var inotify: Int32 = -1
    }
    private let state = Lock(State())
    private var thread: PollThread?
    private let sink: FactSink

    static let mask = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB)

    init(sink: @escaping FactSink) throws(ConditionWatchError) {
        self.sink = sink
        let fd = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard fd >= 0 else { throw ConditionWatchError("inotify_init1", errno) }
        state.withLock { $0.inotify = fd }
        thread = try PollThread(name: "vigil-files", prepare: { .success([fd]) }) { [weak self] fd in
            drain(fd)
            self?.rescan()
        }
    }

    /// Watches `path` too; returns the existence of every watched path.
    func add(_ path: String) -> [String: Bool] {
        state.withLock { state in
            state.paths.insert(path)
            state.reported = Self.armAndRead(state)
            return state.reported
        }
    }

    /// Reports the paths' existence when it changed: events about other
    /// entries of a watched directory cost the monitor nothing.
    private func rescan() {
        let changed = state.withLock { state -> [String: Bool]? in
            let now = Self.armAndRead(state)
            defer { state.reported = now }
            return now == state.reported ? nil : now
        }
        if let changed { sink(.files(changed)) }
    }

    /// Called under `state`'s lock.
    private static func armAndRead(_ watched: State) -> [String: Bool] {
        var state: [String: Bool] = [:]
        for path in watched.paths {
            var dir = (path as NSString).deletingLastPathComponent
            while !dir.isEmpty && dir != "/" && access(dir, F_OK) != 0 {
                dir = (dir as NSString).deletingLastPathComponent
            }
            _ = inotify_add_watch(watched.inotify, dir.isEmpty ? "/" : dir, mask)
            state[path] = access(path, F_OK) == 0
        }
        return state
    }

    /// How many times its descriptors woke it (``PollThread/wakeups``).
    var wakeups: Int { thread?.wakeups ?? 0 }

    func stop() {
        thread?.stop()
        state.withLock { state in
            if state.inotify >= 0 { close(state.inotify) }
            state.inotify = -1
        }
    }
}

// MARK: power

/// The power supplies as sysfs describes them.
struct PowerReading: Sendable, Hashable {
    /// On mains (or no supply says otherwise).
    var onAC: Bool
    /// The lowest battery capacity in percent; nil without a battery.
    var lowestBattery: Int?

    /// Reads `directory` (`/sys/class/power_supply` or a test's tree): each
    /// entry's `type`, and `online` (mains, USB) or `capacity` and `status`
    /// (batteries). Without mains supplies, the machine is on AC unless a
    /// battery is discharging; without any supply (a desktop), on AC.
    static func read(_ directory: String) -> PowerReading {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        var mains: [Bool] = []
        var discharging = false
        var lowest: Int?
        for entry in entries.sorted() {
            let base = directory + "/" + entry + "/"
            guard let type = attribute(base + "type") else { continue }
            if type == "Battery" {
                if let capacity = attribute(base + "capacity").flatMap({ Int($0) }) {
                    lowest = min(lowest ?? capacity, capacity)
                }
                if attribute(base + "status") == "Discharging" { discharging = true }
            } else if let online = attribute(base + "online") {
                mains.append(online == "1")
            }
        }
        let onAC = mains.isEmpty ? !discharging : mains.contains(true)
        return PowerReading(onAC: onAC, lowestBattery: lowest)
    }

    /// One sysfs attribute, trimmed; nil when missing, unreadable or implausibly long.
    private static func attribute(_ path: String) -> String? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let data = try? handle.read(upToCount: 256), let text = String(data: data, encoding: .utf8) else { return nil }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// `ac_power` / `battery_above`: an inotify watch on the power-supply tree and
/// its entries (a tree that is written to, as a test's fake one), and, when
/// the tree is on sysfs, kernel uevents of the power_supply subsystem (real
/// sysfs attributes change without inotify events).
final class PowerSupplyWatcher: @unchecked Sendable {
    // Invariant: `inotify` and `uevent` are set before the watch starts and
    // closed only after it stopped.
    private let directory: String
    private let inotify: Int32
    private let uevent: Int32
    private var thread: PollThread?
    private let sink: FactSink
    /// The first reading.
    let initial: PowerReading
    /// The last reading reported, so that only changes are.
    private let last: Lock<PowerReading>

    static let mask = UInt32(IN_CLOSE_WRITE | IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB)

    init(directory: String, sink: @escaping FactSink) throws(ConditionWatchError) {
        self.directory = directory
        self.sink = sink
        let fd = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard fd >= 0 else { throw ConditionWatchError("inotify_init1", errno) }
        inotify = fd
        // sysfs attributes change without inotify events: there the kernel's
        // uevents say when (unprivileged processes may listen; without them,
        // in a container without netlink, inotify still serves a tree that is
        // written to). A tree elsewhere (tests, power_supply_dir) is watched
        // by inotify alone, so the loop is not woken until that tree changes,
        // whatever other devices do.
        let onSysfs = (realpath(directory, nil).map { resolved in
            defer { free(resolved) }
            return String(cString: resolved).hasPrefix("/sys/")
        }) ?? false
        uevent = onSysfs ? vigil_netlink_open(vigil_netlink_kobject_uevent, 1) : -1
        Self.arm(fd, directory)
        initial = PowerReading.read(directory)
        last = Lock(initial)
        let fds = uevent >= 0 ? [fd, uevent] : [fd]
        let uevent = self.uevent
        thread = try PollThread(name: "vigil-power", prepare: { .success(fds) }) { [weak self] ready in
            var relevant = ready != uevent
            drain(ready) { message in
                // "change@/devices/...\0ACTION=change\0SUBSYSTEM=power_supply\0..."
                if ready == uevent, message.range(of: Array("SUBSYSTEM=power_supply".utf8)) != nil { relevant = true }
            }
            guard relevant, let self else { return }
            Self.arm(self.inotify, self.directory)
            let reading = PowerReading.read(self.directory)
            // Only changes: a uevent of another supply attribute (voltage) costs the monitor nothing.
            let changed = self.last.withLock { last in
                defer { last = reading }
                return last != reading
            }
            if changed { self.sink(.power(reading)) }
        }
    }

    private static func arm(_ inotify: Int32, _ directory: String) {
        _ = inotify_add_watch(inotify, directory, mask)
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] {
            _ = inotify_add_watch(inotify, directory + "/" + entry, mask)
        }
    }

    /// How many times its descriptors woke it (``PollThread/wakeups``).
    var wakeups: Int { thread?.wakeups ?? 0 }

    func stop() {
        thread?.stop()
        close(inotify)
        if uevent >= 0 { close(uevent) }
    }
}

extension UnsafeRawBufferPointer {
    /// Where `needle` first occurs in these bytes.
    func range(of needle: [UInt8]) -> Range<Int>? {
        guard needle.count <= count, !needle.isEmpty else { return nil }
        for start in 0...(count - needle.count) where self[start] == needle[0] {
            if (0..<needle.count).allSatisfy({ self[start + $0] == needle[$0] }) { return start..<(start + needle.count) }
        }
        return nil
    }
}

// MARK: network

/// `network = "online"`: rtnetlink link and address notifications; on each,
/// the interfaces are read again. Online means a non-loopback interface is
/// up and running (has carrier) and has an IPv4 or a non-link-local IPv6 address.
final class LinkWatcher: @unchecked Sendable {
    // Invariant: `thread` is set in init and only stopped afterwards. The
    // socket is opened in `prepare` (on the watcher's own thread inside a
    // test's network namespace, else before the loop watches it) and closed
    // only after the watch stopped.
    private let socketBox = SocketBox()
    private var thread: PollThread?
    /// The first reading.
    let initial: Bool

    /// `namespace`: a network namespace (/run/netns/NAME) the watcher's
    /// thread enters first (then the watcher keeps a thread of its own:
    /// a namespace is per thread); tests only.
    init(namespace: String?, sink: @escaping FactSink) throws(ConditionWatchError) {
        let box = socketBox
        let first = OnlineBox()
        thread = try PollThread(name: "vigil-network", onLoop: namespace == nil, prepare: {
            if let namespace, vigil_setns_net(namespace) != 0 {
                return .failure(ConditionWatchError("setns \(namespace)", errno))
            }
            let fd = vigil_netlink_open(vigil_netlink_route, vigil_rtmgrp_link | vigil_rtmgrp_ipv4_ifaddr | vigil_rtmgrp_ipv6_ifaddr)
            guard fd >= 0 else { return .failure(ConditionWatchError("rtnetlink socket", errno)) }
            box.fd.withLock { $0 = fd }
            let online = LinkWatcher.isOnline()
            first.online.withLock { $0 = online }
            return .success([fd])
        }) { fd in
            drain(fd)
            let online = LinkWatcher.isOnline()
            // Only changes: address and link events that leave the answer as it was cost the monitor nothing.
            let changed = first.online.withLock { last in
                defer { last = online }
                return last != online
            }
            if changed { sink(.online(online)) }
        }
        initial = first.online.withLock { $0 }
    }

    static func isOnline() -> Bool {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return false }
        defer { freeifaddrs(list) }
        var cursor = list
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            let flags = Int32(bitPattern: entry.pointee.ifa_flags)
            guard flags & Int32(IFF_LOOPBACK) == 0, flags & Int32(IFF_UP) != 0, flags & Int32(IFF_RUNNING) != 0,
                  let address = entry.pointee.ifa_addr else { continue }
            switch Int32(address.pointee.sa_family) {
            case AF_INET:
                return true
            case AF_INET6:
                let linkLocal = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    $0.pointee.sin6_addr.__in6_u.__u6_addr8.0 == 0xfe && ($0.pointee.sin6_addr.__in6_u.__u6_addr8.1 & 0xc0) == 0x80
                }
                if !linkLocal { return true }
            default:
                continue
            }
        }
        return false
    }

    /// How many times its descriptors woke it (``PollThread/wakeups``).
    var wakeups: Int { thread?.wakeups ?? 0 }

    func stop() {
        thread?.stop()
        let fd = socketBox.fd.withLock { $0 }
        if fd >= 0 { close(fd) }
    }
}

/// The netlink socket, opened in `prepare` and closed by `stop()`.
private final class SocketBox: Sendable {
    let fd = Lock<Int32>(-1)
}

/// The last answer: the first reading in `prepare`, then each change.
private final class OnlineBox: Sendable {
    let online = Lock(false)
}

// MARK: processes

/// `process = "mpv"`: the kernel's proc connector reports each exec and
/// exit; on an exec the new process's `comm` is read, on an exit its pid is
/// forgotten. The connector needs CAP_NET_ADMIN; without it the watcher
/// cannot start and the host says so (docs/composition.md).
final class ProcessWatcher: @unchecked Sendable {
    // Invariant: `thread` is set in init and only stopped afterwards; the
    // rest is in `watched` or fixed at init.
    private struct Watched {
        var names: Set<String> = []
        /// pid → name, for watched names only.
        var running: [pid_t: String] = [:]
    }
    private let watched = Lock(Watched())
    private let socket: Int32
    private var thread: PollThread?
    private let sink: FactSink

    init(sink: @escaping FactSink) throws(ConditionWatchError) {
        self.sink = sink
        let fd = vigil_proc_connector_open()
        guard fd >= 0 else { throw ConditionWatchError("proc connector (needs CAP_NET_ADMIN)", errno) }
        socket = fd
        thread = try PollThread(name: "vigil-process", prepare: { .success([fd]) }) { [weak self] fd in
            guard let self else { drain(fd); return }
            var changed = false
            drain(fd) { message in
                var pid: pid_t = 0
                let what = vigil_proc_event(message.baseAddress, message.count, &pid)
                if what != 0 && self.saw(pid: pid, exec: what == 1) { changed = true }
            }
            if changed { self.sink(.processes(self.watched.withLock { Set($0.running.values) })) }
        }
    }

    /// Watches `name` too (scans /proc once); returns the watched names that run.
    func add(_ name: String) -> Set<String> {
        let found = Self.scan(for: name)
        return watched.withLock { watched in
            watched.names.insert(name)
            for pid in found { watched.running[pid] = name }
            return Set(watched.running.values)
        }
    }

    private func saw(pid: pid_t, exec: Bool) -> Bool {
        if !exec { return watched.withLock { $0.running.removeValue(forKey: pid) != nil } }
        let name = Self.comm(pid)
        return watched.withLock { watched in
            let before = watched.running[pid]
            if let name, watched.names.contains(name) { watched.running[pid] = name } else { watched.running[pid] = nil }
            return before != watched.running[pid]
        }
    }

    static func comm(_ pid: pid_t) -> String? {
        guard let handle = FileHandle(forReadingAtPath: "/proc/\(pid)/comm") else { return nil }
        defer { try? handle.close() }
        guard let data = try? handle.read(upToCount: 64) else { return nil }
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .newlines)
    }

    private static func scan(for name: String) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { pid_t($0) }.filter { comm($0) == name }
    }

    /// How many times its descriptors woke it (``PollThread/wakeups``).
    var wakeups: Int { thread?.wakeups ?? 0 }

    func stop() {
        thread?.stop()
        close(socket)
    }
}

// MARK: metered

/// `network = "unmetered"`: NetworkManager's `Metered` property
/// (NM_METERED_YES = 1 and GUESS_YES = 3 are metered), read from the system
/// bus and again on each of NetworkManager's PropertiesChanged signals.
/// Without a system bus or without NetworkManager the answer is unknown
/// (nil): `unmetered` then means online.
enum NetworkManagerMetered {
    static let name = "org.freedesktop.NetworkManager"
    static let path = "/org/freedesktop/NetworkManager"

    /// Follows `Metered` until cancelled, reporting each change to `sink`.
    static func follow(bus: DBusConnection.Bus, sink: @escaping FactSink, log: Logger) async {
        let connection: DBusConnection
        do {
            connection = try await DBusConnection.connect(to: bus, helloTimeout: .seconds(3), attempts: 1)
        } catch {
            log.info("no system bus (\(error)): network = \"unmetered\" means online")
            return
        }
        // Unstructured task: not cancelled: one close, which ends by itself (a defer cannot await).
        defer { Task { await connection.close() } }
        do {
            let changes = try await connection.signals(matching: DBusMatchRule(
                sender: name, path: path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"))
            var last = await read(connection)
            if last == nil { log.info("NetworkManager does not answer on the system bus: network = \"unmetered\" means online") }
            sink(.metered(last))
            for await _ in changes {
                let now = await read(connection)
                if now != last { sink(.metered(now)) }
                last = now
            }
        } catch {
            log.warning("cannot follow NetworkManager's Metered property: \(error)")
        }
    }

    /// Metered (true), not metered (false), or unknown (nil).
    static func read(_ connection: DBusConnection) async -> Bool? {
        guard let reply = try? await connection.call(
            destination: name, path: path, interface: "org.freedesktop.DBus.Properties", member: "Get",
            arguments: [.string(name), .string("Metered")], timeout: .seconds(5)),
            let value = try? reply.argument(0, as: DBusVariant.self).decode(UInt32.self) else { return nil }
        switch value {
        case 1, 3: return true
        case 2, 4: return false
        default: return nil
        }
    }
}
