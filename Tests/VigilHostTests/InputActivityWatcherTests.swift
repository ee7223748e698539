import Foundation
import Glibc
import Testing
@testable import VigilHost
import VigilKitTesting

/// The evdev reader of a dark wake: `struct input_event`s written to FIFOs
/// that stand for `/dev/input/event*` (no input devices exist here).
@Suite struct InputActivityWatcherTests {
    static func event(type: UInt16, code: UInt16, value: Int32) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)  // struct timeval
        bytes += withUnsafeBytes(of: type.littleEndian, Array.init)
        bytes += withUnsafeBytes(of: code.littleEndian, Array.init)
        bytes += withUnsafeBytes(of: value.littleEndian, Array.init)
        return bytes
    }

    @Test func aKeyPressDuringTheDarkWakeIsSeen() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-input-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for name in ["event0", "event1", "mouse0"] { #expect(mkfifo("\(dir)/\(name)", 0o600) == 0) }
        let seen = WaitableLog<String>()
        let watcher = InputActivityWatcher(directory: dir, onSeen: { seen.append($0) })
        await watcher.begin()
        #expect(await watcher.seen() == nil)
        let fd = open("\(dir)/event1", O_WRONLY | O_NONBLOCK)
        try #require(fd >= 0)
        defer { close(fd) }
        // A scan code and a sync are not a person; the key is.
        let bytes = Self.event(type: 4, code: 4, value: 30) + Self.event(type: 0, code: 0, value: 0) + Self.event(type: 1, code: 30, value: 1)
        #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == 72)
        #expect(await seen.wait(forCount: 1) == 1)
        #expect(await watcher.seen() == "keys pressed")
        await watcher.end()
        // The next dark wake starts unseen.
        await watcher.begin()
        #expect(await watcher.seen() == nil)
        await watcher.end()
    }

    @Test func whatAPersonDidIsNamed() {
        #expect(InputActivityWatcher.describe(type: 1, code: 116) == "power button pressed")
        #expect(InputActivityWatcher.describe(type: 1, code: 0x110) == "mouse button pressed")
        #expect(InputActivityWatcher.describe(type: 2, code: 0) == "pointer moved")
        #expect(InputActivityWatcher.describe(type: 5, code: 0) == "lid opened or closed")
        #expect(InputActivityWatcher.describe(type: 0, code: 0) == nil)
        #expect(InputActivityWatcher.describe(type: 4, code: 4) == nil)
    }
}
