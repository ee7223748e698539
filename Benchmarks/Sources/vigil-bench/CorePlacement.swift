import CVoipSocket
import Foundation
import Glibc

/// Where `vigil-bench voip-socket` runs its two ends: the side measured (this
/// process: the strategies, or the bare reference loop) on some cores, the
/// far end (the pong server, and nginx with `--tls`) on a core of its own.
///
/// A keep-alive's far end is another machine. Here it is a process on the
/// same two cores, and when the scheduler put it on the core of the
/// strategies' event thread, the two took turns at every ping and pong and a
/// round cost up to a third more CPU on the measured side (the server's CPU
/// for the same work rose with it), in some runs and rounds and not in
/// others. On cores of their own the rounds of a run agree within a few
/// per cent.
struct CorePlacement {
    /// Cores of this process (the side measured).
    let measured: [Int]
    /// The far end's core.
    let far: Int

    /// The split of the cores this process may use, or nil when it may use
    /// fewer than two.
    static func split() -> CorePlacement? {
        let allowed = allowedCores()
        guard allowed.count >= 2, let last = allowed.last else { return nil }
        return CorePlacement(measured: Array(allowed.dropLast()), far: last)
    }

    /// Puts every thread of this process on ``measured`` (threads started
    /// later inherit it from the thread that starts them).
    func pinThisProcess() throws {
        // Twice: a thread started by a thread not pinned yet, after the
        // first listing, is in the second.
        try Self.pin(process: getpid(), to: measured)
        try Self.pin(process: getpid(), to: measured)
    }

    /// Puts every thread of `pid` on ``far``.
    func pinFarEnd(_ pid: pid_t) throws {
        try Self.pin(process: pid, to: [far])
    }

    /// nginx's `worker_cpu_affinity` value for `workers` workers on ``far``.
    func nginxAffinity(workers: Int) -> String {
        let mask = "1" + String(repeating: "0", count: far)
        return Array(repeating: mask, count: workers).joined(separator: " ")
    }

    func description(tls: Bool) -> String {
        "this process on CPU \(measured.map(String.init).joined(separator: ",")), the far end (pong server\(tls ? ", nginx's workers" : "")) on CPU \(far)"
    }

    private static func allowedCores() -> [Int] {
        let mask = vigil_affinity()
        return (0..<64).filter { mask & (1 << UInt64($0)) != 0 }
    }

    private static func pin(process pid: pid_t, to cores: [Int]) throws {
        let mask = cores.reduce(UInt64(0)) { $1 < 64 ? $0 | 1 << UInt64($1) : $0 }
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        guard !tasks.isEmpty else { throw BenchError("cannot list the threads of process \(pid) in /proc/\(pid)/task") }
        for task in tasks {
            guard let tid = Int32(task) else { continue }
            // A thread that ended since the listing is no error.
            if vigil_set_affinity(tid, mask) != 0, errno != ESRCH {
                throw BenchError("sched_setaffinity(\(tid), CPU \(cores)): \(String(cString: strerror(errno)))")
            }
        }
    }
}
