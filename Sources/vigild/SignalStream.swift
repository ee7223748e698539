import Dispatch
import Foundation

/// Delivers the given signals as values instead of running handlers: each
/// signal is ignored for default handling and watched by a dispatch source
/// (signalfd-like, no polling).
final class SignalStream {
    private let stream: AsyncStream<Int32>
    private let sources: [any DispatchSourceSignal]

    init(_ signals: [Int32]) {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        self.sources = signals.map { sig in
            Foundation.signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            return source
        }
    }

    /// Waits for the next signal.
    func next() async -> Int32 {
        var iterator = stream.makeAsyncIterator()
        return await iterator.next() ?? SIGTERM
    }
}
