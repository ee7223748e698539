import CStartupPages
import Glibc

/// Gives back the resident pages of code and read-only data that only
/// start-up needed (`[host] release_startup_pages`, on by default).
///
/// Most of an idle vigild's RSS is library code it touched once while it
/// started: Foundation, ICU data, TOMLKit, the config validation, GRDB's
/// migrations, the plugin loader. Those pages are clean page-cache pages, so
/// after start-up the host drops them from its page table (madvise
/// MADV_DONTNEED on every non-writable segment of every loaded object; see
/// Sources/CStartupPages). What idle work still uses (the heartbeat, the bus
/// loop) faults back in from the page cache, without a disk read; the rest
/// stays out of the host's RSS. Nothing writable is touched, so no state is
/// lost; the heap only gives back the free pages start-up left
/// (malloc_trim).
public enum StartupPages {
    /// What one release did.
    public struct Report: Sendable, Equatable {
        /// Resident KiB before and after, from /proc/self/statm.
        public var residentBeforeKiB: Int
        public var residentAfterKiB: Int
        /// Loaded objects whose read-only segments were advised.
        public var objects: Int
        /// madvise calls that failed (the pages stayed resident).
        public var failures: Int

        public var releasedKiB: Int { max(0, residentBeforeKiB - residentAfterKiB) }
    }

    /// Drops the resident code and read-only data pages of every loaded
    /// object. Safe at any time; meant for once start-up is complete.
    public static func release() -> Report {
        let before = residentKiB()
        let result = vigil_release_startup_pages()
        return Report(residentBeforeKiB: before, residentAfterKiB: residentKiB(),
                      objects: Int(result.objects), failures: Int(result.failures))
    }

    /// This process's resident set in KiB (the second field of
    /// /proc/self/statm, in pages), or 0 if it cannot be read.
    public static func residentKiB() -> Int {
        let fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return 0 }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return 0 }
        let fields = buffer[..<n].split(separator: UInt8(ascii: " "))
        guard fields.count > 1, let pages = Int(String(decoding: fields[1], as: UTF8.self)) else { return 0 }
        return pages * sysconf(Int32(_SC_PAGESIZE)) / 1024
    }
}
