import CVigilKitSanitizer
import Synchronization

/// A `Synchronization.Mutex` that ThreadSanitizer can see; use it for any
/// state shared between threads.
///
/// Why not Mutex itself: on Linux it waits on a futex inside the Swift
/// runtime, which TSan does not instrument, so TSan sees no order between
/// two critical sections and reports every value a Mutex guards as a race
/// (Scripts/sanitize found dozens, none real). This forwards to Mutex and
/// marks each critical section's start and end for TSan; without TSan the
/// marks are two calls that return at once.
///
/// Inlinable, so each caller gets it specialized for its `Value`: called
/// through VigilKit's library unspecialized, every critical section paid
/// for a generic call, the runtime's metadata lookups for `Mutex<Value>`
/// and dynamic exclusivity checks, several per lease on vigild's lease
/// path (docs/benchmarks.md, Begin+End against the C floor).
public struct Lock<Value: ~Copyable>: ~Copyable, Sendable {
    @usableFromInline let mutex: Mutex<Value>
    /// Names the lock to TSan: its address, fixed for the lock's life. (Not
    /// the guarded value's: taking that address is itself an access TSan
    /// checks, before the mark.)
    @usableFromInline let name: LockName

    @inlinable
    public init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
        name = LockName()
    }

    /// Runs `body` with the value while holding the lock.
    @inlinable
    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        let address = Unmanaged.passUnretained(name).toOpaque()
        return try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            vigil_tsan_acquire(address)
            defer { vigil_tsan_release(address) }
            return try body(&value)
        }
    }
}

/// An object whose address names one ``Lock`` to ThreadSanitizer.
@usableFromInline
final class LockName: Sendable {
    @usableFromInline init() {}
}
