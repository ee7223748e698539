import VigilHost
import VigilKit
import VigilKitTesting

extension ManualClock {
    /// Waits until at least `requests` wake requests are pending on
    /// `scheduler` and its timer sleeps on this clock: every strategy that
    /// ran asked for its next wake. On a real clock time does not wait for
    /// that; on the test clock it must, or a request taken late fires late
    /// (a loaded machine can outlast `settle()`'s yields).
    func armed(_ scheduler: WakeScheduler, timer: ClockDrivenWakeTimer, requests: Int) async throws {
        try await settle(until: "\(requests) wake request(s) pending, the timer asleep on the clock") {
            let pending = await scheduler.pendingRequests
            guard pending >= requests, !timer.isDeliveringExpiry else { return false }
            guard let deadline = timer.armedDeadline else { return pending == 0 }
            return sleeperCount(dueBy: deadline) > 0
        }
    }
}
