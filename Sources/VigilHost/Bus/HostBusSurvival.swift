import Foundation
import VigilKit

extension RunRow {
    /// The `Survival` row of a run.
    init(_ run: RunSummary) {
        self.init()
        runId = run.runId
        startedAt = UInt64(clamping: run.startWall)
        endedAt = run.endReason == .running ? 0 : UInt64(clamping: run.endWall ?? run.lastHeartbeatWall)
        endReason = run.endReason.rawValue
        aliveUsec = UInt64(clamping: run.aliveMicros)
        awakeUsec = UInt64(clamping: run.awakeMicros)
        suspendedUsec = UInt64(clamping: run.suspendedMicros)
        stalls = UInt32(clamping: run.stalls)
        longestStallUsec = UInt64(clamping: run.longestStallMicros)
        heartbeats = UInt32(clamping: run.heartbeats)
    }
}
