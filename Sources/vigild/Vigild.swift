import ArgumentParser
import CVigilLoop
import Dispatch
import Foundation
import Glibc
import ServiceLifecycle
import VigilDBus
import VigilHost
import VigilKit

/// vigild's entry point: a synchronous main, so that the host's event loop
/// (Plugins/VigilKit/Sources/CVigilLoop) is the global executor before the first task exists
/// and the main thread is the loop's thread.
@main
enum VigildMain {
    nonisolated static func main() {
        // First, before any thread exists, so that every thread inherits the
        // mask and these signals wait for their signalfd (SignalStream).
        SignalStream.blockForStreams(Vigild.streamedSignals)
        Vigild.prepareProcess()
        let environment = ProcessInfo.processInfo.environment
        // VIGIL_DEFAULT_EXECUTOR=1 keeps Swift's default executor, and
        // VIGIL_EXECUTOR_WORKERS=N runs jobs on N worker threads beside the
        // loop's own (diagnosis, and the measure of the choice:
        // docs/architecture.md, "The event loop").
        let useDefault = environment["VIGIL_DEFAULT_EXECUTOR"] == "1"
        let workers = environment["VIGIL_EXECUTOR_WORKERS"].flatMap { Int32($0) } ?? 0
        if !useDefault, vigil_executor_install(workers) != 0 {
            // Most likely out of memory or descriptors.
            let reason = String(cString: strerror(errno))
            Logger(label: "vigild").critical("""
                cannot start the event loop (\(reason)): out of memory or descriptors \
                (RLIMIT_AS, RLIMIT_NOFILE, the cgroup's memory.max?)
                """)
            Glibc.exit(Vigild.outOfResourcesStatus)
        }
        // Unstructured task: not cancelled: it is the whole command; the
        // process exits when it ends. Detached: a task made here would
        // inherit the main actor, whose executor is libdispatch's main
        // queue, not the loop.
        Task.detached {
            await Vigild.runCommand()
            Glibc.exit(0)
        }
        if useDefault || workers > 0 { dispatchMain() }
        vigil_loop_run()
    }
}

