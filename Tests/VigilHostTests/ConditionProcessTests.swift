import Foundation
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// `process = "<name>"` from the kernel's proc connector (needs
/// CAP_NET_ADMIN, which the test runner has as root).
@Suite struct ConditionProcessTests {
    @Test func strategyRunsWhileAProcessOfThatNameRuns() async throws {
        let dir = try ConditionTempDir()
        // A copy of sleep under a name no other process has: comm is the
        // executable's file name.
        let name = "vsl" + String(UUID().uuidString.prefix(8)).lowercased()
        let program = dir.path + "/" + name
        try FileManager.default.copyItem(atPath: "/bin/sleep", toPath: program)
        let host = try GatedSupervisor()
        let status = await host.start("player-follower", StrategyConditions(tables: [[.process(name)]]))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "process = \"\(name)\"")

        let pid = try spawnQuietly(program, ["600"], environment: [:])
        do {
            try await status.next(.running)
            kill(pid, SIGKILL)
            var exitStatus: Int32 = 0
            _ = waitpid(pid, &exitStatus, 0)
            try await status.next(.waiting)
        } catch {
            kill(pid, SIGKILL)
            var exitStatus: Int32 = 0
            _ = waitpid(pid, &exitStatus, 0)
            await host.stop()
            throw error
        }
        await host.stop()
    }
}
