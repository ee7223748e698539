import CPulse
#if canImport(Glibc)
import Glibc
#endif

/// What libpulse tells the strategy, in order, from the loop thread.
enum PulseEvent: Sendable {
    case contextReady
    /// The connection could not be made or was lost (server gone, killed).
    case contextFailed(String)
    /// Stream events carry the number ``PulseConnection/openStream(_:renderer:)``
    /// returned, so that a late event of a closed stream is told apart.
    case streamReady(stream: Int)
    /// The stream failed or was killed (`pactl kill-sink-input`, sink removed).
    case streamFailed(stream: Int, String)
    case streamMoved(stream: Int, sink: UInt32, name: String)
    /// The watched sink changed; its current description.
    case sinkChanged(SinkInfo)
    /// A sink appeared (a module loaded, a device plugged in).
    case sinkAdded(UInt32)
    case sinkRemoved(UInt32)
    /// The server's settings changed, such as its default sink.
    case serverChanged
    case underflow
}

/// The parts of `pa_sink_info` the strategy uses.
struct SinkInfo: Sendable, Hashable {
    var index: UInt32
    var name: String
    var description: String
    /// "RUNNING", "IDLE", "SUSPENDED" (or "INVALID").
    var state: String
    var format: String
    var rate: Int
    var channels: Int
}

/// The parts of `pa_server_info` the strategy uses.
struct ServerInfo: Sendable, Hashable {
    var name: String
    var version: String
    var defaultSink: String?
}

/// How the stream is opened.
struct StreamSpec: Sendable {
    var name: String
    var sink: String?
    var format: SampleFormat
    var rate: Int
    var channels: Int
    var latency: Duration
    /// Refuse to be moved to another sink (the user named this one).
    var dontMove: Bool
    /// Start corked (paused), for periodic play.
    var startCorked: Bool
}

/// One connection to a PulseAudio (or PipeWire-pulse) server through
/// libpulse's asynchronous API on a plain `pa_mainloop` running on its own
/// thread (``PulseLoop``): neither libdispatch nor Swift's executors are
/// involved while the stream plays, and connection and stream state changes
/// arrive as ``PulseEvent``s instead of being polled.
///
/// Used once: connect, open a stream (and, after its sink went and came
/// back, another), ``close()``. A lost connection is replaced by a new
/// `PulseConnection`.
final class PulseConnection: @unchecked Sendable {
    // Invariant: every pa_* object and every `var` below is touched only on
    // the loop's thread: inside libpulse callbacks, or in closures other
    // threads run there through `onLoop` (`loop.sync`). `loop` is immutable
    // and thread-safe.
    private let loop: PulseLoop
    private var context: OpaquePointer?
    private var stream: OpaquePointer?
    /// Counts the streams opened, to tag their events.
    private var streamNumber = 0
    private var renderer: SignalRenderer?
    private var pendingReplies: [ObjectIdentifier: any PendingReply] = [:]
    private var watchedSink: UInt32?
    /// The last state reported for the watched sink, so that repeated
    /// CHANGE events (volume, latency, ...) with the same state are dropped.
    private var reportedSinkState: String?
    private var closed = false
    /// Underruns of the current stream.
    private var underflowCount: UInt64 = 0

    let events: AsyncStream<PulseEvent>
    private let continuation: AsyncStream<PulseEvent>.Continuation

    init() throws(SilentAudioError) {
        loop = try PulseLoop()
        (events, continuation) = AsyncStream.makeStream(of: PulseEvent.self)
    }

    deinit {
        close()
    }

    private var userdata: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    fileprivate static func from(_ p: UnsafeMutableRawPointer?) -> PulseConnection? {
        p.map { Unmanaged<PulseConnection>.fromOpaque($0).takeUnretainedValue() }
    }

    /// Runs `body` on the loop thread, where libpulse may be used.
    private func onLoop<T, E: Error>(_ body: @escaping () throws(E) -> T) throws(E) -> T {
        try loop.sync(body)
    }

    fileprivate func emit(_ event: PulseEvent) { continuation.yield(event) }

    // MARK: connection

