import Foundation
import Glibc
import VigilKitTesting

/// Tests/Fixtures/logind-standin.py (a python3-dbus stand-in for
/// org.freedesktop.login1.Manager) running on a bus, stopped by `stop()`.
public final class LogindStandInProcess: @unchecked Sendable {
    // Invariant: `process` is set in init and only used to stop it.
    private let process: Process

    /// The fixture's path, found from this source file's location.
    public static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/logind-standin.py").path

    /// Starts the stand-in on the bus at `address` and returns once it owns
    /// org.freedesktop.login1 (it prints "ready").
    public init(busAddress address: String) throws {
        process = ProcessRunner.process("/usr/bin/python3")
        process.arguments = [Self.script, address]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let line = out.fileHandleForReading.availableData
        guard String(decoding: line, as: UTF8.self).hasPrefix("ready") else {
            stop()
            throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "the logind stand-in did not start"])
        }
    }

    /// SIGKILL: a child spawned from a dispatch thread may block SIGTERM.
    public func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}
