import CTimer
import Foundation

/// A new run id: a random (version 4) UUID from the kernel's random source.
///
/// Foundation's `UUID()` gave all zeros in a root without `/dev` (no
/// `/dev/urandom`), and a store keyed by run id would then mix runs up. So
/// the bytes come from `getrandom(2)`, else `/dev/urandom`, and when neither
/// works vigild refuses to start with both reasons instead of inventing an id.
public enum RunID {
    /// Neither randomness source worked; `reasons` says why, one per source.
    public struct RandomnessUnavailable: Error, CustomStringConvertible, Sendable {
        public var reasons: [String]
        public var description: String {
            "cannot get randomness for a run id (\(reasons.joined(separator: "; "))); refusing to start with a made-up id: give the host a kernel with getrandom(2) or a readable /dev/urandom"
        }
    }

    /// A source of `count` random bytes, or a reason it has none.
    public typealias Source = @Sendable (_ count: Int) -> Result<[UInt8], RandomnessUnavailable>

    /// The sources tried in order: `getrandom(2)`, then `/dev/urandom`.
    public static let systemSources: [Source] = [kernelRandom, devURandom]

    /// A lowercase UUID string from the first source that gives 16 bytes.
    public static func generate(sources: [Source] = systemSources) throws(RandomnessUnavailable) -> String {
        var reasons: [String] = []
        for source in sources {
            switch source(16) {
            case .success(let bytes) where bytes.count == 16:
                return format(bytes)
            case .success(let bytes):
                reasons.append("a source gave \(bytes.count) bytes, expected 16")
            case .failure(let error):
                reasons += error.reasons
            }
        }
        throw RandomnessUnavailable(reasons: reasons.isEmpty ? ["no randomness source"] : reasons)
    }

    /// The UUID text of 16 bytes with the version (4) and variant bits set.
    static func format(_ raw: [UInt8]) -> String {
        var bytes = raw
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = bytes.map { String(format: "%02x", $0) }
        return [hex[0..<4], hex[4..<6], hex[6..<8], hex[8..<10], hex[10..<16]].map { $0.joined() }.joined(separator: "-")
    }

    /// `getrandom(2)`, non-blocking: fails (EAGAIN) rather than hang the
    /// start when the kernel's pool is not initialised yet.
    @Sendable static func kernelRandom(_ count: Int) -> Result<[UInt8], RandomnessUnavailable> {
        var bytes = [UInt8](repeating: 0, count: count)
        var filled = 0
        while filled < count {
            // Invariant: count > 0, so the buffer has a base address.
            let n = bytes.withUnsafeMutableBytes { buffer in
                vigil_getrandom_nonblock(buffer.baseAddress! + filled, count - filled)
            }
            if n < 0 {
                if errno == EINTR { continue }
                return .failure(RandomnessUnavailable(reasons: ["getrandom(2): \(String(cString: strerror(errno)))"]))
            }
            filled += Int(n)
        }
        return .success(bytes)
    }

    @Sendable static func devURandom(_ count: Int) -> Result<[UInt8], RandomnessUnavailable> {
        guard let handle = FileHandle(forReadingAtPath: "/dev/urandom") else {
            return .failure(RandomnessUnavailable(reasons: ["/dev/urandom: cannot open (\(String(cString: strerror(errno))))"]))
        }
        defer { try? handle.close() }
        do {
            let data = try handle.read(upToCount: count) ?? Data()
            guard data.count == count else {
                return .failure(RandomnessUnavailable(reasons: ["/dev/urandom: read \(data.count) of \(count) bytes"]))
            }
            return .success([UInt8](data))
        } catch {
            return .failure(RandomnessUnavailable(reasons: ["/dev/urandom: \(error.localizedDescription)"]))
        }
    }
}
