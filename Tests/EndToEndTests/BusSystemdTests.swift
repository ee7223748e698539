import Foundation
import Glibc
import Testing
@testable import VigilHost

/// vigild under a service manager (sd_notify over a real datagram socket)
/// and idle on a bus.
extension EndToEnd {
    @Suite struct BusSystemdTests {
        @Test func notifiesReadyWatchdogAndStopping() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-notify")
            let socketPath = dir.file("notify")
            let socket = try NotifySocket(path: socketPath)
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["NOTIFY_SOCKET": socketPath, "WATCHDOG_USEC": "1000000"])

            let ready = try #require(await socket.receive(), "no READY=1; vigild said:\n\(daemon.output.joined(separator: "\n"))")
            #expect(ready.text.split(separator: "\n").contains("READY=1"), "\(ready.text)")
            #expect(ready.text.contains("STATUS=0 strategies, 0 active leases"), "\(ready.text)")
            // READY is sent once the name is owned; the log line saying so may
            // reach us after the datagram (stderr is read asynchronously).
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")

            var watchdogs: [ContinuousClock.Instant] = []
            while watchdogs.count < 3 {
                let message = try #require(await socket.receive(), "missing WATCHDOG=1 after \(watchdogs.count)")
                #expect(message.text == "WATCHDOG=1")
                watchdogs.append(message.at)
            }
            // Every WATCHDOG_USEC / 2 = 0.5 s, within the 1/4 window the
            // scheduler may move it earlier (and some VM jitter).
            for (earlier, later) in zip(watchdogs, watchdogs.dropFirst()) {
                let gap = later - earlier
                #expect(gap > .milliseconds(250) && gap < .milliseconds(800), "gap \(gap)")
            }

            daemon.signal(SIGTERM)
            var stopping: NotifySocket.Message?
            while stopping == nil, let message = await socket.receive() {
                if message.text.hasPrefix("STOPPING=1") { stopping = message } else { #expect(message.text == "WATCHDOG=1") }
            }
            #expect(stopping != nil)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func abstractNotifySocketAndNoWatchdogForAnotherPid() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-notify")
            let name = "vigil-test-\(UUID().uuidString)"
            let socket = try NotifySocket(abstract: name)
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
            // WATCHDOG_PID names another process: vigild must not ping.
            let daemon = try Daemon(arguments: ["--config", config], environment: ["NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"])
            let ready = try #require(await socket.receive())
            #expect(ready.text.hasPrefix("READY=1"))
            // 0.2 s watchdog would have sent several pings by now.
            let next = await socket.receive(timeout: .milliseconds(600))
            #expect(next == nil, "unexpected \(next?.text ?? "")")
            daemon.signal(SIGTERM)
            #expect(await socket.receive()?.text.hasPrefix("STOPPING=1") == true)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func watchdogIntervalRules() {
            #expect(SystemdNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "1000000"], pid: 5) == .milliseconds(500))
            #expect(SystemdNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "5"], pid: 5) == .milliseconds(500))
            #expect(SystemdNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "6"], pid: 5) == nil)
            #expect(SystemdNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "0"], pid: 5) == nil)
            #expect(SystemdNotifier.watchdogInterval(environment: [:], pid: 5) == nil)
            #expect(throws: SystemdNotifier.SetupError.self) { try SystemdNotifier(environment: ["NOTIFY_SOCKET": "relative"]) }
            #expect((try? SystemdNotifier(environment: [:])) == nil)
        }

        /// An idle host on a bus makes no wakeups beyond what its (60 s)
        /// heartbeat needs: the D-Bus connection waits on its socket.
        @Test func idleHostOnABusStaysAsleep() async throws {
            let bus = try BusTestDaemon()
            defer { bus.stop() }
            let dir = try TempDir("vigil-idle")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            // Warm-up: start-up work ends and idle dispatch threads retire
            // (libdispatch lets a spare thread go after about 5 s).
            try await Task.sleep(for: .seconds(6))
            let before = try threadSwitches(daemon.pid)
            // The measured window: 60 s, one heartbeat.
            try await Task.sleep(for: .seconds(60))
            let after = try threadSwitches(daemon.pid)
            // Threads present at both ends: their new switches; threads that
            // appeared: all of theirs; threads that went away: one each (the
            // wakeup that let them exit).
            var total = 0
            var detail: [String] = []
            for (tid, entry) in after {
                let delta = entry.switches - (before[tid]?.switches ?? 0)
                total += delta
                if delta > 0 { detail.append("\(entry.name)[\(tid)] +\(delta)") }
            }
            for (tid, entry) in before where after[tid] == nil {
                total += 1
                detail.append("\(entry.name)[\(tid)] exited")
            }
            // One heartbeat (timer wake, SQLite write and fsync, actor hops)
            // costs about ten switches; `vigil-bench idle-cost` measured 20 for
            // two. Anything polling would add 60 or more.
            #expect(total <= 25, "voluntary context switches in 60 s: \(total): \(detail.joined(separator: ", "))")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}

/// voluntary_ctxt_switches of every thread of `pid`, by thread id.
func threadSwitches(_ pid: pid_t) throws -> [Int: (name: String, switches: Int)] {
    var result: [Int: (name: String, switches: Int)] = [:]
    for task in try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") {
        guard let tid = Int(task), let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8) else { continue }
        var name = "?"
        var switches = 0
        for line in status.split(separator: "\n") {
            if line.hasPrefix("Name:") { name = line.dropFirst(5).trimmingCharacters(in: .whitespaces) }
            if line.hasPrefix("voluntary_ctxt_switches:") { switches = Int(line.dropFirst(24).trimmingCharacters(in: .whitespaces)) ?? 0 }
        }
        result[tid] = (name, switches)
    }
    return result
}

/// A unix datagram socket standing in for systemd's notification socket.
final class NotifySocket: @unchecked Sendable {
    // Invariant: `fd` never changes after init; receive() calls are made
    // one at a time by the test.
    private let fd: Int32
    private let path: String?

    struct Message {
        var text: String
        var at: ContinuousClock.Instant
    }

    convenience init(path: String) throws {
        try self.init(bytes: Array(path.utf8) + [0], path: path)
    }

    convenience init(abstract name: String) throws {
        try self.init(bytes: [0] + Array(name.utf8), path: nil)
    }

    private init(bytes: [UInt8], path: String?) throws {
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        self.path = path
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in bytes.enumerated() { raw[i] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else {
            close(fd)
            throw DaemonError("cannot bind the notify socket: \(String(cString: strerror(errno)))")
        }
    }

    /// The next datagram, or nil after `timeout` (a bound for a broken run).
    func receive(timeout: Duration = .seconds(10)) async -> Message? {
        let fd = self.fd
        return await withCheckedContinuation { continuation in
            Thread {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ms = Int32(timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
                guard poll(&pfd, 1, ms) == 1 else { continuation.resume(returning: nil); return }
                var buffer = [UInt8](repeating: 0, count: 4096)
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                let at = ContinuousClock.now
                guard n > 0 else { continuation.resume(returning: nil); return }
                continuation.resume(returning: Message(text: String(decoding: buffer[0..<n], as: UTF8.self), at: at))
            }.start()
        }
    }

    deinit {
        close(fd)
        if let path { unlink(path) }
    }
}
