import Foundation

/// What a program printed, and its exit status.
public struct CommandResult: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
}

/// Runs a program to completion and captures its output.
public func runCommand(_ program: String, _ arguments: [String], environment: [String: String]? = nil, cwd: String? = nil) throws -> CommandResult {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: program)
    p.arguments = arguments
    if let environment { p.environment = environment }
    if let cwd { p.currentDirectoryURL = URL(fileURLWithPath: cwd) }
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    // Read both pipes to EOF before waiting, so a chatty child never blocks.
    let group = DispatchGroup()
    nonisolated(unsafe) var errData = Data()
    group.enter()
    DispatchQueue.global().async {
        errData = err.fileHandleForReading.readDataToEndOfFile()
        group.leave()
    }
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    p.waitUntilExit()
    return CommandResult(status: p.terminationStatus, stdout: String(decoding: outData, as: UTF8.self), stderr: String(decoding: errData, as: UTF8.self))
}
