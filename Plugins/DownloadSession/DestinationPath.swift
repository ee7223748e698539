import Foundation
import VigilKit

/// Keeps every file a download writes under the configured `dir`.
///
/// A destination is a relative path of plain names below `dir`: no
/// absolute paths, no `.` or `..` elements, no empty elements. Every
/// directory on the way that exists must be a real directory inside `dir`
/// (a symlink whose target lies inside `dir` is fine; one pointing outside
/// is an escape); missing ones are created. The destination itself must
/// not be a directory or a symlink. The part file is opened with
/// `O_NOFOLLOW`, and publishing is a `rename` in the same directory, which
/// replaces a name and never follows one.
enum DestinationPath {
    struct Refusal: Error, CustomStringConvertible {
        var message: String
        var description: String { message }
    }

    /// Checks `dest` (relative to `dir`) and returns the absolute path.
    /// Creates missing intermediate directories when `create` is true.
    static func resolve(_ dest: String, in dir: String, create: Bool) throws(Refusal) -> String {
        guard !dest.isEmpty else { throw Refusal(message: "the destination is empty; expected a file name below \(dir)") }
        guard !dest.hasPrefix("/") else {
            throw Refusal(message: "destination \"\(ClientText.excerpt(dest))\" is absolute; give a path relative to the download dir \(dir)")
        }
        guard !dest.utf8.contains(0) else { throw Refusal(message: "destination contains a NUL byte") }
        let elements = dest.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        for element in elements {
            if element == ".." {
                throw Refusal(message: "destination \"\(ClientText.excerpt(dest))\" escapes the download dir \(dir): \"..\" is not allowed")
            }
            if element.isEmpty || element == "." {
                throw Refusal(message: "destination \"\(ClientText.excerpt(dest))\" has an empty or \".\" path element; expected plain names separated by single slashes")
            }
        }
        guard let root = realPath(dir) else {
            throw Refusal(message: "the download dir \(dir) does not exist or cannot be resolved")
        }
        var current = root
        for element in elements.dropLast() {
            let next = current + "/" + element
            var st = stat()
            if lstat(next, &st) != 0 {
                guard errno == ENOENT, create else {
                    if errno == ENOENT { current = next; continue }
                    throw Refusal(message: "cannot inspect \(next): \(String(cString: strerror(errno)))")
                }
                guard mkdir(next, 0o755) == 0 || errno == EEXIST else {
                    throw Refusal(message: "cannot create directory \(next): \(String(cString: strerror(errno)))")
                }
                current = next
                continue
            }
            if (st.st_mode & S_IFMT) == S_IFLNK {
                guard let target = realPath(next), target == root || target.hasPrefix(root + "/") else {
                    throw Refusal(message: "destination \"\(ClientText.excerpt(dest))\" escapes the download dir \(dir): \(next) is a symlink to \(realPath(next) ?? "a missing target") outside it")
                }
                current = target
                continue
            }
            guard (st.st_mode & S_IFMT) == S_IFDIR else {
                throw Refusal(message: "destination \"\(ClientText.excerpt(dest))\": \(next) exists and is not a directory")
            }
            current = next
        }
        let path = current + "/" + (elements.last ?? "")
        var st = stat()
        if lstat(path, &st) == 0 {
            if (st.st_mode & S_IFMT) == S_IFDIR {
                throw Refusal(message: "destination \(path) is a directory; expected a file name")
            }
            if (st.st_mode & S_IFMT) == S_IFLNK {
                throw Refusal(message: "destination \(path) is a symlink; refusing to replace it")
            }
        }
        return path
    }

    /// A file name from a URL path: its last non-empty element.
    static func defaultName(urlPath: String) -> String? {
        let last = urlPath.split(separator: "/").last.map(String.init) ?? ""
        let decoded = last.removingPercentEncoding ?? last
        guard !decoded.isEmpty, decoded != ".", decoded != "..", !decoded.contains("/") else { return nil }
        return decoded
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}