    /// Starts connecting; `.contextReady` or `.contextFailed` follows.
    /// `server` is a libpulse server string (`unix:/run/user/1000/pulse/native`);
    /// nil uses libpulse's default ($PULSE_SERVER, then the user's runtime dir).
    func connect(server: String?, applicationName: String) throws(SilentAudioError) {
        try onLoop { [self] () throws(SilentAudioError) in
            guard let ctx = pa_context_new(loop.api, applicationName)
            else { throw .pulse("pa_context_new failed") }
            context = ctx
            pa_context_set_state_callback(ctx, contextStateCallback, userdata)
            // Never spawn a server: a missing server is an error to report.
            if pa_context_connect(ctx, server, PA_CONTEXT_NOAUTOSPAWN, nil) < 0 {
                throw .noServer(server: server, reason: Self.errorText(pa_context_errno(ctx)))
            }
        }
    }

    fileprivate func contextStateChanged() {
        guard let ctx = context else { return }
        let state = pa_context_get_state(ctx)
        if state == PA_CONTEXT_READY {
            emit(.contextReady)
        } else if state == PA_CONTEXT_FAILED || state == PA_CONTEXT_TERMINATED {
            failPendingReplies()
            emit(.contextFailed(Self.errorText(pa_context_errno(ctx))))
        }
    }

    /// The server's socket path or address, once connected.
    var serverAddress: String? {
        onLoop { [self] in context.flatMap { pa_context_get_server($0) }.map { String(cString: $0) } }
    }

    // MARK: queries

    func serverInfo() async -> ServerInfo? {
        let infos: [ServerInfo] = await request { ctx, box in pa_context_get_server_info(ctx, serverInfoCallback, box) }
        return infos.first
    }

    func sinks() async -> [SinkInfo] {
        await request { ctx, box in pa_context_get_sink_info_list(ctx, sinkInfoCallback, box) }
    }

    /// Sends one introspection request and collects its replies. If the
    /// connection fails first, the answer is empty.
    private func request<T: Sendable>(_ send: @escaping (OpaquePointer, UnsafeMutableRawPointer) -> OpaquePointer?) async -> [T] {
        await withCheckedContinuation { (c: CheckedContinuation<[T], Never>) in
            let reply = Reply<T>(c, owner: self)
            let sent: Bool = onLoop { [self] in
                guard let ctx = context, !closed, pa_context_get_state(ctx) == PA_CONTEXT_READY else { return false }
                guard let op = send(ctx, Unmanaged.passUnretained(reply).toOpaque()) else { return false }
                pa_operation_unref(op)
                pendingReplies[ObjectIdentifier(reply)] = reply
                return true
            }
            if !sent { reply.finish() }
        }
    }

    /// Called by a reply's last callback: it is no longer pending.
    fileprivate func forget(_ reply: AnyObject) {
        pendingReplies[ObjectIdentifier(reply)] = nil
    }

    private func failPendingReplies() {
        let replies = pendingReplies.values
        pendingReplies.removeAll()
        for r in replies { r.finish() }
    }

    // MARK: subscriptions

    /// Subscribes to the server's sink and server events: sinks that appear
    /// (`.sinkAdded`) or go (`.sinkRemoved`), changes of the watched sink
    /// (`.sinkChanged`) and of the server, such as its default sink
    /// (`.serverChanged`). Call it before querying the sinks: the server
    /// handles a connection's requests in order, so nothing that happens
    /// after the query's answer is missed.
    func subscribe() {
        onLoop { [self] in
            guard let ctx = context else { return }
            pa_context_set_subscribe_callback(ctx, subscribeCallback, userdata)
            let mask = PA_SUBSCRIPTION_MASK_SINK.rawValue | PA_SUBSCRIPTION_MASK_SERVER.rawValue
            if let op = pa_context_subscribe(ctx, pa_subscription_mask_t(rawValue: mask), nil, nil) { pa_operation_unref(op) }
        }
    }

    /// Reports changes of sink `index`'s state as `.sinkChanged`.
    func watchSink(_ index: UInt32) {
        onLoop { [self] in
            watchedSink = index
            reportedSinkState = nil
            guard let ctx = context else { return }
            // The state may have changed before the subscription: report it now.
            if let op = pa_context_get_sink_info_by_index(ctx, index, changedSinkCallback, userdata) { pa_operation_unref(op) }
        }
    }

    /// Reports the watched sink's description when its state differs from
    /// the one reported last: the strategy shows only the state.
    fileprivate func sinkInfoArrived(_ info: UnsafePointer<pa_sink_info>) {
        let sink = SinkInfo(info)
        guard sink.index == watchedSink, sink.state != reportedSinkState else { return }
        reportedSinkState = sink.state
        emit(.sinkChanged(sink))
    }

