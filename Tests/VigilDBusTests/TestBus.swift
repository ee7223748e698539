import Foundation
import Glibc
import Testing
@testable import VigilDBus

/// A private dbus-daemon started for one test, stopped by `stop()`.
final class TestBus: @unchecked Sendable {
    // Invariant: all stored properties are immutable after init.
    let address: String
    let pid: pid_t
    let directory: URL

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-dbus-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let config = directory.appendingPathComponent("bus.conf")
        try """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>session</type>
          <listen>unix:dir=\(directory.path)</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
            <allow own="*"/>
          </policy>
        </busconfig>
        """.write(to: config, atomically: true, encoding: .utf8)
        // --nofork: a forked daemon would keep our pipe open; we read the
        // address line and keep the daemon as our child, stopped by pid.
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
        process.arguments = ["--config-file=\(config.path)", "--print-address=1", "--nofork"]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        var buffer = Data()
        while !buffer.contains(UInt8(ascii: "\n")) {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            buffer.append(chunk)
        }
        let line = String(decoding: buffer, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
        guard line.hasPrefix("unix:") else {
            process.terminate()
            throw DBusError.failed("dbus-daemon did not print an address: \(line)")
        }
        address = line
        pid = process.processIdentifier
        self.process = process
    }

    private let process: Process

    func stop() {
        // SIGKILL: a child spawned from a dispatch thread inherits a signal
        // mask that blocks SIGTERM.
        kill(pid, SIGKILL)
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: directory)
    }

    func connect() async throws -> DBusConnection {
        try await DBusConnection.connect(to: .address(address))
    }
}

struct ToolOutput {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs an external tool to completion and captures its output.
func runTool(_ path: String, _ arguments: [String], environment: [String: String]? = nil) throws -> ToolOutput {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    if let environment { process.environment = environment }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Read both pipes fully before waiting, so a chatty tool cannot block.
    let errData = LockedData()
    let errThread = Thread { errData.set(err.fileHandleForReading.readDataToEndOfFile()) }
    errThread.start()
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    while !errData.isSet { usleep(1000) }
    return ToolOutput(
        status: process.terminationStatus,
        stdout: String(decoding: outData, as: UTF8.self),
        stderr: String(decoding: errData.get(), as: UTF8.self))
}

/// Runs a tool off the cooperative pool (the tool may call back into the
/// service under test, whose handlers need the pool).
func runToolAsync(_ path: String, _ arguments: [String]) async throws -> ToolOutput {
    try await withCheckedThrowingContinuation { continuation in
        Thread {
            continuation.resume(with: Result { try runTool(path, arguments) })
        }.start()
    }
}

final class LockedData: @unchecked Sendable {
    // Invariant: `data` and `done` are only touched under `lock`.
    private let lock = NSLock()
    private var data = Data()
    private var done = false
    func set(_ value: Data) { lock.lock(); data = value; done = true; lock.unlock() }
    func get() -> Data { lock.lock(); defer { lock.unlock() }; return data }
    var isSet: Bool { lock.lock(); defer { lock.unlock() }; return done }
}
