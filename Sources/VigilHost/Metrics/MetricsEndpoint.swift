import ServiceLifecycle
import VigilKit

/// `[metrics] listen` as a service: the listener is bound before the group
/// starts (so a taken port fails the start cleanly), and ``run()`` accepts
/// scrapes from its start until the group shuts it down.
public struct MetricsEndpoint: Service {
    let listener: MetricsListener
    let exposition: @Sendable () async -> [UInt8]

    public func run() async {
        listener.start(exposition)
        try? await gracefulShutdown()
        listener.stop()
    }
}