struct Vigild: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vigild",
        abstract: "The Vigil keep-alive host.",
        discussion: """
        vigild loads the keep-alive strategies named in its TOML config (each kind from \
        its plugin library, libvigil-<kind>.so), runs them under supervision, keeps every \
        lease they hold in one registry, and writes a survival heartbeat to SQLite every \
        survival_interval (default 60s) so that `vigilctl survival` can tell how long the \
        host stayed alive and why it stopped.

        The config is validated completely before anything starts; every problem is \
        reported with file:line:column and the host exits with status 78 (EX_CONFIG).

        Plugins are searched in $VIGIL_PLUGIN_PATH (colon-separated), [host] plugin_path, \
        the directory of the vigild executable, /usr/local/lib/vigil/plugins and \
        /usr/lib/vigil/plugins, in that order.

        SIGTERM and SIGINT stop the host cleanly: strategies are cancelled in reverse start \
        order, every lease is released, and the final heartbeat records a clean end. \
        SIGHUP re-reads the config, as the D-Bus method Host.Reload does: strategies \
        added, removed or changed start and stop; an invalid config changes nothing.

        Exit status: 0 after a clean stop, 1 on a runtime error, 64 on bad usage, \
        78 on an invalid config.
        """,
        version: VigilVersion.string
    )

    @Option(name: [.short, .customLong("config")], help: ArgumentHelp("The TOML config file.", discussion: "Default: $VIGIL_CONFIG, else ~/.config/vigil/vigil.toml (or /etc/vigil/vigil.toml for root) if it exists.", valueName: "file"))
    var config: String?

    @Option(name: .customLong("state-dir"), help: ArgumentHelp("Override [host] state_dir (where the survival log lives).", valueName: "dir"))
    var stateDir: String?

    @Option(name: .customLong("log-level"), help: ArgumentHelp("Override [host] log_level: debug, info, notice, warning or error.", valueName: "level"))
    var logLevel: String?

    @Flag(name: .customLong("check"), help: ArgumentHelp(
        "Validate the config, load its plugins, print a summary and exit; start nothing.",
        discussion: "Problems go to standard error alone, one per line (`vigilctl check-config` runs this)."))
    var checkOnly = false

    @Flag(name: .customLong("print-metrics-settings"), help: ArgumentHelp(
        "Print the config's [metrics] listen and textfile as one JSON object and exit; start nothing.",
        discussion: "Reads the config without loading plugins (`vigilctl metrics` runs this)."))
    var printMetricsSettings = false

    @Flag(name: .customLong("print-introspection"), help: "Print the D-Bus introspection XML of the org.vigil.Vigil1 API (docs/org.vigil.Vigil1.xml) and exit.")
    var printIntrospection = false

    @Flag(name: .customLong("print-inhibit-introspection"), help: "Print the D-Bus introspection XML of the freedesktop inhibit interfaces vigild serves for apps (docs/freedesktop-inhibit.xml) and exit.")
    var printInhibitIntrospection = false

    /// The least address space vigild starts in: measured with `prlimit
    /// --as` (docs/deployment.md, "Memory limits").
    static let addressSpaceFloor: UInt64 = 256 << 20
    /// `EX_OSERR`: the system cannot give vigild the memory or threads it needs.
    static let outOfResourcesStatus: Int32 = 71

    /// The signals read from a ``SignalStream`` (blocked in every thread).
    static let streamedSignals: [Int32] = [SIGTERM, SIGINT, SIGHUP]

    /// Where vigild's log lines go: stderr, with journald priorities when
    /// stderr is the journal. The one handler of swift-log's LoggingSystem
    /// writes here (bootstrapped first thing in `main`).
    static let logOutput = LogLineWriter()

    /// Before any task exists: the signals, logging and the address space.
    static func prepareProcess() {
        // A reader of stdout/stderr that goes away must not kill the host:
        // writes then fail with EPIPE, which the log output counts.
        signal(SIGPIPE, SIG_IGN)
        // Once, before any Logger exists: every Logger(label:) of the
        // process (the host's, the plugins', ServiceGroup's) writes through
        // this handler. Its level is set from the config before the host's
        // loggers are made.
        let output = Self.logOutput
        LoggingSystem.bootstrap { label in output.handler(label: label) }
        let addressSpace = vigil_fit_address_space()
        if addressSpace > 0 {
            // Below the floor vigild would fail later where it could not say
            // why (docs/deployment.md, "Memory limits").
            guard addressSpace >= Self.addressSpaceFloor else {
                Logger(label: "vigild").critical("""
                    the address-space limit (RLIMIT_AS) is \(addressSpace >> 20) MiB; vigild needs at least \
                    \(Self.addressSpaceFloor >> 20) MiB (prlimit --as, ulimit -v, systemd LimitAS=): raise the limit
                    """)
                Glibc.exit(Self.outOfResourcesStatus)
            }
            Logger(label: "vigild").notice("""
                the address space is limited to \(addressSpace >> 20) MiB (RLIMIT_AS): \
                threads reserve 1 MiB of stack and malloc keeps 2 arenas
                """)
        }
    }

    /// Runs the command as ArgumentParser's main would, on the loop.
    static func runCommand() async {
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }

    func run() async throws {
        if printIntrospection {
            print(HostBusAPI.introspectionXML(), terminator: "")
            return
        }
        if printInhibitIntrospection {
            print(HostBusAPI.inhibitIntrospectionXML(), terminator: "")
            return
        }
        let path = try resolveConfigPath()
        if printMetricsSettings {
            try Self.printMetricsSettings(path: path)
            return
        }
        let loaded: (config: VigilConfig, plugins: PluginLoader)
        do {
            loaded = try ConfigLoader.loadWithPlugins(path: path)
        } catch {
            // --check: the problems alone, as `vigilctl check-config` shows them.
            Self.writeStderr(checkOnly ? "\(error)\n" : "vigild: invalid config\n\(error)\n")
            throw ExitCode(78)
        }
        var config = loaded.config
        if let stateDir { config.host.stateDir = stateDir }
        if let logLevel {
            guard let level = HostSettings.logLevels.first(where: { $0.rawValue == logLevel }) else {
                throw ValidationError("--log-level must be one of \(HostSettings.logLevels.map(\.rawValue).joined(separator: ", ")), not \"\(logLevel)\"")
            }
            config.host.logLevel = level
        }
        if checkOnly {
            print(Self.checkSummary(path: path, config: config, plugins: loaded.plugins), terminator: "")
            return
        }
        let output = Self.logOutput
        output.level = config.host.logLevel
        let logging = HostLogging.bootstrapped(writer: output)
        let log = logging.logger("vigild")
        for note in config.notes { log.notice("\(note)") }
        // Client leases each take a descriptor or two: use what the hard
        // limit allows (the units raise it), not the soft 1024.
        let files = DescriptorLimit.raiseSoftLimit()
        if files.after != files.before { log.debug("open-file limit raised from \(files.before) to \(files.after) (RLIMIT_NOFILE)") }

        let lock: InstanceLock
        do {
            lock = try InstanceLock.acquire(stateDir: config.host.stateDir)
        } catch {
            log.error("\(error)")
            throw ExitCode(1)
        }
        defer { lock.release() }

        let signals: SignalStream, reloadSignals: SignalStream
        do {
            signals = try SignalStream([SIGTERM, SIGINT])
            reloadSignals = try SignalStream([SIGHUP])
        } catch {
            log.critical("cannot watch signals: \(error)")
            throw ExitCode(Self.outOfResourcesStatus)
        }
        let clock = SystemClock()
        let scheduler: WakeScheduler
        do {
            scheduler = try WakeScheduler.system(clock: clock)
        } catch {
            log.error("cannot create the wake timer: \(error)")
            throw ExitCode(1)
        }
        // What leases hold on the system; an explicit choice that cannot
        // work stops the host, `auto` falls back to tracking only.
        let power: any PowerBackend
        do {
            power = try await config.host.power.select(wakelockDir: config.host.wakelockDir) {
                try await DBusConnection.connect(to: .system)
            }
        } catch {
            log.error("\(error)")
            throw ExitCode(1)
        }
        let host: HostRuntime
        do {
            // Reload re-applies the command-line overrides and resolves kinds
            // through the loader that resolved them at start.
            let stateDirOverride = stateDir
            let levelOverride = logLevel == nil ? nil : config.host.logLevel
            var environment = HostRuntime.Environment(
                clock: clock, scheduler: scheduler, logging: logging, power: power, version: VigilVersion.string,
                plugins: loaded.plugins,
                configOverrides: { reloaded in
                    if let stateDirOverride { reloaded.host.stateDir = stateDirOverride }
                    if let levelOverride { reloaded.host.logLevel = levelOverride }
                }
            )
            // Budgets count awake time: a suspend never eats one.
            environment.budgetClock = AwakeClock()
            host = try await HostRuntime.open(config: config, environment: environment)
        } catch {
            log.error("cannot start: \(error)")
            throw ExitCode(1)
        }
        // From here on the run is known: vigild's own lines say which
        // (`run=`, as the host's and the strategies' do).
        let runLog = logging.adding(["run": .string(host.runId)]).logger("vigild")
        let notifier = makeNotifier(log: runLog)
        let bus = OneShot<BusOutcome>()
        let outcome = RunOutcome()
        let settings = config.host
        let sleepCycle = host.sleepCycle()
        let strategies = await host.strategies(after: sleepCycle.started)
        let status = ServiceManagerService.HostStatus(
            registry: host.registry, strategyCount: { await host.config.strategies.count },
            health: { await host.health() }, healthChanges: { await host.healthChanges() })
        // Start order; vigild stops in the reverse order (docs/architecture.md,
        // "Stopping"): the signal service ends first and shuts the group down
        // gracefully; STOPPING=1 goes out; the watchdog and the sleep hooks
        // stop; the strategies stop and every lease is released; the bus
        // shows that and closes; the sleep cycle and the metrics endpoint
        // stop; the run's record (lease events, final heartbeat, end of run)
        // is written last, by the service that owns the survival store.
        // Where one service needs another running, it waits for it: the
        // strategies for the sleep cycle, the bus for the strategies.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: host.survivalRecorder(outcome: outcome), serviceName: "survival record"),
        ]
        if let metrics = host.metricsEndpoint() {
            services.append(.init(service: metrics, serviceName: "metrics listener"))
        }
        services += [
            .init(service: sleepCycle, serviceName: "sleep cycle"),
            .init(service: BusPresenceService(parts: host.busParts, settings: settings, after: strategies.started,
                                              busOutcome: bus, runOutcome: outcome, log: runLog),
                  failureTerminationBehavior: .gracefullyShutdownGroup, serviceName: "bus"),
            .init(service: strategies, serviceName: "strategies"),
            .init(service: SleepHooksService(settings: settings, power: power, log: runLog, events: host.events(for: "host")),
                  successTerminationBehavior: .ignore, serviceName: "sleep hooks"),
            .init(service: WatchdogService(notifier: notifier, scheduler: scheduler, clock: clock, log: runLog),
                  successTerminationBehavior: .ignore, serviceName: "watchdog"),
            .init(service: ServiceManagerService(notifier: notifier, host: status, bus: bus, log: runLog),
                  serviceName: "service manager"),
            .init(service: ReloadSignalService(signals: reloadSignals.stream, reload: { await host.reload() }, log: runLog),
                  serviceName: "reload signal"),
            .init(service: StopSignalService(signals: signals.stream, log: runLog),
                  successTerminationBehavior: .gracefullyShutdownGroup, serviceName: "signals"),
        ]
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: runLog))
        var failed = false
        do {
            try await group.run()
        } catch {
            runLog.error("\(error)")
            failed = true
        }
        withExtendedLifetime((signals, reloadSignals)) {}
        output.flush()
        let dropped = output.droppedLines
        if dropped > 0 {
            runLog.notice("\(dropped) log line\(dropped == 1 ? "" : "s") could not be written (stderr full or closed)")
        }
        if failed || outcome.failed != nil { throw ExitCode(1) }
    }

    /// Writes to stderr without trapping on EPIPE/ENOSPC (unlike
    /// FileHandle.write): the text is multi-line config diagnostics, the
    /// command's output as with `--check`, not a log line (those all go
    /// through the handler bootstrapped in `main`).
    static func writeStderr(_ text: String) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
            if n > 0 { bytes = bytes.dropFirst(n) } else if n < 0 && errno == EINTR { continue } else { return }
        }
    }

    /// The systemd notifier when vigild runs under a service manager
    /// (`NOTIFY_SOCKET` set), else nil.
    func makeNotifier(log: Logger) -> SystemdNotifier? {
        do {
            let notifier = try SystemdNotifier()
            if let notifier {
                log.debug("notifying \(notifier.socketName)\(notifier.watchdogInterval.map { "; watchdog every \($0)" } ?? "")")
            }
            return notifier
        } catch {
            log.warning("not notifying the service manager: \(error)")
            return nil
        }
    }

    /// What `--check` prints for a valid config: the host settings that
    /// matter most, each strategy with its kind and the plugin that
    /// provides it, its `when` condition, and the config's notes.
    static func checkSummary(path: String, config: VigilConfig, plugins: PluginLoader) -> String {
        var out = "\(path): OK\n"
        out += "  state_dir \(config.host.stateDir), survival_interval \(config.host.survivalInterval.vigilDescription)\n"
        let files = plugins.registeredKinds
        for s in config.strategies {
            out += "  strategy \"\(s.name)\": \(s.kind) — \(s.strategyKind.summary) [\(files[s.kind] ?? "built in")]\n"
            if let conditions = s.conditions {
                out += "    runs only while: \(TerminalText.escaped(conditions.written))\n"
            }
        }
        for note in config.notes { out += "note: \(note)\n" }
        return out
    }

    /// The `[metrics]` settings `vigilctl metrics` needs, as JSON
    /// (`{"listen": "127.0.0.1:9469", "textfile": "/path/vigil.prom"}`, each
    /// key only when set); a config that does not parse, or whose
    /// `[metrics]` has problems, exits 78 with them on standard error.
    static func printMetricsSettings(path: String) throws {
        let settings: MetricsSettings
        do {
            let document = try ConfigLoader.loadDocument(path: path)
            // The rest of the config may wait for --check; [metrics] itself must be right.
            let problems = document.problems.filter { $0.keyPath == "metrics" || $0.keyPath.hasPrefix("metrics.") }
            if !problems.isEmpty { throw ConfigError(path: path, problems: problems) }
            settings = document.host.metrics
        } catch {
            writeStderr("\(error)\n")
            throw ExitCode(78)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let data = try encoder.encode(MetricsSettingsText(listen: settings.listen?.description, textfile: settings.textfile))
        print(String(decoding: data, as: UTF8.self))
    }

    func resolveConfigPath() throws -> String {
        if let config { return config }
        let (found, candidates) = HostPaths.defaultConfig()
        if let found { return found }
        throw ValidationError("no config file: pass --config FILE (looked for \(candidates.joined(separator: ", ")))")
    }
}

/// `--print-metrics-settings`' answer; vigilctl decodes the same keys.
private struct MetricsSettingsText: Encodable {
    var listen: String?
    var textfile: String?
}
