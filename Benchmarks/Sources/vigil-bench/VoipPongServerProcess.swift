import Foundation
import Glibc
import VigilKit

/// The voip-socket benchmark's pong server, run as a child process
/// (`vigil-bench voip-socket --pong-server`), so the benchmark process holds
/// only the client side of the connections: 10,000 connections need about
/// 10,000 descriptors there instead of 20,000 (the hard limit here is 20,000
/// and cannot be raised without CAP_SYS_RESOURCE).
///
/// The child prints `port N` once listening, then answers one line per
/// command line on its stdin; it exits when stdin closes.
/// - `stats` -> `accepted A pings P cpu_ns C` (C: the server thread's CPU time)
/// - `with-pings K` -> how many connections sent at least K pings
/// - `round` -> `spread_ms` then the gap of every connection with two pings (s)
/// - `reset` -> `ok` (forgets per-connection figures)
final class PongServerProcess: @unchecked Sendable {
    // Invariant: `process`, `commands`, `answers` and `port` are set in init
    // and never change; every command/answer exchange on the pipes runs
    // inside `pending`'s lock (the answer bytes read ahead).
    static let childFlag = "--pong-server"
    private let process = Process()
    private let commands: FileHandle
    private let answers: FileHandle
    private let pending = Lock(Data())
    private(set) var port: UInt16 = 0

    init(capacity: Int) throws {
        let input = Pipe(), output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe")
        process.arguments = ["voip-socket", Self.childFlag, String(capacity)]
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        commands = input.fileHandleForWriting
        answers = output.fileHandleForReading
        let first = pending.withLock { readLine(&$0) }
        guard first.hasPrefix("port "), let p = UInt16(first.dropFirst(5)) else {
            throw BenchError("pong server process: expected 'port N', got '\(first)'")
        }
        port = p
    }

    var address: String { "127.0.0.1:\(port)" }
    /// The child's process id.
    var pid: pid_t { process.processIdentifier }

    var accepted: Int { Int(stats()[1]) ?? 0 }
    var totalPings: Int { Int(stats()[3]) ?? 0 }
    var cpuNanoseconds: Int64 { Int64(stats()[5]) ?? 0 }
    func connectionsWithPings(atLeast k: Int32) -> Int { Int(ask("with-pings \(k)")) ?? 0 }

    func lastRound() -> RoundFigures {
        let fields = ask("round").split(separator: " ").compactMap { Double($0) }
        return RoundFigures(spreadMs: fields.first ?? 0, gaps: Array(fields.dropFirst()))
    }

    func resetFigures() { _ = ask("reset") }

    /// Closes the child's stdin (it exits) and waits for it.
    func stop() {
        try? commands.close()
        process.waitUntilExit()
    }

    private func stats() -> [Substring] {
        let fields = ask("stats").split(separator: " ")
        return fields.count == 6 ? fields : ["accepted", "0", "pings", "0", "cpu_ns", "0"]
    }

    private func ask(_ command: String) -> String {
        pending.withLock { pending in
            commands.write(Data((command + "\n").utf8))
            return readLine(&pending)
        }
    }

    private func readLine(_ pending: inout Data) -> String {
        while true {
            if let newline = pending.firstIndex(of: 10) {
                let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                pending.removeSubrange(pending.startIndex...newline)
                return line
            }
            let chunk = answers.availableData
            if chunk.isEmpty { return "" }  // the child died
            pending.append(chunk)
        }
    }
}

/// The child side: the pong server plus the command loop on stdin.
func runPongServerChild() throws {
    let capacity = CommandLine.arguments.last.flatMap(Int.init) ?? 20_000
    let server = try BenchPongServer(capacity: capacity)
    // Unbuffered: the parent waits for each line.
    func answer(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
    answer("port \(server.port)")
    while let line = Swift.readLine() {
        let words = line.split(separator: " ")
        switch words.first {
        case "stats":
            answer("accepted \(server.accepted) pings \(server.totalPings) cpu_ns \(server.cpuNanoseconds)")
        case "with-pings":
            answer(String(server.connectionsWithPings(atLeast: words.count > 1 ? Int32(words[1]) ?? 1 : 1)))
        case "round":
            let round = server.lastRound()
            answer(([round.spreadMs] + round.gaps).map { String($0) }.joined(separator: " "))
        case "reset":
            server.resetFigures()
            answer("ok")
        default:
            answer("unknown command: \(line)")
        }
    }
    exit(0)
}
