import Foundation
import Glibc
import Testing
@testable import VigilDBus
import VigilTestSupport

/// A private dbus-daemon for one test (Tests/TestSupport).
typealias TestBus = TestDBusDaemon

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
