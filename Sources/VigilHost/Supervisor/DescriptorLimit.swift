import Foundation
import Synchronization

/// vigild's open-file limit (`RLIMIT_NOFILE`, systemd's `LimitNOFILE=`).
///
/// Each client lease costs vigild a file descriptor or two (the read end of
/// its lease pipe, and a logind inhibitor's fd), so a host with raised lease
/// limits needs more than the soft limit of 1024 that systemd gives services
/// by default. vigild raises its soft limit to the hard one at start, as
/// systemd advises programs that need many descriptors to do (the units
/// set the hard limit), and names the limit when it runs out anyway.
public enum DescriptorLimit {
    /// The soft and hard limits now.
    public static func current() -> (soft: UInt64, hard: UInt64) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (0, 0) }
        return (UInt64(limit.rlim_cur), UInt64(limit.rlim_max))
    }

    /// Raises the soft limit to the hard limit. Returns the soft limit
    /// before and after (equal when it was already at the hard limit or
    /// the kernel refused).
    @discardableResult
    public static func raiseSoftLimit() -> (before: UInt64, after: UInt64) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (0, 0) }
        let before = UInt64(limit.rlim_cur)
        guard limit.rlim_cur < limit.rlim_max else { return (before, before) }
        limit.rlim_cur = limit.rlim_max
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (before, before) }
        return (before, UInt64(limit.rlim_cur))
    }

    /// Whether `code` (an errno) says that descriptors ran out: this
    /// process's (EMFILE) or the system's (ENFILE).
    public static func isExhaustion(_ code: Int32) -> Bool { code == EMFILE || code == ENFILE }

    /// What to tell a caller and the log when descriptors ran out.
    public static func explain(_ code: Int32) -> String {
        if code == ENFILE {
            return "the system has no file descriptors left (ENFILE: fs.file-max is reached)"
        }
        let soft = current().soft
        return "vigild has no file descriptors left: it may have \(soft) open (RLIMIT_NOFILE); raise LimitNOFILE= in vigild.service (`systemctl edit vigild`), or lower the lease limits in [host]"
    }

    private static let reported = Atomic<Bool>(false)

    /// True the first time it is called in this process: exhaustion is
    /// logged once, not once per refused call.
    public static func firstExhaustion() -> Bool {
        !reported.exchange(true, ordering: .relaxed)
    }
}

/// A call failed because file descriptors ran out; the message names the limit.
public struct DescriptorsExhausted: Error, Sendable, CustomStringConvertible {
    public var description: String

    public init(doing: String, code: Int32) {
        description = "\(doing): \(DescriptorLimit.explain(code))"
    }
}
