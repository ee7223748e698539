import Foundation
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// All end-to-end suites run one after another: they start real processes
/// and measure real time, and the plugin suite builds packages on both cores.
@Suite(.serialized) enum EndToEnd {}

/// Locations of the package and of the built executables.
enum Build {
    static let packageRoot: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The directory holding vigild, vigilctl and the plugin libraries: the
    /// test bundle is built into the same directory.
    static let binDir = URL(fileURLWithPath: PluginLoader.executableDirectory() ?? ".")

    static var vigild: String { binDir.appendingPathComponent("vigild").path }
    static var vigilctl: String { binDir.appendingPathComponent("vigilctl").path }
}

/// A temporary directory, removed when the value goes away.
final class TempDir: Sendable {
    let path: String

    init(_ prefix: String = "vigil-e2e") throws {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { throw POSIXError(.EIO) }
        path = String(cString: p)
    }

    func file(_ name: String) -> String { (path as NSString).appendingPathComponent(name) }

    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        let p = file(name)
        try text.write(toFile: p, atomically: true, encoding: .utf8)
        return p
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A vigild child process whose stderr lines can be awaited as events.
final class Daemon: @unchecked Sendable {
    // Invariant: `process` is set in init and only signalled afterwards;
    // `partial` is only touched under its lock.
    enum Event: Sendable {
        case line(String)
        case exited(Int32)
        /// Its stderr reached end of file: every line it wrote is here.
        case outputEnded
    }

    /// Its stderr lines and its exit, in the order they came.
    private let events = WaitableLog<Event>()
    private let partial = Lock(Data())
    let process: Process

    /// `executable`: a wrapper argv that ends by exec'ing vigild (its
    /// arguments follow); nil runs vigild directly.
    init(arguments: [String], environment: [String: String] = [:], executable: [String]? = nil) throws {
        process = ProcessRunner.process(executable?.first ?? Build.vigild)
        process.arguments = (executable.map { Array($0.dropFirst()) } ?? []) + arguments
        var env = ProcessInfo.processInfo.environment
        // The system bus is only what a test passes explicitly.
        env["DBUS_SYSTEM_BUS_ADDRESS"] = nil
        env.merge(environment) { $1 }
        process.environment = env
        let err = Pipe()
        process.standardError = err
        process.standardOutput = FileHandle.nullDevice
        let events = self.events
        process.terminationHandler = { p in events.append(.exited(p.terminationStatus)) }
        try process.run()
        readUntilEnd(err.fileHandleForReading) { [weak self] data in self?.received(data) }
    }

    var pid: Int32 { process.processIdentifier }

    /// Everything vigild printed so far.
    var output: [String] { Self.lines(events.all) }

    private static func lines(_ events: [Event]) -> [String] {
        events.compactMap { if case .line(let line) = $0 { line } else { nil } }
    }

    private static func exitStatus(_ events: [Event]) -> Int32? {
        events.lazy.compactMap { if case .exited(let status) = $0 { status } else { nil } }.first
    }

    /// Exited, and stderr read to its end (the exit is often seen first:
    /// seen in CI, a status with none of the lines before it).
    private static func ended(_ events: [Event]) -> Bool {
        exitStatus(events) != nil && events.contains { if case .outputEnded = $0 { true } else { false } }
    }

    private func received(_ data: Data) {
        guard !data.isEmpty else {
            let rest = partial.withLock { partial in
                defer { partial.removeAll() }
                return partial.isEmpty ? nil : String(decoding: partial, as: UTF8.self)
            }
            if let rest { events.append(.line(rest)) }
            events.append(.outputEnded)
            return
        }
        let complete: [String] = partial.withLock { partial in
            partial.append(data)
            var complete: [String] = []
            while let nl = partial.firstIndex(of: 0x0A) {
                complete.append(String(decoding: partial[partial.startIndex..<nl], as: UTF8.self))
                partial.removeSubrange(partial.startIndex...nl)
            }
            return complete
        }
        for line in complete { events.append(.line(line)) }
    }

    /// Waits for a stderr line (already printed or yet to come) containing
    /// `text`, the one after `skip` earlier such lines. `timeout` only
    /// bounds a broken run; it is not the signal.
    @discardableResult
    func waitForLine(containing text: String, after skip: Int = 0, timeout: Duration = .seconds(30)) async throws -> String {
        await events.wait(timeout: timeout) { events in
            Self.ended(events) || Self.lines(events).filter { $0.contains(text) }.count > skip
        }
        let seen = events.all
        let hits = Self.lines(seen).filter { $0.contains(text) }
        guard hits.count > skip else {
            throw DaemonError("vigild did not print a line containing \"\(text)\" (exited: \(Self.exitStatus(seen).map(String.init) ?? "no")); output:\n\(Self.lines(seen).joined(separator: "\n"))")
        }
        return hits[skip]
    }

    func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

    /// Waits for the process to exit and returns its status.
    /// Waits for the exit; its status. Every E2E test's log is checked
    /// here: durations read in at most two units (3m47s, 814ms).
    func waitForExit() async -> Int32 {
        // No bound: a vigild that never exits is the test's own failure.
        while !(await events.wait(timeout: .seconds(3600), until: { Self.exitStatus($0) != nil })) {}
        // Then its last lines: a child that kept vigild's stderr open may
        // hold the end back, so this wait is bounded.
        await events.wait(timeout: .seconds(10)) { Self.ended($0) }
        let status = Self.exitStatus(events.all) ?? -1
        #expect(durationsOverTwoUnits(in: output).isEmpty, "\(durationsOverTwoUnits(in: output))")
        return status
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

struct DaemonError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A config for a host with a short heartbeat interval in `dir`.
func hostConfig(stateDir: String, interval: String = "1s", extra: String = "") -> String {
    """
    [host]
    state_dir = "\(stateDir)"
    survival_interval = "\(interval)"
    log_level = "debug"
    \(extra)
    """
}

/// Reads `handle` to its end on a thread of its own, handing `chunk` each
/// piece as it comes and then an empty `Data` at the end. Call it once the
/// child holds the pipe's write end (after `Process.run()`), or the end
/// never comes. A blocking read, not `readabilityHandler`: tearing that
/// handler's libdispatch read source down races the pipe's close on Linux
/// and crashed the test process in `_dispatch_event_loop_drain` once in CI
/// (swift-corelibs-libdispatch#949, swift-corelibs-foundation#3276).
func readUntilEnd(_ handle: FileHandle, _ chunk: @escaping @Sendable (Data) -> Void) {
    Thread.detachNewThread {
        while true {
            let data = handle.availableData
            chunk(data)
            if data.isEmpty { return }
        }
    }
}

/// wakepy 1.0.0 from PyPI in a venv of the test's own, under `directory`:
/// the venv's python, which imports it.
func installWakepy(in directory: String) throws -> String {
    let venv = (directory as NSString).appendingPathComponent("venv")
    let made = try ProcessRunner.run("/usr/bin/python3", ["-m", "venv", venv])
    try #require(made.status == 0, "\(made.stderr)")
    let installed = try ProcessRunner.run(venv + "/bin/pip", ["install", "--quiet", "--disable-pip-version-check", "wakepy==1.0.0"])
    try #require(installed.status == 0, "pip install wakepy: \(installed.stderr)")
    return venv + "/bin/python"
}
