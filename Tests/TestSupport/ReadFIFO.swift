import Dispatch
import Foundation
import Glibc

/// Reads a FIFO to its end on a thread outside the cooperative pool (opening
/// a FIFO blocks until the writer opens it; Foundation's `contentsOfFile`
/// trusts `st_size`, which is 0 for a FIFO).
public func readAll(fromFIFO path: String) async -> String {
    await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            var bytes: [UInt8] = []
            let fd = open(path, O_RDONLY)
            if fd >= 0 {
                var chunk = [UInt8](repeating: 0, count: 65536)
                while true {
                    let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    if count < 0 && errno == EINTR { continue }
                    if count <= 0 { break }
                    bytes += chunk[0..<count]
                }
                close(fd)
            }
            continuation.resume(returning: String(decoding: bytes, as: UTF8.self))
        }
    }
}
