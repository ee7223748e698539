import VigilHost
import VigilKit
import VigilKitTesting

extension ManualClock {
    /// Waits until `requests` wake requests are pending on `scheduler` (at
    /// least that many, or exactly that many when `exactly`) and its timer
    /// sleeps on this clock: every strategy that ran asked for its next
    /// wake. On a real clock time does not wait for that; on the test clock
    /// it must, or a request taken late fires late (a loaded machine can
    /// outlast `settle()`'s yields). `exactly` also waits out a request its
    /// strategy replaced and cancelled, which leaves the scheduler a hop later.
    func armed(_ scheduler: WakeScheduler, timer: ClockDrivenWakeTimer, requests: Int, exactly: Bool = false) async throws {
        try await settle(until: "\(exactly ? "" : "at least ")\(requests) wake request(s) pending, the timer asleep on the clock") {
            let pending = await scheduler.pendingRequests
            guard exactly ? pending == requests : pending >= requests, !timer.isDeliveringExpiry else { return false }
            guard let deadline = timer.armedDeadline else { return pending == 0 }
            return sleeperCount(dueBy: deadline) > 0
        }
    }
}
