import Glibc
import VigilAPI

extension BusFileDescriptor {
    /// Duplicates `fd` (with close-on-exec) and owns the copy; the caller
    /// keeps `fd`.
    public convenience init(duplicating fd: Int32) throws(DBusError) {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else {
            throw DBusError.failed("cannot duplicate file descriptor \(fd): errno \(errno)")
        }
        self.init(owning: copy)
    }
}
