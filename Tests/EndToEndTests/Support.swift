import Foundation
import Testing
import VigilHost
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
    // Invariant: `lines`, `waiters` and `exitStatus` are only touched while holding `lock`.
    private let lock = NSLock()
    private var lines: [String] = []
    private var partial = Data()
    private var waiters: [(id: Int, predicate: (String) -> Bool, continuation: CheckedContinuation<String?, Never>)] = []
    private var nextWaiter = 0
    private var exitWaiters: [CheckedContinuation<Int32, Never>] = []
    private var exitStatus: Int32?
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
        process.terminationHandler = { [weak self] p in self?.exited(p.terminationStatus) }
        try process.run()
        readUntilEnd(err.fileHandleForReading) { [weak self] data in self?.received(data) }
    }

    var pid: Int32 { process.processIdentifier }

    /// Everything vigild printed so far.
    var output: [String] { lock.withLock { lines } }

    private func received(_ data: Data) {
        var ready: [CheckedContinuation<String?, Never>] = []
        var results: [String] = []
        lock.withLock {
            partial.append(data)
            while let nl = partial.firstIndex(of: 0x0A) {
                let line = String(decoding: partial[partial.startIndex..<nl], as: UTF8.self)
                partial.removeSubrange(partial.startIndex...nl)
                lines.append(line)
                waiters.removeAll { w in
                    guard w.predicate(line) else { return false }
                    ready.append(w.continuation)
                    results.append(line)
                    return true
                }
            }
        }
        for (c, line) in zip(ready, results) { c.resume(returning: line) }
    }

    private func exited(_ status: Int32) {
        let (ws, ew): ([CheckedContinuation<String?, Never>], [CheckedContinuation<Int32, Never>]) = lock.withLock {
            exitStatus = status
            defer { waiters.removeAll(); exitWaiters.removeAll() }
            return (waiters.map(\.continuation), exitWaiters)
        }
        for w in ws { w.resume(returning: nil) }
        for w in ew { w.resume(returning: status) }
    }

    /// Waits for a stderr line (already printed or yet to come) containing
    /// `text`. `timeout` only bounds a broken run; it is not the signal.
    @discardableResult
    func waitForLine(containing text: String, after skip: Int = 0, timeout: Duration = .seconds(30)) async throws -> String {
        var seen = 0
        let id: Int = lock.withLock { nextWaiter += 1; return nextWaiter }
        let match: (String) -> Bool = { line in
            guard line.contains(text) else { return false }
            seen += 1
            return seen > skip
        }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.cancelWaiter(id)
        }
        defer { timer.cancel() }
        let line: String? = await withCheckedContinuation { c in
            let immediate: String?? = lock.withLock {
                if let hit = lines.first(where: match) { return .some(hit) }
                if exitStatus != nil { return .some(nil) }
                waiters.append((id, match, c))
                return nil
            }
            if let immediate { c.resume(returning: immediate) }
        }
        guard let line else {
            throw DaemonError("vigild did not print a line containing \"\(text)\" (exited: \(lock.withLock { exitStatus }.map(String.init) ?? "no")); output:\n\(output.joined(separator: "\n"))")
        }
        return line
    }

    private func cancelWaiter(_ id: Int) {
        let c: CheckedContinuation<String?, Never>? = lock.withLock {
            guard let i = waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return waiters.remove(at: i).continuation
        }
        c?.resume(returning: nil)
    }

    func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

    /// Waits for the process to exit and returns its status.
    /// Waits for the exit; its status. Every E2E test's log is checked
    /// here: durations read in at most two units (3m47s, 814ms).
    func waitForExit() async -> Int32 {
        let status = await withCheckedContinuation { c in
            let done: Int32? = lock.withLock {
                if let exitStatus { return exitStatus }
                exitWaiters.append(c)
                return nil
            }
            if let done { c.resume(returning: done) }
        }
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