    fileprivate func subscriptionEvent(_ type: UInt32, index: UInt32) {
        guard let ctx = context else { return }
        let facility = type & PA_SUBSCRIPTION_EVENT_FACILITY_MASK.rawValue
        let kind = type & PA_SUBSCRIPTION_EVENT_TYPE_MASK.rawValue
        if facility == PA_SUBSCRIPTION_EVENT_SERVER.rawValue {
            emit(.serverChanged)
        } else if facility == PA_SUBSCRIPTION_EVENT_SINK.rawValue {
            if kind == PA_SUBSCRIPTION_EVENT_NEW.rawValue {
                emit(.sinkAdded(index))
            } else if kind == PA_SUBSCRIPTION_EVENT_REMOVE.rawValue {
                emit(.sinkRemoved(index))
            } else if index == watchedSink, let op = pa_context_get_sink_info_by_index(ctx, index, changedSinkCallback, userdata) {
                pa_operation_unref(op)
            }
        }
    }

    // MARK: stream

    /// Opens the playback stream; `.streamReady` or `.streamFailed` follows,
    /// tagged with the number returned. The write callback fills the buffer
    /// from `renderer`. A stream opened before is closed first.
    func openStream(_ spec: StreamSpec, renderer: SignalRenderer) throws(SilentAudioError) -> Int {
        try onLoop { [self] () throws(SilentAudioError) -> Int in
            guard let ctx = context else { throw .pulse("not connected") }
            closeStreamOnLoop()
            streamNumber += 1
            var sampleSpec = pa_sample_spec(format: spec.format.pulseFormat, rate: UInt32(spec.rate), channels: UInt8(spec.channels))
            guard let s = pa_stream_new(ctx, spec.name, &sampleSpec, nil) else {
                throw .pulse("cannot create the stream: \(Self.errorText(pa_context_errno(ctx)))")
            }
            stream = s
            self.renderer = renderer
            underflowCount = 0
            pa_stream_set_state_callback(s, streamStateCallback, userdata)
            pa_stream_set_write_callback(s, streamWriteCallback, userdata)
            pa_stream_set_underflow_callback(s, streamUnderflowCallback, userdata)
            pa_stream_set_moved_callback(s, streamMovedCallback, userdata)
            // A large target length and a request size of half of it: the
            // server asks for data about twice per `latency`, and the client
            // thread sleeps in between.
            let frameBytes = spec.format.bytesPerSample * spec.channels
            let latencyFrames = max(1, Int(spec.latency.seconds * Double(spec.rate)))
            let tlength = UInt32(clamping: latencyFrames * frameBytes)
            var attr = pa_buffer_attr(
                maxlength: UInt32.max, tlength: tlength, prebuf: UInt32.max,
                minreq: UInt32(clamping: max(frameBytes, Int(tlength) / 2 / frameBytes * frameBytes)), fragsize: UInt32.max)
            var flags = PA_STREAM_ADJUST_LATENCY.rawValue
            if spec.dontMove { flags |= PA_STREAM_DONT_MOVE.rawValue }
            if spec.startCorked { flags |= PA_STREAM_START_CORKED.rawValue }
            if pa_stream_connect_playback(s, spec.sink, &attr, pa_stream_flags_t(rawValue: flags), nil, nil) < 0 {
                throw .streamFailed(sink: spec.sink ?? "default", reason: Self.errorText(pa_context_errno(ctx)))
            }
            return streamNumber
        }
    }

    /// Closes the stream, if one is open, and keeps the connection: a new
    /// stream may follow. Its later events are not reported.
    func closeStream() {
        onLoop { [self] in closeStreamOnLoop() }
    }

    private func closeStreamOnLoop() {
        guard let s = stream else { return }
        pa_stream_set_state_callback(s, nil, nil)
        pa_stream_set_write_callback(s, nil, nil)
        pa_stream_set_underflow_callback(s, nil, nil)
        pa_stream_set_moved_callback(s, nil, nil)
        pa_stream_disconnect(s)
        pa_stream_unref(s)
        stream = nil
        renderer = nil
        watchedSink = nil
    }

