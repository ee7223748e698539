import Dispatch
import Foundation
import Glibc
import VigilKit

/// Input from a person during a dark wake, read from the kernel's event
/// devices (`/dev/input/event*`, evdev): keys, pointer, touch, the lid
/// switch and the power button all arrive there, whatever the session or
/// desktop (there may be none). The devices are open only during a dark
/// wake, so a machine in use never wakes vigild per key press. Reading
/// them needs root or the `input` group; devices that cannot be opened are
/// skipped (the first such is logged at debug).
public final class InputActivityWatcher: InputActivity, Sendable {
    // Each DispatchSource owns its fd and closes it when cancelled.
    private struct State {
        var sources: [Int32: DeviceSource] = [:]
        var seenText: String?
    }
    private let state = Lock(State())
    private let directory: String
    private let queue = DispatchQueue(label: "vigil.input-activity")
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

    public func begin() async {
        closeAll()
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
            .filter { $0.hasPrefix("event") }.sorted().prefix(Self.maxDevices)
        var sources: [Int32: DeviceSource] = [:]
        var refused: String?
        for name in names {
            let fd = open("\(directory)/\(name)", O_RDONLY | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else {
                if refused == nil { refused = "\(name): \(String(cString: strerror(errno)))" }
                continue
            }
            let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            source.setEventHandler { [weak self] in self?.readable(fd) }
            source.setCancelHandler { close(fd) }
            sources[fd] = DeviceSource(source: source)
        }
        if let refused { log?.debug("cannot watch every input device for a person at the machine (\(refused))") }
        state.withLock {
            $0.sources = sources
            $0.seenText = nil
        }
        for device in sources.values { device.source.resume() }
    }

    public func seen() async -> String? { state.withLock { $0.seenText } }

    public func end() async { closeAll() }

    private func closeAll() {
        let sources = state.withLock { state in
            defer { state.sources = [:] }
            return state.sources
        }
        for device in sources.values { device.source.cancel() }
    }

    private func stopWatching(_ fd: Int32) {
        let device = state.withLock { $0.sources.removeValue(forKey: fd) }
        device?.source.cancel()
    }

    /// Reads what is there (at most 64 events a wake) and keeps the first
    /// thing a person did.
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

    /// One device's read source, kept in `state`.
    private struct DeviceSource: @unchecked Sendable {
        // Invariant: its handlers are set before it is wrapped; afterwards
        // only `resume` and `cancel` are called, which libdispatch makes
        // safe from any thread (a source is not marked Sendable for its
        // setters).
        let source: any DispatchSourceRead
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
