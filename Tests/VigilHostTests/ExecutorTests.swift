import CExecutor
import CTestExecutor
import Glibc
import Testing
import VigilKit

/// vigild's global executor and timer threads (Sources/CExecutor), driven
/// from many tasks at once: Scripts/sanitize runs these under
/// ThreadSanitizer, with the test bundle itself on the executor.
@Suite struct ExecutorTests {
    @Test func theBundleRunsOnVigildsExecutorWhenAsked() async throws {
        guard vigil_test_executor_installed() == 1 else { return }  // VIGIL_TEST_EXECUTOR=1 only
        let before = vigil_executor_statistics()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<50 { group.addTask { await Task.yield() } }
        }
        let after = vigil_executor_statistics()
        #expect(after.jobs_run > before.jobs_run)
    }

    @Test func timersScheduledAndCancelledFromManyTasksRunExactlyOnce() async throws {
        let box = Unmanaged.passRetained(FiredBox())
        defer { box.release() }
        let callbacks: [(id: UInt64, cancelled: Bool)] = await withTaskGroup(of: [(UInt64, Bool)].self) { group in
            for task in 0..<8 {
                group.addTask {
                    var mine: [(UInt64, Bool)] = []
                    for i in 0..<100 {
                        var now = timespec()
                        clock_gettime(CLOCK_MONOTONIC, &now)
                        let deadline = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec) + Int64((task * 7 + i) % 20) * 100_000
                        let id = vigil_timer_schedule(1, deadline, { context in
                            guard let context else { return }
                            Unmanaged<FiredBox>.fromOpaque(context).takeUnretainedValue().record()
                        }, box.toOpaque())
                        #expect(id != 0)
                        let cancelled = i % 2 == 0 && vigil_timer_cancel(1, id) == 1
                        mine.append((id, cancelled))
                        if i % 10 == 0 { await Task.yield() }
                    }
                    return mine
                }
            }
            var all: [(UInt64, Bool)] = []
            for await part in group { all += part }
            return all
        }
        let expected = callbacks.filter { !$0.cancelled }.count
        // Every deadline is at most 2 ms away.
        let deadline = ContinuousClock.now + .seconds(10)
        while box.takeUnretainedValue().count < expected, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        try await Task.sleep(for: .milliseconds(20))
        #expect(box.takeUnretainedValue().count == expected)
    }
}

/// Counts callbacks; called on the timer thread.
final class FiredBox: Sendable {
    let calls = Lock(0)
    func record() { calls.withLock { $0 += 1 } }
    var count: Int { calls.withLock { $0 } }
}
