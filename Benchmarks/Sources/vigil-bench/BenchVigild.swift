import Foundation
import VigilDBus
import VigilHost
import VigilKit

/// The directory holding the vigild, vigilctl and plugins a benchmark
/// measures: `$VIGIL_BENCH_HOST` when set (Scripts/bench sets it), else the
/// directory of vigil-bench when a vigild is there, else the root package's
/// build of the same configuration (`<root>/.build/release` for a release
/// vigil-bench built in `<root>/Benchmarks/.build/release`).
func hostBuildDirectory() throws -> URL {
    let here = PluginLoader.executableDirectory().map { URL(fileURLWithPath: $0) }
    var candidates: [URL] = []
    if let chosen = ProcessInfo.processInfo.environment["VIGIL_BENCH_HOST"], !chosen.isEmpty {
        candidates = [URL(fileURLWithPath: chosen)]
    } else if let here {
        // <root>/Benchmarks/Sources/vigil-bench/BenchVigild.swift
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        candidates = [here, root.appendingPathComponent(".build").appendingPathComponent(here.lastPathComponent)]
    }
    for directory in candidates where FileManager.default.isExecutableFile(atPath: directory.appendingPathComponent("vigild").path) {
        return directory
    }
    throw BenchError("no vigild in \(candidates.map(\.path).joined(separator: " or ")); run through Scripts/bench, which builds the host with the same configuration, or set VIGIL_BENCH_HOST to the directory of a build's vigild")
}

/// Writes `config` to `<dir>/<name>.toml` and returns a vigild process for
/// it (the vigild in `bin`, `hostBuildDirectory()`), not yet started, so
/// each benchmark sets its own pipes and environment.
func vigildProcess(_ bin: URL, dir: URL, name: String, config: String, logLevel: String) throws -> Process {
    let path = dir.appendingPathComponent("\(name).toml").path
    try config.write(toFile: path, atomically: true, encoding: .utf8)
    let process = Process()
    process.executableURL = bin.appendingPathComponent("vigild")
    process.arguments = ["--config", path, "--log-level", logLevel]
    return process
}

/// The vigild of `hostBuildDirectory()` (or the one in `bin`), serving
/// `org.vigil.Vigil1` on the bus at `address` as its own process (as a real
/// host runs: the clients the benchmark runs in this process do not share
/// its threads), with `[host]` settings `hostSettings` added (power backend
/// none). Returns once the name is owned; the caller terminates it.
func startBenchVigild(busAddress address: String, dir: URL, hostSettings: String = "", bin: URL? = nil) async throws -> Process {
    let bin = try bin ?? hostBuildDirectory()
    guard FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("vigild").path) else {
        throw DBusError.failed("no vigild in \(bin.path)")
    }
    let vigild = try vigildProcess(bin, dir: dir, name: "vigil", config: """
        [host]
        state_dir = "\(dir.path)/state"
        bus = "\(address)"
        power = "none"
        \(hostSettings)
        """, logLevel: "warning")
    try vigild.run()
    let client = try await DBusConnection.connect(to: .address(address))
    var up = false
    for _ in 0..<3000 where vigild.isRunning {
        up = (try? await client.nameHasOwner(VigilAPI.busName)) ?? false
        if up { break }
        try? await Task.sleep(for: .milliseconds(10))
    }
    await client.close()
    if up { return vigild }
    vigild.terminate()
    vigild.waitUntilExit()
    throw DBusError.failed("vigild (\(bin.path)/vigild) did not take \(VigilAPI.busName) on the benchmark bus")
}
