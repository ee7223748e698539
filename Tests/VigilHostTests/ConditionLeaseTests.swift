import Foundation
import Testing
import VigilHost
import VigilKit

/// `lease_active`: a strategy composed on another strategy's lease.
@Suite struct ConditionLeaseTests {
    /// "Keep my S/PDIF receiver awake only while the music player holds a
    /// lease": silent-audio with lease_active = "player" plays while a
    /// background-task named "player" holds its lease (while its command
    /// runs), as `pactl list sink-inputs` shows.
    @Test func silentAudioPlaysWhileThePlayerHoldsItsLease() async throws {
        let pulse = try await PulseServer()
        let dir = try ConditionTempDir()
        // The player's command is `cat FIFO`: it ends when the test opens
        // and closes the FIFO for writing, which releases the player's lease.
        let fifo = dir.path + "/play"
        #expect(mkfifo(fifo, 0o600) == 0)
        let host = try GatedSupervisor(realTime: true)
        let audio = try SilentAudioPlugin.make(["server": .string(pulse.address), "latency": .string("200ms")])
        let player = try PeriodicWakePlugin.loader.loadKind("background-task").get()
            .makeStrategy(ConfigReader(strategyName: "player", keyPath: "strategy[1]", values: ["command": .array([.string("/bin/cat"), .string(fifo)])]))

        // The player's `cat` ends with its strategy: stop the host even when
        // an expectation throws.
        do {
            let status = await host.start("spdif", StrategyConditions(tables: [[.leaseActive(.strategy("player"))]]), strategy: audio)
            let waiting = try await status.next(.waiting)
            #expect(waiting.waitingFor == "lease_active = \"player\"")
            #expect(!pulse.sinkInputs.contains("Vigil spdif"))

            await host.supervisor.start([SupervisedStrategy(name: "player", kind: "background-task", strategy: player)])
            try await status.next(.running)
            do {
                try await eventually("the silent stream is listed by pactl") { pulse.sinkInputs.contains("Vigil spdif") }
            } catch {
                Issue.record("\(await host.supervisor.statuses) \(host.logs.entries)")
                throw error
            }

            // The player's command ends: its lease goes, and so does the stream.
            let writer = open(fifo, O_WRONLY | O_CLOEXEC)
            #expect(writer >= 0)
            close(writer)
            try await status.next(.waiting)
            try await eventually("the silent stream is gone from pactl") { !pulse.sinkInputs.contains("Vigil spdif") }
            #expect(await host.registry.active.isEmpty)
        } catch {
            await host.stop()
            throw error
        }
        await host.stop()
    }

    /// A D-Bus client's lease by task name (`client:<task>`), through the registry.
    @Test func clientSelectorMatchesOnlyClientLeasesOfThatTask() async throws {
        let host = try GatedSupervisor()
        let status = await host.start("follower", StrategyConditions(tables: [[.leaseActive(.client("render"))]]))
        try await status.next(.waiting)
        let other = try await host.registry.acquire(strategy: "client", LeaseRequest(holds: "x", reason: "x"),
                                                    client: ClientIdentity(owner: ":1.9", uid: 0, pid: 1, name: "other"))
        let id = try await host.registry.acquire(strategy: "client", LeaseRequest(holds: "x", reason: "x"),
                                                 client: ClientIdentity(owner: ":1.9", uid: 0, pid: 1, name: "render"))
        try await status.next(.running)
        await host.registry.release(id, detail: "done")
        try await status.next(.waiting)
        await host.registry.release(other, detail: "done")
        await host.stop()
    }
}
