import CVigilLoop
import Dispatch
import Foundation
import VigilKit

/// The survival store's executor: one thread of its own that runs the
/// store's jobs in order.
///
/// Why: every store write waits for the disk (`synchronous = FULL`: an
/// fsync per transaction, a few hundred µs). On the cooperative pool, which
/// has as many threads as cores (two here), each write would hold one of
/// them, and the D-Bus handlers, the registry and the followers would queue
/// behind it. On this thread only the store waits. The thread sleeps on a
/// semaphore while there is nothing to do (no wakeups, and not libdispatch's
/// worker pool), and ends when the store is released.
final class StoreThread: SerialExecutor, Sendable {
    private struct State {
        var jobs: [UnownedJob] = []
        var stopped = false
        /// This executor, unowned: jobs run only while the actor that uses
        /// it (and keeps it) is alive.
        var executor: UnownedSerialExecutor?
        /// The thread, once it runs.
        var thread: pthread_t?
    }

    /// Shared by the executor and its thread (the thread does not keep the executor).
    private final class Shared: Sendable {
        let state = Lock(State())
        let available = DispatchSemaphore(value: 0)
    }

    private let shared = Shared()

    init(name: String) {
        let shared = self.shared
        // Named from inside: Foundation's `Thread.name` does not reach the
        // kernel's name on Linux, and /proc (idle-cost's thread list) shows that.
        let threadName = String(name.prefix(15))
        let thread = Thread {
            vigil_name_thread(threadName)
            shared.state.withLock { $0.thread = pthread_self() }
            while true {
                shared.available.wait()
                let (next, executor, stopped) = shared.state.withLock { state in
                    (state.jobs.isEmpty ? nil : state.jobs.removeFirst(), state.executor, state.stopped)
                }
                if let next, let executor {
                    next.runSynchronously(on: executor)
                } else if stopped {
                    return
                }
            }
        }
        thread.name = name
        let executor = asUnownedSerialExecutor()
        shared.state.withLock { $0.executor = executor }
        thread.start()
    }

    deinit {
        shared.state.withLock { $0.stopped = true }
        shared.available.signal()
    }

    /// Whether the caller runs on this executor's thread.
    var isCurrent: Bool {
        shared.state.withLock { state in state.thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        shared.state.withLock { $0.jobs.append(job) }
        shared.available.signal()
    }
}
