import Foundation
import Glibc
import VigilKit

/// Input from a person during a dark wake, read from the kernel's event
/// devices (`/dev/input/event*`, evdev): keys, pointer, touch, the lid
/// switch and the power button all arrive there, whatever the session or
/// desktop (there may be none). The devices are open only during a dark
/// wake, so a machine in use never wakes vigild per key press. Reading
/// them needs root or the `input` group; devices that cannot be opened are
/// skipped (the first such is logged at debug). Each open device is a
/// watch on the host's ``EventLoop``; no thread waits for them.
public final class InputActivityWatcher: InputActivity, Sendable {
    // Each watch owns its fd, which the loop closes when it releases the
    // cancelled watch; until then no other descriptor can take its number,
    // so `watches` may be keyed by fd.
    private struct State {
        var watches: [Int32: EventLoop.Watch] = [:]
        var seenText: String?
    }
    private let state = Lock(State())
    private let directory: String
    private let log: Logger?
    private let onSeen: (@Sendable (String) -> Void)?
    /// The most devices watched at once.
    static let maxDevices = 64

    /// `onSeen` is told the first thing a person did in each dark wake.
    public init(directory: String = "/dev/input", log: Logger? = nil, onSeen: (@Sendable (String) -> Void)? = nil) {
        self.directory = directory
        self.log = log
        self.onSeen = onSeen
    }

    deinit {
        // A watch left live would report input to a handler whose watcher is gone.
        closeAll()
    }

    public func begin() async {
        closeAll()
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
            .filter { $0.hasPrefix("event") }.sorted().prefix(Self.maxDevices)
        state.withLock { $0.seenText = nil }
        var refused: String?
        for name in names {
            let fd = open("\(directory)/\(name)", O_RDONLY | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else {
                if refused == nil { refused = "\(name): \(String(cString: strerror(errno)))" }
                continue
            }
            do {
                let watch = try EventLoop.watch(fd, for: .readable) { [weak self] _ in
                    self?.readable(fd)
                } released: {
                    close(fd)
                }
                // A handler that ran before this finds no watch to stop;
                // the next one (level-triggered) does.
                state.withLock { $0.watches[fd] = watch }
            } catch {
                // EPERM: a regular file, which epoll cannot watch.
                close(fd)
                if refused == nil { refused = "\(name): \(error)" }
            }
        }
        if let refused { log?.debug("cannot watch every input device for a person at the machine (\(refused))") }
    }

    public func seen() async -> String? { state.withLock { $0.seenText } }

    public func end() async { closeAll() }

    private func closeAll() {
        let watches = state.withLock { state in
            defer { state.watches = [:] }
            return state.watches
        }
        for watch in watches.values { watch.cancel() }
    }

    private func stopWatching(_ fd: Int32) {
        state.withLock { $0.watches.removeValue(forKey: fd) }?.cancel()
    }

    /// On the loop: reads what is there (at most 64 events a wake, so a busy
    /// device cannot hold the loop) and keeps the first thing a person did.
    private func readable(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: Self.eventSize * 64)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else {
            // A device unplugged (ENODEV) or a closed FIFO stays readable:
            // stop watching it rather than spin.
            if n == 0 || (errno != EAGAIN && errno != EINTR) { stopWatching(fd) }
            return
        }
        var what: String?
        for offset in stride(from: 0, to: n - Self.eventSize + 1, by: Self.eventSize) where what == nil {
            let type = UInt16(buffer[offset + 16]) | UInt16(buffer[offset + 17]) << 8
            let code = UInt16(buffer[offset + 18]) | UInt16(buffer[offset + 19]) << 8
            what = Self.describe(type: type, code: code)
        }
        guard let what else { return }
        let first = state.withLock {
            guard $0.seenText == nil else { return false }
            $0.seenText = what
            return true
        }
        if first { onSeen?(what) }
    }

    /// `struct input_event` on 64-bit Linux: a 16-byte timeval, type,
    /// code (u16 each) and value (s32).
    static let eventSize = 24

    /// What a person did, or nil for events that are not a person's
    /// (EV_SYN, EV_MSC scan codes, LEDs, repeats' settings).
    static func describe(type: UInt16, code: UInt16) -> String? {
        switch type {
        case 1 where code == 116: "power button pressed"  // EV_KEY KEY_POWER
        case 1 where (0x110...0x117).contains(code): "mouse button pressed"  // BTN_LEFT...BTN_TASK
        case 1: "keys pressed"
        case 2: "pointer moved"  // EV_REL
        case 3: "touch or pointer moved"  // EV_ABS
        case 5 where code == 0: "lid opened or closed"  // EV_SW SW_LID
        case 5: "a switch changed"
        default: nil
        }
    }
}
