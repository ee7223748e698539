import Foundation
import Glibc
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost
@testable import VigilSurvival
import VigilKit

/// The host's own trouble (issue 12): a survival store that cannot be
/// written is shown on the Host object and announced to ``HostRuntime/healthChanges()``
/// (vigild sends it as systemd's STATUS=), and clears by itself once space
/// is back.
@Suite struct HostHealthTests {
    @Test func aFullStateDirIsShownOnTheBusAndClearsWhenSpaceIsBack() async throws {
        // A 1 MiB tmpfs for the state dir, mounted here (the suite runs as root).
        var template = Array("/tmp/vigil-health-XXXXXX".utf8CString)
        let mountPoint = String(cString: try #require(mkdtemp(&template)))
        defer { try? FileManager.default.removeItem(atPath: mountPoint) }
        let mounted = try await ProcessRunner.runDetached("/bin/mount", ["-t", "tmpfs", "-o", "size=1m", "vigil-health-test", mountPoint])
        try #require(mounted.status == 0, "mount: \(mounted.stderr)")
        defer { _ = umount2(mountPoint, Int32(MNT_DETACH)) }

        try await HostBusFixture.with(strategies: "", host: "survival_interval = \"1s\"", stateDir: mountPoint) { (f: HostBusFixture) async throws in
            let seen = WaitableLog<HostHealth>()
            let stream = await f.runtime.healthChanges()
            let watcher = Task { for await health in stream { seen.append(health) } }
            defer { watcher.cancel() }
            #expect(try await f.get(VigilAPI.rootPath, VigilAPI.hostInterface, "StoreWritable") == .bool(true))
            #expect(try await f.get(VigilAPI.rootPath, VigilAPI.hostInterface, "DroppedLogLines") == .uint64(0))

            let filler = mountPoint + "/filler"
            #expect(try fillFilesystem(filler) > 0)
            // Heartbeats until one needs a block the full filesystem lacks.
            var announced = false
            for _ in 0..<30 where !announced {
                await f.advance(1)
                announced = await seen.wait(timeout: .seconds(2)) { $0.contains { $0.storeUnwritable != nil } }
            }
            #expect(announced, "no heartbeat failed on the full filesystem")
            #expect(try await f.get(VigilAPI.rootPath, VigilAPI.hostInterface, "StoreWritable") == .bool(false))
            let summary = await f.runtime.health().summary ?? ""
            #expect(summary.hasPrefix("survival store unwritable since ") && summary.contains("lost)"), "\(summary)")

            // Space back: the next heartbeat is written and the trouble clears.
            #expect(unlink(filler) == 0)
            var cleared = false
            for _ in 0..<30 where !cleared {
                await f.advance(1)
                cleared = await seen.wait(timeout: .seconds(2)) { items in
                    guard let bad = items.firstIndex(where: { $0.storeUnwritable != nil }) else { return false }
                    return items[(bad + 1)...].contains { $0.storeUnwritable == nil }
                }
            }
            #expect(cleared, "the store did not become writable again")
            #expect(try await f.get(VigilAPI.rootPath, VigilAPI.hostInterface, "StoreWritable") == .bool(true))
            #expect(await f.runtime.health().summary == nil)
        }
    }

    @Test func theSummaryNamesEachTrouble() {
        #expect(HostHealth().summary == nil)
        #expect(HostHealth(droppedLogLines: 1).summary == "1 log line dropped")
        let outage = SurvivalStore.Unwritable(lastWritten: ClockReadings(wallMicros: 1_764_079_331_000_000, monotonicMicros: 0, boottimeMicros: 0),
                                              firstError: "disk full", failedWrites: 3)
        #expect(HostHealth(storeUnwritable: outage, droppedLogLines: 2).summary
                == "survival store unwritable since 2025-11-25 14:02:11 UTC (3 writes lost); 2 log lines dropped")
    }
}
