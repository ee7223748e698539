import Foundation

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
