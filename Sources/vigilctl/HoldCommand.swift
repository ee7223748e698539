import ArgumentParser
import Foundation
import VigilCommon
import VigilDBus
import VigilKit

/// `vigilctl hold -- CMD ARGS...`: runs a command under a client lease.
struct HoldCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hold",
        abstract: "Run a command under a background-task lease, renewed while it runs.",
        discussion: """
            Begins a client lease with vigild (org.vigil.Vigil1.Host.BeginBackgroundTask), runs \
            CMD with ARGS, renews the lease whenever a quarter of its budget is left, ends it \
            when CMD exits, and exits with CMD's status (128+N when a signal N ended it). While \
            the lease is held, vigild's power backend keeps the system from sleeping (a logind \
            inhibitor or a kernel wake lock), like systemd-inhibit, but with a budget: if \
            vigilctl stops renewing (it was frozen or killed), the lease lapses instead of \
            holding forever.

            The lease also ends if vigilctl dies: vigild sees its fd closed and its bus \
            connection gone. The command inherits stdin, stdout and stderr; Ctrl-C reaches the \
            command, and vigilctl reports how it ended.

            vigild's per-uid limits apply ([host] client_max_leases_per_uid, \
            client_max_budget_per_uid); a refused lease is reported and CMD is not run.

            If vigild ends the lease under the command (it stopped or restarted), vigilctl \
            notices at once (the lease fd's pipe closes), begins a new lease as soon as a vigild \
            answers again (retrying with backoff), and reports the time without one.

            Exit status: CMD's; 1 when no lease could be begun; 127 when CMD cannot be run; \
            75 when CMD succeeded but ran part of the time without a lease.

            Example: vigilctl hold --budget 10m --why "nightly backup" -- restic backup ~/
            """
    )

    @OptionGroup var busOptions: BusOptions

    @Option(help: "The lease's budget: how long it lasts without renewal (e.g. 90s, 10m, 1h).")
    var budget: String = "10m"

    @Option(help: "Why the system must stay up, shown in vigilctl leases and logind's inhibitor list.")
    var why: String?

    @Option(help: "The task's name (default: the command's file name).")
    var name: String?

    @Argument(parsing: .postTerminator, help: "The command and its arguments, after --.")
    var command: [String] = []

    func validate() throws {
        var words = command
        if words.first == "--" { words.removeFirst() }
        guard let program = words.first, !program.isEmpty else {
            throw ValidationError("give the command to run after --, e.g. vigilctl hold -- make -j4")
        }
        switch DurationSyntax.parse(budget) {
        case .success(let value) where value >= .seconds(1): break
        case .success: throw ValidationError("--budget must be at least 1s, found \"\(budget)\"")
        case .failure(let error): throw ValidationError("--budget: \(error)")
        }
    }

    func run() async throws {
        var argv = command
        if argv.first == "--" { argv.removeFirst() }
        guard case .success(let budgetValue) = DurationSyntax.parse(budget) else { throw ExitCode(1) }
        let budgetMicros = UInt64(budgetValue.components.seconds) * 1_000_000
            + UInt64(budgetValue.components.attoseconds / 1_000_000_000_000)
        let taskName = name ?? URL(fileURLWithPath: argv[0]).lastPathComponent
        let reason = why ?? "vigilctl hold: " + argv.joined(separator: " ")

        let client: VigilBusClient
        let lease: (path: String, fd: BusFileDescriptor)
        do {
            client = try await VigilBusClient.connect(busOptions)
            lease = try await client.beginBackgroundTask(name: taskName, reason: reason, budgetMicros: budgetMicros)
        } catch {
            FileHandle.standardError.write(Data("vigilctl hold: \(TerminalText.escaped("\(error)")); not running \(argv[0])\n".utf8))
            throw ExitCode(1)
        }
        // The lease fd must not leak into the command: it would keep the
        // lease's pipe open after vigilctl ended it.
        _ = fcntl(lease.fd.rawValue, F_SETFD, FD_CLOEXEC)

        // Renew when a quarter of the budget is left; begin a new lease
        // whenever vigild ends this one (a restart).
        let keeper = LeaseKeeper(
            options: busOptions, name: taskName, reason: reason, budgetMicros: budgetMicros,
            first: LeaseKeeper.Held(client: client, path: lease.path, fd: lease.fd))
        // Unstructured task: cancelled below, once the command has exited.
        let renewing = Task { await keeper.renewLoop(every: budgetValue * 3 / 4) }
        // Unstructured task: cancelled below, once the command has exited.
        let keeping = Task { await keeper.keepLoop() }
        // A suspend that breaks the lease (the lid, `systemctl suspend -i`)
        // is said on stderr: the command ran on, but the machine slept.
        let watcher = try? await VigilBusClient.connect(busOptions)
        let brokenSleeps = try? await watcher?.connection.signals(matching: DBusMatchRule(
            sender: VigilBusClient.busName, path: VigilBusClient.rootPath, interface: VigilBusClient.hostInterface,
            member: VigilAPI.Host.sleepBrokeLease.name))
        // Unstructured task: cancelled below, once the command has exited.
        let telling = Task {
            guard let brokenSleeps else { return }
            for await signal in brokenSleeps {
                guard let broken = try? SleepBrokeLeaseSignal(arguments: signal.body), await keeper.holds(broken.lease) else { continue }
                LeaseKeeper.say("the system slept \(LeaseKeeper.seconds(.microseconds(Int64(clamping: broken.sleptUsec)))) although lease \(broken.lease) held sleep (woken by \(broken.wakeCause)); the lease goes on")
            }
        }
        let status = await ChildProcess.run(argv)
        await keeper.requestStop()
        renewing.cancel()
        keeping.cancel()
        telling.cancel()
        await renewing.value
        await keeping.value
        await telling.value
        await watcher?.close()
        let gaps = await keeper.finish()
        if status.spawnError != nil {
            FileHandle.standardError.write(Data("vigilctl hold: cannot run \(argv[0]): \(status.spawnError ?? "")\n".utf8))
        }
        if gaps.count > 0 {
            let ending = gaps.endedWithoutLease ? "; it ended without one" : ""
            LeaseKeeper.say("\(argv[0]) ran \(LeaseKeeper.seconds(gaps.total)) without a lease (\(gaps.count) gap\(gaps.count == 1 ? "" : "s"))\(ending)")
            // The command's own failure comes first; a success is not one
            // when the system was free to sleep under it.
            throw ExitCode(status.exitCode != 0 ? status.exitCode : Self.leaseGapExit)
        }
        throw ExitCode(status.exitCode)
    }

    /// Exit status when the command succeeded but ran part of the time
    /// without a lease (vigild restarted or stopped under it): EX_TEMPFAIL.
    static let leaseGapExit: Int32 = 75
}

