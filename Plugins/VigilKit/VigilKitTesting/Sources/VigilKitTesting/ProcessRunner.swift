import Foundation

/// What a finished program printed, and its exit status (or the number of
/// the signal that ended it, as Foundation's `Process` reports it).
public struct CommandResult: Sendable, Hashable {
    public var status: Int32
    public var stdout: String
    public var stderr: String

    public init(status: Int32, stdout: String, stderr: String) {
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
    }

    /// stdout, then stderr.
    public var output: String { stdout + stderr }
}

/// A program run failed: its status and output.
public struct CommandFailure: Error, CustomStringConvertible {
    public var command: [String]
    public var result: CommandResult
    public init(command: [String], result: CommandResult) { self.command = command; self.result = result }
    public var description: String {
        "\(command.joined(separator: " ")) exited with \(result.status): \(result.output)"
    }
}

/// The one place a test starts a program: one-shot runs with their output
/// captured, and the `Process` of a long-running one (a server, a daemon)
/// for the caller to wire and start.
public enum ProcessRunner {
    /// A `Process` for `program`, not started: the caller sets its pipes,
    /// runs it and stops it.
    public static func process(_ program: String, _ arguments: [String] = [], environment: [String: String]? = nil,
                               cwd: String? = nil) -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        if let environment { process.environment = environment }
        if let cwd { process.currentDirectoryURL = URL(fileURLWithPath: cwd) }
        return process
    }

    /// Runs `program` to its end and returns its status and output. The
    /// output goes through files, not pipes: no pipe can fill up, and a
    /// child that leaves a descendant holding its stdout (a daemon that
    /// forks) cannot keep the read open after it exits. Blocks the calling
    /// thread: from async code that the program calls back into, use
    /// ``runDetached(_:_:environment:cwd:)``.
    public static func run(_ program: String, _ arguments: [String], environment: [String: String]? = nil,
                           cwd: String? = nil) throws -> CommandResult {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-run-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let out = dir.appendingPathComponent("out"), err = dir.appendingPathComponent("err")
        // FileHandle(forWritingTo:) below throws if either could not be made.
        _ = FileManager.default.createFile(atPath: out.path, contents: nil)
        _ = FileManager.default.createFile(atPath: err.path, contents: nil)
        let p = process(program, arguments, environment: environment, cwd: cwd)
        let outHandle = try FileHandle(forWritingTo: out), errHandle = try FileHandle(forWritingTo: err)
        defer {
            try? outHandle.close()
            try? errHandle.close()
        }
        p.standardOutput = outHandle
        p.standardError = errHandle
        try p.run()
        p.waitUntilExit()
        return CommandResult(
            status: p.terminationStatus,
            stdout: String(decoding: (try? Data(contentsOf: out)) ?? Data(), as: UTF8.self),
            stderr: String(decoding: (try? Data(contentsOf: err)) ?? Data(), as: UTF8.self))
    }

    /// Runs `program` to its end and returns its output (stdout, then
    /// stderr); throws ``CommandFailure`` when it exits with a status other
    /// than 0.
    @discardableResult
    public static func checkedOutput(_ program: String, _ arguments: [String], environment: [String: String]? = nil,
                                     cwd: String? = nil) throws -> String {
        let result = try run(program, arguments, environment: environment, cwd: cwd)
        guard result.status == 0 else { throw CommandFailure(command: [program] + arguments, result: result) }
        return result.output
    }

    /// ``run(_:_:environment:cwd:)`` on a thread of its own, off the
    /// cooperative pool: the program may call back into code under test
    /// whose tasks need the pool.
    public static func runDetached(_ program: String, _ arguments: [String], environment: [String: String]? = nil,
                                   cwd: String? = nil) async throws -> CommandResult {
        try await withCheckedThrowingContinuation { continuation in
            Thread {
                continuation.resume(with: Result { try run(program, arguments, environment: environment, cwd: cwd) })
            }.start()
        }
    }
}
