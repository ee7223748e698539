import ServiceLifecycle
import VigilDBus
import VigilKit

/// What the host watches of the system's sleep, as a service: logind's
/// `PrepareForSleep` (``SleepBreaks``), wake, work, sleep again
/// (``ReturnToSleep``), both only with the logind power backend, and each
/// resume (``ResumeWatcher``), which tells all three what woke the system.
/// Started before the strategies (``started``), stopped after the bus.
public struct SleepCycleService: Service {
    /// The host's parts the sleep cycle drives, made before the group starts.
    struct Parts: Sendable {
        /// Sleep that broke leases, and the logind connection it follows.
        var sleepBreaks: (SleepBreaks, DBusConnection)?
        var returnToSleep: ReturnToSleep?
        /// Called once per resume with the readings just after it and the time suspended.
        var resumed: @Sendable (_ resume: ClockReadings, _ suspendedMicros: Int64) async -> Void
        var readings: @Sendable () -> ClockReadings
    }

    let parts: Parts
    let log: Logger
    /// Set once everything is watching.
    public let started = Started()

    public func run() async {
        if let (breaks, logind) = parts.sleepBreaks {
            do {
                try await breaks.watch(logind)
            } catch {
                log.warning("cannot follow logind's PrepareForSleep, so sleep that breaks a lease is not reported: \(error)")
            }
        }
        await parts.returnToSleep?.start()
        // Without the timerfd the host runs on and the survival log still
        // shows suspends, without cause.
        var watcher: ResumeWatcher?
        do {
            watcher = try ResumeWatcher(readings: parts.readings, handler: parts.resumed)
        } catch {
            log.warning("cannot watch for system resumes, so wakes are not attributed: \(error)")
        }
        await started.set(true)
        try? await gracefulShutdown()
        watcher?.invalidate()
        await parts.returnToSleep?.stop()
        await parts.sleepBreaks?.0.stop()
    }
}
