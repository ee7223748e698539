// dbus: round-trip latency of the VigilDBus object server against the C
// libdbus reference service (dbus-test-tool echo) on the same private bus,
// and wakeups of an idle exported connection against a 100 ms polling loop.
import Foundation
import Glibc
import VigilDBus

func dbusBench(_ args: [String]) async throws {
    let calls = args.first.flatMap(Int.init) ?? 5000
    let idleSeconds = 3.0

    // A private bus.
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-dbus-bench-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let config = directory.appendingPathComponent("bus.conf")
    try """
    <busconfig><type>session</type><listen>unix:dir=\(directory.path)</listen><auth>EXTERNAL</auth>
    <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy></busconfig>
    """.write(to: config, atomically: true, encoding: .utf8)
    let daemon = Process()
    daemon.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
    daemon.arguments = ["--config-file=\(config.path)", "--print-address=1", "--nofork"]
    let out = Pipe()
    daemon.standardOutput = out
    daemon.standardError = FileHandle.nullDevice
    try daemon.run()
    defer { kill(daemon.processIdentifier, SIGKILL) }
    var buffer = Data()
    while !buffer.contains(UInt8(ascii: "\n")) {
        let chunk = out.fileHandleForReading.availableData
        if chunk.isEmpty { break }
        buffer.append(chunk)
    }
    let address = String(decoding: buffer, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)

    // The reference: libdbus's own echo service, in C.
    let echo = Process()
    echo.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-test-tool")
    echo.arguments = ["echo", "--name=org.vigil.BenchEcho"]
    echo.environment = ["DBUS_SESSION_BUS_ADDRESS": address]
    try echo.run()
    defer { kill(echo.processIdentifier, SIGKILL) }

    // The VigilDBus service.
    let service = try await DBusConnection.connect(to: .address(address))
    let server = try await DBusObjectServer(connection: service)
    try await server.export("/org/vigil/Bench", interfaces: [
        DBusInterface("org.vigil.Bench1", methods: [DBusMethod("Ping") { _ in [] }]),
    ])
    try await service.requestName("org.vigil.Bench")

    let client = try await DBusConnection.connect(to: .address(address))
    // Wait for the echo service's name.
    for _ in 0..<200 {
        let hasOwner = try await client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                             interface: "org.freedesktop.DBus", member: "NameHasOwner",
                                             arguments: ["org.vigil.BenchEcho"], returning: Bool.self)
        if hasOwner { break }
        try await Task.sleep(for: .milliseconds(10))
    }

    func measure(_ destination: String, _ path: String, _ interface: String) async throws -> Double {
        let start = ContinuousClock.now
        for _ in 0..<calls {
            try await client.call(destination: destination, path: path, interface: interface, member: "Ping")
        }
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) * 1e6 / Double(calls) + Double(elapsed.components.attoseconds) / 1e12 / Double(calls)
    }
    _ = try await measure("org.vigil.Bench", "/org/vigil/Bench", "org.vigil.Bench1") // warm-up
    let swiftMicros = try await measure("org.vigil.Bench", "/org/vigil/Bench", "org.vigil.Bench1")
    let referenceMicros = try await measure("org.vigil.BenchEcho", "/", "org.vigil.Anything")
    print(String(format: "round trip, VigilDBus service:        %8.1f µs/call (%d sequential calls)", swiftMicros, calls))
    print(String(format: "round trip, dbus-test-tool echo (C):  %8.1f µs/call (reference)", referenceMicros))
    print(String(format: "ratio VigilDBus / C reference:        %8.2f", swiftMicros / referenceMicros))

    // Idle wakeups: with both connections open and an object exported,
    // count voluntary context switches of every thread of this process.
    await client.close()
    try await Task.sleep(for: .milliseconds(200))
    let idleBefore = voluntarySwitches()
    try await Task.sleep(for: .seconds(idleSeconds))
    let idleAfter = voluntarySwitches()
    // Reference: the same wait with a thread polling every 100 ms, as a
    // dbus_connection_read_write_dispatch(conn, 100) loop would.
    let stop = ManagedAtomicFlag()
    let poller = Thread {
        while !stop.isSet { poll(nil, 0, 100) }
    }
    poller.start()
    try await Task.sleep(for: .milliseconds(200))
    let pollBefore = voluntarySwitches()
    try await Task.sleep(for: .seconds(idleSeconds))
    let pollAfter = voluntarySwitches()
    stop.set()
    // The idle figure includes the sleeping benchmark task's own timer wakeup.
    print(String(format: "idle %.0f s, exported service:         %5d voluntary context switches (all threads)", idleSeconds, switches(from: idleBefore, to: idleAfter)))
    print(String(format: "idle %.0f s, 100 ms polling reference: %5d voluntary context switches (all threads)", idleSeconds, switches(from: pollBefore, to: pollAfter)))
    await service.close()
}

/// voluntary_ctxt_switches of each thread, from /proc/self/task/*/status.
private func voluntarySwitches() -> [String: Int] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    var counts: [String: Int] = [:]
    for task in tasks {
        guard let status = try? String(contentsOfFile: "/proc/self/task/\(task)/status", encoding: .utf8) else { continue }
        for line in status.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches:") {
            counts[task] = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
        }
    }
    return counts
}

/// Switches made between two snapshots by threads alive at the second one
/// (threads that exited in between are not counted).
private func switches(from before: [String: Int], to after: [String: Int]) -> Int {
    after.reduce(0) { $0 + $1.value - (before[$1.key] ?? 0) }
}

/// A flag set once from one thread and read from another.
private final class ManagedAtomicFlag: @unchecked Sendable {
    // Invariant: `value` is only touched under `lock`.
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.lock(); defer { lock.unlock() }; return value }
    func set() { lock.lock(); value = true; lock.unlock() }
}
