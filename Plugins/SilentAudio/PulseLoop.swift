import CPulse
import VigilKit
#if canImport(Glibc)
import Glibc
#endif

/// A plain `pa_mainloop` running on a thread of its own, named
/// ``threadName``, with a way for other threads to run code on it.
///
/// libpulse's `pa_threaded_mainloop` locks, unlocks and signals a mutex
/// around every poll of its loop so that other threads may call into
/// libpulse. This loop runs `pa_mainloop_run` unwrapped, as `pacat` does:
/// other threads never touch libpulse objects; they hand closures to
/// ``sync(_:)``, which queues them and writes to an eventfd the loop polls.
/// While the stream plays and nobody calls in, a wakeup costs exactly what
/// libpulse's own work costs.
final class PulseLoop: @unchecked Sendable {
    // Invariant: `mainloop` and `api` are used only on the loop thread, and by
    // `deinit` after that thread has finished. `thread` is written once in
    // `init`, before anything reads it. The rest is in `state`.

    /// The loop thread's name (what `/proc/<pid>/task/<tid>/comm` shows).
    static let threadName = "vigil-audio"

    /// libpulse's view of the loop, for `pa_context_new`. Loop thread only.
    let api: UnsafeMutablePointer<pa_mainloop_api>
    private let mainloop: OpaquePointer
    /// Written by ``sync(_:)`` (any thread), read by the loop when it wakes.
    private let wakeFD: Int32
    private struct State {
        var queue: [QueuedCall] = []
        var running = true
        var joined = false
    }
    private let state = Lock(State())
    private var thread = pthread_t()

    init() throws(SilentAudioError) {
        guard let loop = pa_mainloop_new() else { throw .pulse("pa_mainloop_new failed") }
        guard let api = pa_mainloop_get_api(loop) else {
            pa_mainloop_free(loop)
            throw .pulse("pa_mainloop_get_api failed")
        }
        let fd = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard fd >= 0 else {
            pa_mainloop_free(loop)
            throw .pulse("cannot create the main loop's eventfd: \(String(cString: strerror(errno)))")
        }
        mainloop = loop
        self.api = api
        wakeFD = fd
        // Registered before the thread starts, so no other thread is on the loop yet.
        guard api.pointee.io_new(api, fd, PA_IO_EVENT_INPUT, wakeCallback, Unmanaged.passUnretained(self).toOpaque()) != nil else {
            throw .pulse("cannot watch the main loop's eventfd")
        }
        // The thread holds a reference until it ends, so the loop outlives it.
        let started = pthread_create(&thread, nil, loopThreadMain, Unmanaged.passRetained(self).toOpaque())
        guard started == 0 else {
            Unmanaged.passUnretained(self).release()
            state.withLock { $0.running = false }
            throw .pulse("cannot start the audio thread: \(String(cString: strerror(started)))")
        }
    }

    deinit {
        // Only reached once the thread has ended (it holds a reference).
        pa_mainloop_free(mainloop)
        close(wakeFD)
    }

    private var isLoopThread: Bool { pthread_equal(pthread_self(), thread) != 0 }

    /// Runs `body` on the loop thread and returns its result; the calling
    /// thread waits. On the loop thread itself (inside a libpulse callback),
    /// `body` runs at once. Once the loop has stopped, `body` runs on the
    /// calling thread, serialised with other callers.
    func sync<T, E: Error>(_ body: @escaping () throws(E) -> T) throws(E) -> T {
        if isLoopThread { return try body() }
        let outcome = SyncOutcome<T, E>()
        // Heap-allocated: both threads need its one stable address.
        let done = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        sem_init(done, 0, 0)
        defer {
            sem_destroy(done)
            done.deallocate()
        }
        let call = {
            do throws(E) { outcome.result = .success(try body()) } catch { outcome.result = .failure(error) }
        }
        let queued = state.withLock { state -> Bool in
            if state.running {
                state.queue.append(QueuedCall { call(); sem_post(done) })
                return true
            }
            call()
            return false
        }
        if queued {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, MemoryLayout<UInt64>.size)
            while sem_wait(done) != 0 && errno == EINTR {}
        }
        // Proven: `call` ran, on the loop before it posted `done`, or inline.
        return try outcome.result!.get()
    }

    /// Stops the loop after the calls queued so far and waits for its thread
    /// to end. Idempotent; must not be called on the loop thread.
    func stop() {
        sync { [mainloop] in pa_mainloop_quit(mainloop, 0) }
        let onLoopThread = isLoopThread
        let join = state.withLock { state in
            defer { state.joined = true }
            return !state.joined && !onLoopThread
        }
        if join { pthread_join(thread, nil) }
    }

    /// The loop thread's body.
    fileprivate func run() {
        var all = sigset_t()
        sigfillset(&all)
        // Signals belong to the host's threads, not to the audio thread.
        pthread_sigmask(SIG_BLOCK, &all, nil)
        _ = vigil_pulse_name_this_thread(Self.threadName)
        var status: Int32 = 0
        _ = pa_mainloop_run(mainloop, &status)
        // Callers that queued after the quit are served here, then inline.
        let late = state.withLock { state in
            state.running = false
            defer { state.queue.removeAll() }
            return state.queue
        }
        for call in late { call.run() }
    }

    /// The eventfd became readable: run what other threads queued.
    fileprivate func drain() {
        var count: UInt64 = 0
        _ = read(wakeFD, &count, MemoryLayout<UInt64>.size)
        let calls = state.withLock { state in
            defer { state.queue.removeAll() }
            return state.queue
        }
        for call in calls { call.run() }
    }
}

private let loopThreadMain: @convention(c) (UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? = { arg in
    guard let arg else { return nil }
    let loop = Unmanaged<PulseLoop>.fromOpaque(arg).takeRetainedValue()
    loop.run()
    return nil
}

private let wakeCallback: pa_io_event_cb_t = { _, _, _, _, userdata in
    guard let userdata else { return }
    Unmanaged<PulseLoop>.fromOpaque(userdata).takeUnretainedValue().drain()
}

/// A caller's closure queued by ``PulseLoop/sync(_:)`` for the loop thread.
private struct QueuedCall: @unchecked Sendable {
    // Invariant: run exactly once, on the loop thread, while the thread that
    // queued it waits in `sync` for it to finish: what it captures is used
    // by one thread at a time.
    let run: () -> Void
}

/// The result of one ``PulseLoop/sync(_:)`` call, written on the loop thread.
private final class SyncOutcome<T, E: Error>: @unchecked Sendable {
    // Invariant: written once on the loop thread before it posts the caller's
    // semaphore, read by the caller only after waiting on it.
    var result: Result<T, E>?
}
