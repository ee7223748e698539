import Foundation
import Glibc
import VigilKit

/// Talks to systemd's notification socket (`sd_notify(3)`) without
/// libsystemd: one unix datagram per message to `$NOTIFY_SOCKET` (a path, or
/// an abstract socket written `@name`).
///
/// vigild sends `READY=1` once it owns its bus name, `STATUS=...` as its
/// state changes, `STOPPING=1` when it shuts down, and `WATCHDOG=1` every
/// half `WATCHDOG_USEC` through the wake scheduler (never a sleep loop).
/// Without `NOTIFY_SOCKET` there is no notifier and nothing is sent.
public final class SystemdNotifier: Sendable {
    // Invariant: `fd` and `address` never change after init; sendto on one
    // datagram socket from several threads is safe.
    private let fd: Int32
    private let address: sockaddr_un
    private let addressLength: socklen_t
    /// The socket as given in `NOTIFY_SOCKET`.
    public let socketName: String
    /// How often to send `WATCHDOG=1` (half of `WATCHDOG_USEC`), or nil
    /// when the service manager asked for no watchdog, or asked another pid
    /// (`WATCHDOG_PID`).
    public let watchdogInterval: Duration?

    /// Why a notifier could not be created although `NOTIFY_SOCKET` is set.
    public struct SetupError: Error, CustomStringConvertible {
        public var description: String
    }

    /// A notifier for `$NOTIFY_SOCKET`, or nil when it is unset or empty.
    public init?(environment: [String: String] = ProcessInfo.processInfo.environment, pid: pid_t = getpid()) throws {
        guard let name = environment["NOTIFY_SOCKET"], !name.isEmpty else { return nil }
        var bytes = Array(name.utf8)
        if bytes.first == UInt8(ascii: "@") {
            bytes[0] = 0
        } else if bytes.first != UInt8(ascii: "/") {
            throw SetupError(description: "NOTIFY_SOCKET=\(name): expected an absolute path or @abstract name")
        }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            throw SetupError(description: "NOTIFY_SOCKET=\(name): path too long for a unix socket")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in bytes.enumerated() { raw[i] = byte }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            throw SetupError(description: "cannot create a socket for NOTIFY_SOCKET: \(String(cString: strerror(errno)))")
        }
        self.fd = fd
        self.address = address
        // Abstract names are not NUL-terminated; paths count their NUL.
        self.addressLength = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (bytes[0] == 0 ? 0 : 1))
        self.socketName = name
        self.watchdogInterval = Self.watchdogInterval(environment: environment, pid: pid)
    }

    deinit { close(fd) }

    /// Half of `WATCHDOG_USEC` when it is set, positive, and `WATCHDOG_PID`
    /// is unset or names `pid`.
    static func watchdogInterval(environment: [String: String], pid: pid_t) -> Duration? {
        guard let text = environment["WATCHDOG_USEC"], let usec = UInt64(text), usec > 0 else { return nil }
        if let owner = environment["WATCHDOG_PID"], !owner.isEmpty, pid_t(owner) != pid { return nil }
        return .microseconds(Int64(clamping: usec / 2))
    }

    /// Sends one notification: newline-separated `KEY=value` assignments.
    /// Returns false (with errno's text logged by the caller if it cares)
    /// when the datagram could not be sent.
    @discardableResult
    public func send(_ assignments: [String]) -> Bool {
        let message = Array(assignments.joined(separator: "\n").utf8)
        var address = self.address
        let sent = message.withUnsafeBytes { body in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, body.baseAddress, body.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT), $0, addressLength)
                }
            }
        }
        return sent == message.count
    }

    /// `READY=1` with a status line.
    @discardableResult
    public func ready(status: String) -> Bool { send(["READY=1", "STATUS=" + Self.oneLine(status)]) }

    /// A `STATUS=` update.
    @discardableResult
    public func status(_ text: String) -> Bool { send(["STATUS=" + Self.oneLine(text)]) }

    /// `STOPPING=1` with a status line.
    @discardableResult
    public func stopping(status: String = "stopping") -> Bool { send(["STOPPING=1", "STATUS=" + Self.oneLine(status)]) }

    /// Starts sending `WATCHDOG=1` every ``watchdogInterval`` as wake
    /// requests on `scheduler` (windows of the last quarter of each
    /// interval, so they coalesce with other wakes), on a grid from now.
    /// Returns nil when no watchdog was asked for; cancel the task to stop.
    public func startWatchdog(scheduler: any WakeScheduling, clock: any VigilClock, log: Logger) -> Task<Void, Never>? {
        guard let interval = watchdogInterval else { return nil }
        let tolerance = interval / 4
        // Unstructured task: returned; the caller cancels it (vigild's watchdog service, at
        // shutdown).
        return Task {
            let start = clock.now
            var k: Int64 = 1
            var failures = 0
            while !Task.isCancelled {
                let target = start + interval * Int(k)
                do {
                    _ = try await scheduler.wake(WakeRequest(earliest: target - tolerance, latest: target, label: "systemd watchdog"))
                } catch { return }
                if Task.isCancelled { return }
                if send(["WATCHDOG=1"]) {
                    failures = 0
                } else if failures == 0 {
                    failures += 1
                    log.warning("cannot send WATCHDOG=1 to \(socketName): \(String(cString: strerror(errno)))")
                }
                // After a stall or suspend, continue with the next future slot.
                let elapsed = clock.now - start
                k = max(k + 1, Int64(elapsed / interval) + 1)
            }
        }
    }

    /// Status text on one line (a newline would start a new assignment).
    private static func oneLine(_ text: String) -> String {
        text.replacingOccurrences(of: "\n", with: " ")
    }
}
