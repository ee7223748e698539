import Foundation
import Glibc
import VigilTestSupport

/// `vigil-bench download [SIZE_MIB]`: the download-session strategy in a
/// real vigild (the one of `hostBuildDirectory()`) against nginx on loopback.
///
/// 1. Throughput: a SIZE_MIB (default 1024) file, timed from vigild's
///    "try 1: GET" log line to its "completed" line (so vigild's start-up is
///    not counted), against `curl -s -o` of the same file in the same run
///    (best of three each). Target: at least 0.9x curl.
/// 2. Resume after `kill -9`: the same file from nginx's rate-limited
///    location (64 MiB/s), vigild killed half-way and restarted. Bytes
///    downloaded again = bytes nginx sent in total - the file size (what was
///    in flight when the process died: socket buffers plus anything not yet
///    written). Target: at most one write chunk (512 KiB, libcurl's buffer,
///    each filled buffer is written to the part file at once).
func downloadBench(_ arguments: [String]) async throws {
    let sizeMiB = arguments.first.flatMap(Int.init) ?? 1024
    let size = sizeMiB << 20
    let bin = try hostBuildDirectory()
    let nginx = try TestNginx(slowRate: "64m")
    defer { nginx.stop() }
    let work = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-download-bench-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: work + "/downloads", withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: work) }
    try nginx.makeFile("big.bin", size: size, seed: 3)
    print("download bench: \(sizeMiB) MiB over loopback from nginx \(nginx.baseURL)")

    func config(_ url: String) throws -> String {
        let path = work + "/vigil.toml"
        try """
            [host]
            state_dir = "\(work)/state"
            survival_interval = "60s"
            log_level = "info"

            [[strategy]]
            name = "bench"
            kind = "download-session"
            dir = "\(work)/downloads"
            downloads = [{ url = "\(url)", dest = "big.bin" }]
            """.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func reset() {
        try? FileManager.default.removeItem(atPath: work + "/downloads/big.bin")
        try? FileManager.default.removeItem(atPath: work + "/downloads/big.bin.part")
        try? FileManager.default.removeItem(atPath: work + "/state")
    }

    // Throughput: vigild.
    var vigilSeconds: [Double] = []
    for _ in 0..<3 {
        reset()
        let daemon = try BenchDaemon(bin.appendingPathComponent("vigild").path, ["--config", try config("\(nginx.baseURL)/big.bin")])
        let started = try daemon.waitForLine(containing: "try 1: GET")
        let done = try daemon.waitForLine(containing: "download 1 completed")
        vigilSeconds.append(done.at - started.at)
        daemon.stop()
    }
    // Reference: curl -o.
    var curlSeconds: [Double] = []
    for _ in 0..<3 {
        let out = work + "/curl.bin"
        let t0 = Date()
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["-s", "-o", out, "\(nginx.baseURL)/big.bin"]
        try curl.run()
        curl.waitUntilExit()
        curlSeconds.append(Date().timeIntervalSince(t0))
        try? FileManager.default.removeItem(atPath: out)
    }
    let v = vigilSeconds.min() ?? 0, c = curlSeconds.min() ?? 0
    let mb = Double(size) / 1_048_576
    print(String(format: "  vigild download-session: %.2f s  (%.0f MiB/s; runs %@)", v, mb / v, vigilSeconds.map { String(format: "%.2f", $0) }.joined(separator: ", ")))
    print(String(format: "  curl -o (reference):     %.2f s  (%.0f MiB/s; runs %@)", c, mb / c, curlSeconds.map { String(format: "%.2f", $0) }.joined(separator: ", ")))
    print(String(format: "  throughput ratio vigild/curl: %.2fx (target >= 0.9x)", c / v))

    // Resume after kill -9.
    reset()
    let before = nginx.requests().count
    let first = try BenchDaemon(bin.appendingPathComponent("vigild").path, ["--config", try config("\(nginx.baseURL)/slow/big.bin")])
    let part = work + "/downloads/big.bin.part"
    while fileSize(part) < size / 2 { usleep(5_000) }
    first.kill9()
    let kept = fileSize(part)
    let second = try BenchDaemon(bin.appendingPathComponent("vigild").path, ["--config", try config("\(nginx.baseURL)/slow/big.bin")])
    _ = try second.waitForLine(containing: "download 1 completed")
    second.stop()
    let lines = nginx.requests().dropFirst(before)
    let sent = lines.compactMap { line -> Int? in
        let fields = line.split(separator: " ")
        return fields.count > 1 ? Int(fields[1]) : nil
    }.reduce(0, +)
    let again = sent - size
    print("  kill -9 at \(kept) bytes in the part file; nginx log of the two runs:")
    for line in lines { print("    \(line)") }
    print("  bytes downloaded again after the resume: \(again) (\(String(format: "%.1f", Double(again) / 1024)) KiB; target <= one write chunk = 512 KiB)")
}

private func fileSize(_ path: String) -> Int {
    var st = stat()
    return stat(path, &st) == 0 ? Int(st.st_size) : 0
}

/// vigild as a child whose stderr lines are read (with arrival times) on
/// the calling thread.
private final class BenchDaemon {
    let process = Process()
    private let reader: FileHandle
    private var buffer = Data()

    init(_ path: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = FileHandle.nullDevice
        reader = pipe.fileHandleForReading
        try process.run()
    }

    /// Blocks until a stderr line containing `text`; returns it with the
    /// monotonic time it was read.
    func waitForLine(containing text: String) throws -> (line: String, at: Double) {
        while true {
            while let nl = buffer.firstIndex(of: 0x0A) {
                let line = String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self)
                buffer.removeSubrange(buffer.startIndex...nl)
                if line.contains(text) {
                    var ts = timespec()
                    clock_gettime(CLOCK_MONOTONIC, &ts)
                    return (line, Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9)
                }
            }
            let chunk = reader.availableData
            if chunk.isEmpty { throw NSError(domain: "download-bench", code: 1, userInfo: [NSLocalizedDescriptionKey: "vigild exited before printing \"\(text)\""]) }
            buffer.append(chunk)
        }
    }

    func stop() {
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }

    func kill9() {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}
