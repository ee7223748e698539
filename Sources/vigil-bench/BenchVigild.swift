import Foundation
import VigilDBus
import VigilHost
import VigilKit

/// Writes `config` to `<dir>/<name>.toml` and returns a vigild process for
/// it (the built vigild next to this binary, in `bin`), not yet started, so
/// each benchmark sets its own pipes and environment.
func vigildProcess(_ bin: URL, dir: URL, name: String, config: String, logLevel: String) throws -> Process {
    let path = dir.appendingPathComponent("\(name).toml").path
    try config.write(toFile: path, atomically: true, encoding: .utf8)
    let process = Process()
    process.executableURL = bin.appendingPathComponent("vigild")
    process.arguments = ["--config", path, "--log-level", logLevel]
    return process
}

/// The release vigild next to this binary (or the one in `bin`), serving
/// `org.vigil.Vigil1` on the bus at `address` as its own process (as a real
/// host runs: the clients the benchmark runs in this process do not share
/// its threads), with `[host]` settings `hostSettings` added (power backend
/// none). Returns once the name is owned; the caller terminates it.
func startBenchVigild(busAddress address: String, dir: URL, hostSettings: String = "", bin: URL? = nil) async throws -> Process {
    let bin = bin ?? URL(fileURLWithPath: PluginLoader.executableDirectory() ?? ".")
    guard FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("vigild").path) else {
        throw DBusError.failed("no vigild next to vigil-bench in \(bin.path); build it with the same configuration, e.g. swift build -c release --product vigild")
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
