import Dispatch
import Foundation

/// Delivers the given signals as values instead of running handlers: each
/// signal is ignored for default handling and watched by a dispatch source
/// (signalfd-like, no polling). Keep it alive as long as the signals are
/// wanted: the sources go with it (the signals stay ignored).
final class SignalStream {
    /// Each signal as it arrives.
    let stream: AsyncStream<Int32>
    private let sources: [any DispatchSourceSignal]

    init(_ signals: [Int32]) {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        // A private serial queue: dispatch's global (non-overcommit) queues
        // would start its 1 Hz worker monitor.
        let queue = DispatchQueue(label: "vigild.signals")
        self.sources = signals.map { sig in
            Foundation.signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            return source
        }
    }
}

extension AsyncStream<Int32> {
    /// The next signal; nil when the waiting task is cancelled.
    func next() async -> Int32? {
        var iterator = makeAsyncIterator()
        return await iterator.next()
    }
}
