import Foundation

/// Keeps two hosts off one state directory (two writers would corrupt the
/// survival log's runs): an exclusive `flock` on `<state_dir>/vigild.lock`,
/// which the kernel drops when the process dies, so `kill -9` leaves no stale lock.
public struct InstanceLock: Sendable {
    public let path: String
    private let fd: Int32

    public struct Busy: Error, CustomStringConvertible {
        public var path: String
        public var holder: String
        public var description: String {
            "another vigild (\(holder)) is already running with this state directory; lock file \(path)"
        }
    }

    public static func acquire(stateDir: String) throws -> InstanceLock {
        try StateDirectory.prepare(stateDir)
        let path = (stateDir as NSString).appendingPathComponent("vigild.lock")
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: path, NSLocalizedDescriptionKey: "cannot open \(path): \(String(cString: strerror(errno)))"])
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
            close(fd)
            throw Busy(path: path, holder: holder.isEmpty ? "unknown pid" : "pid \(holder)")
        }
        ftruncate(fd, 0)
        let pid = "\(getpid())\n"
        _ = pid.withCString { write(fd, $0, strlen($0)) }
        return InstanceLock(path: path, fd: fd)
    }

    public func release() {
        close(fd)
    }
}