    /// Asks the server to move the stream to sink `name`; `.streamMoved`
    /// follows when it did.
    func moveStream(toSink name: String) {
        onLoop { [self] in
            guard let ctx = context, let s = stream, pa_stream_get_state(s) == PA_STREAM_READY else { return }
            if let op = pa_context_move_sink_input_by_name(ctx, pa_stream_get_index(s), name, nil, nil) { pa_operation_unref(op) }
        }
    }

    fileprivate func streamStateChanged() {
        guard let s = stream else { return }
        let state = pa_stream_get_state(s)
        if state == PA_STREAM_READY {
            emit(.streamReady(stream: streamNumber))
        } else if state == PA_STREAM_FAILED || state == PA_STREAM_TERMINATED {
            let reason = context.map { Self.errorText(pa_context_errno($0)) } ?? "terminated"
            emit(.streamFailed(stream: streamNumber, state == PA_STREAM_TERMINATED ? "terminated" : reason))
        }
    }

    fileprivate func write(_ s: OpaquePointer, _ requested: Int) {
        guard let frameBytes = renderer?.bytesPerFrame else { return }
        var remaining = requested - requested % frameBytes
        while remaining > 0 {
            var data: UnsafeMutableRawPointer?
            var size = remaining
            // Zero-copy: libpulse hands out its shared-memory block.
            guard pa_stream_begin_write(s, &data, &size) == 0, let data else { return }
            size -= size % frameBytes
            guard size > 0 else { pa_stream_cancel_write(s); return }
            // In place: no copy of the renderer (and its buffers' references) per callback.
            renderer?.render(into: data, frames: size / frameBytes)
            guard pa_stream_write(s, data, size, nil, 0, PA_SEEK_RELATIVE) == 0 else { return }
            remaining -= size
        }
    }

    fileprivate func underflowed() {
        underflowCount += 1
        emit(.underflow)
    }

    fileprivate func moved() {
        guard let s = stream else { return }
        let index = pa_stream_get_device_index(s)
        let name = pa_stream_get_device_name(s).map { String(cString: $0) } ?? "?"
        watchedSink = index
        reportedSinkState = nil
        emit(.streamMoved(stream: streamNumber, sink: index, name: name))
    }

    var underruns: UInt64 { onLoop { [self] in underflowCount } }

    /// The sink the stream plays on, once ready.
    var streamSink: (index: UInt32, name: String)? {
        onLoop { [self] in
            guard let s = stream, pa_stream_get_state(s) == PA_STREAM_READY else { return nil }
            return (pa_stream_get_device_index(s), pa_stream_get_device_name(s).map { String(cString: $0) } ?? "?")
        }
    }

    /// The buffer the server granted: target length and request size.
    var bufferAttributes: (tlength: Int, minreq: Int)? {
        onLoop { [self] in
            guard let s = stream, let attr = pa_stream_get_buffer_attr(s) else { return nil }
            return (Int(attr.pointee.tlength), Int(attr.pointee.minreq))
        }
    }

    /// Pauses or resumes playback. Resuming drops what was buffered and
    /// starts the next burst from its fade-in.
    func setPlaying(_ playing: Bool) {
        onLoop { [self] in
            guard let s = stream else { return }
            if playing {
                if let op = pa_stream_flush(s, nil, nil) { pa_operation_unref(op) }
                renderer?.restartBurst()
                if let op = pa_stream_cork(s, 0, nil, nil) { pa_operation_unref(op) }
            } else if let op = pa_stream_cork(s, 1, nil, nil) {
                pa_operation_unref(op)
            }
        }
    }

    /// Disconnects the stream and the context and stops the loop thread.
    func close() {
        let wasOpen: Bool = onLoop { [self] in
            guard !closed else { return false }
            closed = true
            closeStreamOnLoop()
            if let ctx = context {
                pa_context_set_state_callback(ctx, nil, nil)
                pa_context_set_subscribe_callback(ctx, nil, nil)
                pa_context_disconnect(ctx)
                pa_context_unref(ctx)
                context = nil
            }
            failPendingReplies()
            return true
        }
        guard wasOpen else { return }
        continuation.finish()
        loop.stop()
    }

    static func errorText(_ code: Int32) -> String {
        pa_strerror(code).map { String(cString: $0) } ?? "error \(code)"
    }
}

// MARK: replies

private protocol PendingReply: AnyObject {
    func finish()
}

