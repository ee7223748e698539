import Foundation
import VigilKit

/// Holds the system awake with kernel wake locks (`/sys/power/wake_lock`,
/// Documentation/ABI/testing/sysfs-power): writing `"<name> <timeout_ns>"`
/// takes or re-arms a lock, writing `<name>` to `wake_unlock` drops it.
///
/// The timeout is the point: if vigild dies, the kernel drops the lock by
/// itself. A lease's lock times out `margin` after its budget; a lease without
/// a budget gets `unbudgetedTimeout` (a lock that could outlive a dead host
/// forever is never taken).
public struct WakelockPowerBackend: PowerBackend {
    /// The sysfs directory holding `wake_lock` and `wake_unlock` (tests use a temp dir).
    public let directory: String
    public let margin: Duration
    public let unbudgetedTimeout: Duration
    public let reason: String
    public var name: String { "wakelock" }
    private let names = NameSource()

    public init(directory: String = "/sys/power", margin: Duration = .seconds(30), unbudgetedTimeout: Duration = .seconds(600), reason: String = "configured") {
        self.directory = directory
        self.margin = margin
        self.unbudgetedTimeout = unbudgetedTimeout
        self.reason = reason
    }

    /// Whether `wake_lock` exists and is writable here.
    public static func isUsable(directory: String = "/sys/power") -> Bool {
        access((directory as NSString).appendingPathComponent("wake_lock"), W_OK) == 0
    }

    public func hold(_ hold: PowerHold, who: String, why: String, budget: Duration?) async throws -> any PowerToken {
        let lock = names.next()
        let token = WakelockToken(backend: self, lockName: lock, budget: budget)
        try write(lockCommand(lock, budget: budget), to: "wake_lock")
        return token
    }

    func lockCommand(_ lock: String, budget: Duration?) -> String {
        let timeout = budget.map { $0 + margin } ?? unbudgetedTimeout
        return "\(lock) \(max(timeout.nanoseconds, 1))\n"
    }

    /// One `write(2)` per command, as sysfs expects.
    func write(_ text: String, to file: String) throws {
        let path = (directory as NSString).appendingPathComponent(file)
        let fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC)
        guard fd >= 0 else {
            throw PowerBackendError("cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        let written = text.withCString { Glibc.write(fd, $0, strlen($0)) }
        guard written == text.utf8.count else {
            throw PowerBackendError("cannot write \(text.trimmingCharacters(in: .whitespacesAndNewlines)) to \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// Unique lock names for this process: `vigil-<pid>-<n>`.
    final class NameSource: Sendable {
        private let counter = Lock(0)
        func next() -> String {
            counter.withLock { counter in
                counter += 1
                return "vigil-\(getpid())-\(counter)"
            }
        }
    }
}

struct WakelockToken: PowerToken {
    let backend: WakelockPowerBackend
    let lockName: String
    let budget: Duration?

    var description: String { "wake lock \(lockName)" }

    /// Re-arming an existing lock replaces its timeout in place: no gap.
    func renew(budget: Duration?) async throws {
        try backend.write(backend.lockCommand(lockName, budget: budget), to: "wake_lock")
    }

    func release() async {
        try? backend.write("\(lockName)\n", to: "wake_unlock")
    }
}

/// Why a power backend could not take or renew a hold.
public struct PowerBackendError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
