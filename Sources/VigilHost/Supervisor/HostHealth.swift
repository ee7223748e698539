import Glibc
import VigilKit

/// What is wrong with the host's own bookkeeping, if anything: the survival
/// store cannot be written (a full or failing disk), or log lines could not
/// be written (stderr full or closed). Shown as systemd's `STATUS=`, on the
/// Host object (`StoreWritable`, `DroppedLogLines`) and by `vigilctl status`.
public struct HostHealth: Sendable, Hashable {
    /// Non-nil while heartbeats and events cannot be written.
    public var storeUnwritable: SurvivalStore.Unwritable?
    /// Log lines dropped since start.
    public var droppedLogLines: Int

    public init(storeUnwritable: SurvivalStore.Unwritable? = nil, droppedLogLines: Int = 0) {
        self.storeUnwritable = storeUnwritable
        self.droppedLogLines = droppedLogLines
    }

    /// "survival store unwritable since 2026-11-25 14:02:11 UTC (3 writes
    /// lost)", "2 log lines dropped", joined by "; "; nil when all is well.
    public var summary: String? {
        var parts: [String] = []
        if let outage = storeUnwritable {
            let since = Self.utc(outage.lastWritten.wallMicros)
            parts.append("survival store unwritable since \(since) (\(outage.failedWrites) write\(outage.failedWrites == 1 ? "" : "s") lost)")
        }
        if droppedLogLines > 0 {
            parts.append("\(droppedLogLines) log line\(droppedLogLines == 1 ? "" : "s") dropped")
        }
        return parts.isEmpty ? nil : parts.joined(separator: "; ")
    }

    /// "2026-11-25 14:02:11 UTC".
    static func utc(_ wallMicros: Int64) -> String {
        var seconds = time_t(wallMicros / 1_000_000)
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return "\(wallMicros / 1_000_000) s after the epoch" }
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%d %H:%M:%S UTC", &parts)
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

extension HostRuntime {
    /// The host's health now.
    public func health() async -> HostHealth {
        HostHealth(storeUnwritable: await store.unwritableState, droppedLogLines: logging.droppedLines)
    }

    /// The health each time the survival store stops or starts being
    /// writable (dropped log lines are counted, not announced: announcing
    /// them would be one more line to drop). Ends when the consumer stops.
    public func healthChanges() -> AsyncStream<HostHealth> {
        let (stream, continuation) = AsyncStream.makeStream(of: HostHealth.self, bufferingPolicy: .bufferingNewest(8))
        let key = nextHealthSubscriber
        nextHealthSubscriber += 1
        healthSubscribers[key] = continuation
        continuation.onTermination = { [weak self] _ in
            // Unstructured task: not cancelled: one hop into the actor to forget the subscriber,
            // from a synchronous termination handler.
            Task { await self?.removeHealthSubscriber(key) }
        }
        return stream
    }

    private func removeHealthSubscriber(_ key: UInt64) { healthSubscribers[key] = nil }

    func publishHealth() async {
        let now = await health()
        for continuation in healthSubscribers.values { continuation.yield(now) }
    }
}
