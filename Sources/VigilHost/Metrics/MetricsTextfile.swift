import CTimer
import Foundation

/// Writes the exposition for node_exporter's textfile collector: to a
/// temporary file beside the target (a name node_exporter ignores, not
/// ending in `.prom`), then renamed over the target, so a scrape never reads
/// half a file. The format has no timestamps, as the collector requires.
/// No fsync: readers need the rename to be atomic, not durable; after a
/// power cut the file may hold an older exposition until the next heartbeat,
/// and an idle host is spared a blocking flush per heartbeat.
public enum MetricsTextfile {
    public static func write(_ bytes: [UInt8], to path: String) throws(MetricsTextfileError) {
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw MetricsTextfileError(path, "cannot create \(temporary)", errno) }
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { b -> Int in
                guard let base = b.baseAddress else { return 0 }
                return Glibc.write(fd, base + written, b.count - written)
            }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                let code = errno
                close(fd)
                unlink(temporary)
                throw MetricsTextfileError(path, "cannot write \(temporary)", code)
            }
            written += n
        }
        // Mode 0644 whatever the umask: node_exporter often runs as another user.
        fchmod(fd, 0o644)
        close(fd)
        guard rename(temporary, path) == 0 else {
            let code = errno
            unlink(temporary)
            throw MetricsTextfileError(path, "cannot rename \(temporary) to \(path)", code)
        }
    }
}

/// The textfile could not be written; the host goes on and tries again at
/// the next heartbeat.
public struct MetricsTextfileError: Error, Sendable, CustomStringConvertible {
    public var description: String

    init(_ path: String, _ what: String, _ code: Int32) {
        description = "[metrics] textfile = \"\(path)\": \(what): \(String(cString: strerror(code)))"
    }
}
