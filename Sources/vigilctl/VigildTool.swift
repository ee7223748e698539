import Foundation
import VigilKit

/// vigild run as a tool, for the commands that need the config read the way
/// the host reads it (check-config, metrics): one config parser, in vigild,
/// and vigilctl links none of it.
enum VigildTool {
    /// vigild's `EX_CONFIG`: the config has problems.
    static let configProblems: Int32 = 78

    struct NotFound: Error, CustomStringConvertible {
        var description: String
    }

    /// vigild beside vigilctl's own executable (a build directory,
    /// /usr/lib/vigil), else the first on `PATH`.
    static func locate(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> String {
        let own = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")).map { ($0 as NSString).deletingLastPathComponent }
        var candidates = own.map { ["\($0)/vigild"] } ?? []
        for dir in (environment["PATH"] ?? "").split(separator: ":") where dir.hasPrefix("/") {
            candidates.append("\(dir)/vigild")
        }
        if let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) { return found }
        throw NotFound(description: "cannot find vigild (looked beside vigilctl\(own.map { " in \($0)" } ?? "") and on PATH); it reads the config for vigilctl")
    }

    /// Runs vigild with `arguments`, its standard error passed through and
    /// its standard output too unless `quiet`; returns its exit status.
    static func run(_ arguments: [String], quiet: Bool = false) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try locate())
        process.arguments = arguments
        if quiet { process.standardOutput = FileHandle.nullDevice }
        try process.run()
        process.waitUntilExit()
        return status(process)
    }

    /// Runs vigild with `arguments` and returns its exit status, standard
    /// output and standard error.
    static func output(_ arguments: [String]) throws -> (status: Int32, stdout: Data, stderr: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try locate())
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        // Standard error on a thread of its own: a config with many problems
        // could fill one pipe while vigilctl waits on the other.
        let errors = Collected()
        let drained = DispatchSemaphore(value: 0)
        let reader = err.fileHandleForReading
        Thread.detachNewThread {
            let data = reader.readDataToEndOfFile()
            errors.data.withLock { $0 = data }
            drained.signal()
        }
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        drained.wait()
        process.waitUntilExit()
        return (status(process), stdout, String(decoding: errors.data.withLock { $0 }, as: UTF8.self))
    }

    private static func status(_ process: Process) -> Int32 {
        process.terminationReason == .exit ? process.terminationStatus : 128 + process.terminationStatus
    }
}

/// What a reader thread collected, handed over under its lock.
private final class Collected: Sendable {
    let data = Lock(Data())
}
