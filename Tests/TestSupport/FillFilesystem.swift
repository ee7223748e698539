import Foundation
import Glibc

/// Writes zeros to `path` until its filesystem is full (a small tmpfs the
/// test made): the bytes written. Remove the file to free the space again.
/// `append`: add to the file instead of starting it anew (to take space
/// the filesystem got back since, e.g. from a truncated WAL).
public func fillFilesystem(_ path: String, append: Bool = false) throws -> Int {
    let fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(fd) }
    let chunk = [UInt8](repeating: 0, count: 4096)
    var total = 0
    while true {
        let n = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n > 0 { total += n; continue }
        if n < 0, errno == EINTR { continue }
        return total
    }
}
