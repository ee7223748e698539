import Glibc
import VigilKit

/// An owned unix file descriptor carried in a D-Bus message (type `h`).
///
/// A descriptor received in a message is a fresh copy that belongs to the
/// receiver: this type closes it when the last reference goes away, unless
/// `take()` transferred ownership out first. When sending, libdbus `dup()`s
/// the descriptor, so the sender keeps (and eventually closes) its own copy.
public final class DBusFileDescriptor: Sendable, CustomStringConvertible {
    private let storage: Lock<Int32>

    /// Takes ownership of `fd` (it will be closed by this object).
    public init(owning fd: Int32) {
        storage = Lock(fd)
    }

    /// Duplicates `fd` (with close-on-exec) and owns the copy; the caller
    /// keeps `fd`.
    public convenience init(duplicating fd: Int32) throws {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else {
            throw DBusError.failed("cannot duplicate file descriptor \(fd): errno \(errno)")
        }
        self.init(owning: copy)
    }

    /// The descriptor, still owned by this object (-1 after `take()` or `close()`).
    public var rawValue: Int32 { storage.withLock { $0 } }

    /// Transfers ownership to the caller, who must close the returned fd.
    public func take() -> Int32 {
        storage.withLock { fd in
            let taken = fd
            fd = -1
            return taken
        }
    }

    /// Closes the descriptor now rather than at deinit.
    public func close() {
        let fd = take()
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    public var description: String { "fd(\(rawValue))" }

    deinit {
        close()
    }
}