extension VigilBusClient {

    func beginBackgroundTask(name: String, reason: String, budgetMicros: UInt64) async throws -> (path: String, fd: BusFileDescriptor) {
        let task = try await mapped(VigilAPI.Host.beginBackgroundTask.name) {
            try await client.beginBackgroundTask(name: name, reason: reason, budgetMicros: budgetMicros)
        }
        return (task.path, task.fd)
    }

    func renewClientLease(_ path: String, budgetMicros: UInt64) async throws {
        try await mapped(VigilAPI.ClientLease.renew.name) { try await client.renewLease(at: path, budgetMicros: budgetMicros) }
    }

    func endClientLease(_ path: String) async throws {
        try await mapped(VigilAPI.ClientLease.end.name) { try await client.endLease(at: path) }
    }
}

/// Runs a command with vigilctl's stdin, stdout and stderr and waits for it.
enum ChildProcess {
    struct Outcome: Sendable {
        /// The exit status to pass on: the command's, 128+N for signal N, 127 if it never ran.
        var exitCode: Int32
        var spawnError: String?
    }

    static func run(_ argv: [String]) async -> Outcome {
        // Ctrl-C and Ctrl-\ go to the whole foreground process group: the
        // command handles them; vigilctl waits and reports how it ended.
        signal(SIGINT, SIG_IGN)
        signal(SIGQUIT, SIG_IGN)
        defer {
            signal(SIGINT, SIG_DFL)
            signal(SIGQUIT, SIG_DFL)
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The child gets the default dispositions back.
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGINT)
        sigaddset(&defaults, SIGQUIT)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))

        var pid: pid_t = 0
        let cArgs = argv.map { strdup($0) } + [nil]
        defer { for arg in cArgs { free(arg) } }
        let spawned = posix_spawnp(&pid, argv[0], nil, &attributes, cArgs, environ)
        guard spawned == 0 else {
            return Outcome(exitCode: 127, spawnError: String(cString: strerror(spawned)))
        }
        let child = pid
        let waited: Int32 = await withCheckedContinuation { continuation in
            let thread = Thread {
                var status: Int32 = 0
                while waitpid(child, &status, 0) < 0 && errno == EINTR {}
                continuation.resume(returning: status)
            }
            thread.start()
        }
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift cannot import as macros.
        let signalNumber = waited & 0x7f
        if signalNumber == 0 { return Outcome(exitCode: (waited >> 8) & 0xff) }
        return Outcome(exitCode: 128 + signalNumber)
    }
}
