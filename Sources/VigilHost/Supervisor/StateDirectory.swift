import Foundation

/// Checks vigild's state_dir before anything is written there, so that each
/// problem gets one line naming the path, the cause and what to do, rather
/// than Foundation's `NSCocoaErrorDomain Code=516` or SQLite's
/// "disk I/O error".
public enum StateDirectory {
    public struct Problem: Error, CustomStringConvertible, Sendable {
        public var description: String
    }

    /// Creates `path` (and its parents) if missing, then checks that it is
    /// a directory this user owns, can write, and that its filesystem has
    /// room. Throws one ``Problem`` for the first thing wrong.
    public static func prepare(_ path: String) throws(Problem) {
        func problem(_ text: String) -> Problem { Problem(description: "state_dir \(path): \(text)") }
        var info = stat()
        if lstat(path, &info) != 0 {
            guard errno == ENOENT || errno == ENOTDIR else {
                throw problem("cannot look at it: \(String(cString: strerror(errno))); check the permissions of its parent directories")
            }
            do {
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            } catch {
                throw problem("cannot create it: \(creationCause(path)); create it yourself or set another state_dir in [host]")
            }
            guard lstat(path, &info) == 0 else {
                throw problem("cannot look at it after creating it: \(String(cString: strerror(errno)))")
            }
        }
        if info.st_mode & S_IFMT == S_IFLNK {
            // A symlink to a directory is fine; look at its target.
            guard stat(path, &info) == 0 else {
                throw problem("is a symbolic link to something missing (\(String(cString: strerror(errno)))); fix the link or set another state_dir")
            }
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw problem("is not a directory (it is \(kind(info.st_mode))); move it away or set another state_dir in [host]")
        }
        let me = geteuid()
        if me != 0, info.st_uid != me {
            throw problem("belongs to uid \(info.st_uid), not to this user (uid \(me)); use a state_dir of your own (the default is ~/.local/state/vigil)")
        }
        if access(path, W_OK | X_OK) != 0 {
            let cause = errno == EROFS ? "it is on a read-only filesystem" : "it is not writable (\(String(cString: strerror(errno))))"
            throw problem("\(cause); make it writable for uid \(me) or set another state_dir in [host]")
        }
        var fs = statvfs()
        if statvfs(path, &fs) == 0, fs.f_bavail == 0 || (fs.f_files > 0 && fs.f_favail == 0) {
            let what = fs.f_bavail == 0 ? "no free space" : "no free inodes"
            throw problem("its filesystem is full (\(what)); free some space there or set another state_dir in [host]")
        }
    }

    /// Why `path` could not be created: the first ancestor that exists and
    /// what is wrong with it.
    private static func creationCause(_ path: String) -> String {
        var ancestor = (path as NSString).deletingLastPathComponent
        var info = stat()
        while !ancestor.isEmpty, ancestor != "/", lstat(ancestor, &info) != 0 {
            ancestor = (ancestor as NSString).deletingLastPathComponent
        }
        if ancestor.isEmpty { ancestor = "." }
        guard stat(ancestor, &info) == 0 else { return "\(ancestor) cannot be read" }
        if info.st_mode & S_IFMT != S_IFDIR { return "\(ancestor) is not a directory" }
        if access(ancestor, W_OK) != 0 {
            return errno == EROFS ? "\(ancestor) is on a read-only filesystem" : "\(ancestor) is not writable for uid \(geteuid())"
        }
        var fs = statvfs()
        if statvfs(ancestor, &fs) == 0, fs.f_bavail == 0 { return "the filesystem of \(ancestor) is full" }
        return "the system refused (\(String(cString: strerror(errno))))"
    }

    private static func kind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFREG: "a regular file"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        case S_IFIFO: "a FIFO"
        case S_IFSOCK: "a socket"
        default: "not a directory"
        }
    }
}
