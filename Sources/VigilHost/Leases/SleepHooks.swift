import VigilKit

/// `[host] on_sleep`: a command that runs when the system is about to
/// sleep, under a logind delay lock so it finishes (or times out) before the
/// system sleeps. Only the logind backend can delay sleep.
public enum SleepHooks {
    /// Starts watching for sleep when `on_sleep` is set and the backend is
    /// logind; returns the watching task, or nil (with the reason logged)
    /// when there is nothing to run or no way to run it in time.
    public static func start(settings: HostSettings, backend: any PowerBackend, log: Logger,
                             events: (any EventRecording)? = nil) async -> Task<Void, Never>? {
        guard let argv = settings.onSleep else { return nil }
        guard let logind = backend as? LogindPowerBackend else {
            log.warning("[host] on_sleep is set but the power backend is \(backend.name), not logind: only logind announces sleep and can delay it, so on_sleep will not run")
            return nil
        }
        let hooks = HookRunner(strategy: "host", log: log)
        let command = HookCommand(argv: argv, timeout: settings.onSleepTimeout)
        do {
            let task = try await logind.watchSleep(who: "vigild") {
                log.info("the system is about to sleep: running on_sleep (\(argv.joined(separator: " ")))")
                let result = await hooks.run(command, event: "sleep", variables: [:])
                await events?.record("on-sleep", ["exit": "\(result.exit)"])
            }
            log.info("on_sleep runs before each sleep, under a logind delay lock (at most \(settings.onSleepTimeout.vigilDescription))")
            return task
        } catch {
            log.error("cannot take logind's sleep delay lock for on_sleep: \(error); on_sleep will not run")
            return nil
        }
    }
}