/// Collects the items of one introspection reply.
private final class Reply<T: Sendable>: PendingReply, @unchecked Sendable {
    // Invariant: touched only on libpulse's main-loop thread or under its
    // lock, and `finish` resumes the continuation at most once.
    var items: [T] = []
    private var continuation: CheckedContinuation<[T], Never>?
    /// Keeps the reply listed while it waits (the C side holds it unretained).
    weak var owner: PulseConnection?

    init(_ c: CheckedContinuation<[T], Never>, owner: PulseConnection) {
        continuation = c
        self.owner = owner
    }

    func finish() {
        continuation?.resume(returning: items)
        continuation = nil
    }
}

// MARK: C callbacks (the loop thread)

private let contextStateCallback: pa_context_notify_cb_t = { _, userdata in
    PulseConnection.from(userdata)?.contextStateChanged()
}

private let streamStateCallback: pa_stream_notify_cb_t = { _, userdata in
    PulseConnection.from(userdata)?.streamStateChanged()
}

private let streamWriteCallback: pa_stream_request_cb_t = { stream, nbytes, userdata in
    guard let stream else { return }
    PulseConnection.from(userdata)?.write(stream, nbytes)
}

private let streamUnderflowCallback: pa_stream_notify_cb_t = { _, userdata in
    PulseConnection.from(userdata)?.underflowed()
}

private let streamMovedCallback: pa_stream_notify_cb_t = { _, userdata in
    PulseConnection.from(userdata)?.moved()
}

private let subscribeCallback: pa_context_subscribe_cb_t = { _, type, index, userdata in
    PulseConnection.from(userdata)?.subscriptionEvent(type.rawValue, index: index)
}

private let serverInfoCallback: pa_server_info_cb_t = { _, info, userdata in
    // Replies are collected on the connection; `userdata` is the Reply.
    let item = info.map { i in
        ServerInfo(
            name: i.pointee.server_name.map { String(cString: $0) } ?? "?",
            version: i.pointee.server_version.map { String(cString: $0) } ?? "?",
            defaultSink: i.pointee.default_sink_name.map { String(cString: $0) })
    }
    serverReply(item, userdata)
}

private let sinkInfoCallback: pa_sink_info_cb_t = { _, info, eol, userdata in
    sinkReply(info.map(SinkInfo.init), eol: eol != 0, userdata)
}

private let changedSinkCallback: pa_sink_info_cb_t = { _, info, _, userdata in
    guard let info else { return }
    PulseConnection.from(userdata)?.sinkInfoArrived(info)
}

/// Replies do not know their connection; they finish themselves.
private func serverReply(_ item: ServerInfo?, _ p: UnsafeMutableRawPointer?) {
    guard let p else { return }
    let reply = Unmanaged<Reply<ServerInfo>>.fromOpaque(p).takeUnretainedValue()
    if let item { reply.items.append(item) }
    reply.finishFromCallback()
}

private func sinkReply(_ item: SinkInfo?, eol: Bool, _ p: UnsafeMutableRawPointer?) {
    guard let p else { return }
    let reply = Unmanaged<Reply<SinkInfo>>.fromOpaque(p).takeUnretainedValue()
    if let item { reply.items.append(item) }
    if eol { reply.finishFromCallback() }
}

extension Reply {
    /// Finishes from a libpulse callback (loop thread): no longer pending.
    func finishFromCallback() {
        owner?.forget(self)
        finish()
    }
}

extension SinkInfo {
    init(_ p: UnsafePointer<pa_sink_info>) {
        let i = p.pointee
        index = i.index
        name = i.name.map { String(cString: $0) } ?? "?"
        description = i.description.map { String(cString: $0) } ?? ""
        state = switch i.state {
        case PA_SINK_RUNNING: "RUNNING"
        case PA_SINK_IDLE: "IDLE"
        case PA_SINK_SUSPENDED: "SUSPENDED"
        default: "INVALID"
        }
        format = pa_sample_format_to_string(i.sample_spec.format).map { String(cString: $0) } ?? "?"
        rate = Int(i.sample_spec.rate)
        channels = Int(i.sample_spec.channels)
    }
}

extension SampleFormat {
    var pulseFormat: pa_sample_format_t {
        switch self {
        case .s16le: PA_SAMPLE_S16LE
        case .s32le: PA_SAMPLE_S32LE
        case .float32le: PA_SAMPLE_FLOAT32LE
        }
    }
}
