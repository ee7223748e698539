import CTimer
import Foundation
import Glibc
import VigilKit

/// Delivers the given signals as values instead of running handlers: they
/// are blocked in every thread (``blockForStreams(_:)``, first thing in
/// main) and read from a signalfd watched on the host's ``EventLoop``, so
/// no thread waits for them and nothing polls. Keep it alive as long as the
/// signals are wanted: the watch and its descriptor go with it (the signals
/// stay blocked, and wait pending until another stream reads them).
final class SignalStream: Sendable {
    /// Each signal as it arrives.
    let stream: AsyncStream<Int32>
    private let watch: EventLoop.Watch

    /// Every signal a stream is made for, blocked once before any thread
    /// exists. A signal blocked in every thread waits in the kernel for the
    /// signalfd; one thread that does not block it would take it instead,
    /// with its default action. Children start with an empty mask
    /// (`vigil_spawn` sets POSIX_SPAWN_SETSIGMASK and SETSIGDEF).
    static func blockForStreams(_ signals: [Int32]) {
        let failed = signals.withUnsafeBufferPointer { vigil_block_signals($0.baseAddress, Int32($0.count)) }
        if failed != 0 {
            // pthread_sigmask fails only for an invalid signal number.
            fatalError("cannot block signals \(signals): \(String(cString: strerror(failed)))")
        }
    }

    /// `signals` must have been blocked by ``blockForStreams(_:)``. Throws
    /// when the signalfd cannot be made or watched (out of descriptors or
    /// memory): a host that could not hear SIGTERM must not start.
    init(_ signals: [Int32]) throws(EventLoopError) {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        let fd = signals.withUnsafeBufferPointer { vigil_signalfd($0.baseAddress, Int32($0.count)) }
        guard fd >= 0 else { throw EventLoopError(operation: "signalfd(\(signals))", code: errno) }
        do {
            watch = try EventLoop.watch(fd, for: .readable) { _ in
                // On the loop: the fd is non-blocking; a few records at most
                // are pending (standard signals do not queue), and a bound
                // keeps a signal storm from holding the loop.
                for _ in 0..<16 {
                    let signal = vigil_signalfd_read(fd)
                    guard signal > 0 else { return }
                    continuation.yield(signal)
                }
            } released: {
                continuation.finish()
                close(fd)
            }
        } catch {
            close(fd)
            throw error
        }
    }

    deinit { watch.cancel() }
}

extension AsyncStream<Int32> {
    /// The next signal; nil when the waiting task is cancelled.
    func next() async -> Int32? {
        var iterator = makeAsyncIterator()
        return await iterator.next()
    }
}
