import Foundation
import Glibc
import Testing
@testable import VigilDBus
import VigilKitTesting

/// State behind the test object.
actor TestState {
    var count: UInt32 = 7
    func setCount(_ value: UInt32) { count = value }
}

/// A private bus with a service exporting `/org/vigil/Test` under the name
/// `org.vigil.Test`.
struct TestService {
    static let name = "org.vigil.Test"
    static let path = "/org/vigil/Test"
    static let interfaceName = "org.vigil.Test1"

    let bus: TestBus
    let connection: DBusConnection
    let server: DBusObjectServer
    let state: TestState

    static func start() async throws -> TestService {
        let bus = try TestBus()
        do {
            let connection = try await bus.connect()
            let server = try await DBusObjectServer(connection: connection)
            let state = TestState()
            try await server.addObjectManager(at: "/org/vigil")
            try await server.export(path, interfaces: [testInterface(state: state)])
            try await connection.requestName(name)
            return TestService(bus: bus, connection: connection, server: server, state: state)
        } catch {
            bus.stop()
            throw error
        }
    }

    /// Runs `body` against a fresh service and always stops it afterwards.
    static func with(_ body: (TestService) async throws -> Void) async throws {
        let service = try await start()
        do {
            try await body(service)
        } catch {
            await service.stop()
            throw error
        }
        await service.stop()
    }

    func stop() async {
        await connection.close()
        bus.stop()
    }

    /// The declared test interface: every kind of member once.
    static func testInterface(state: TestState) -> DBusInterface {
        DBusInterface(
            interfaceName,
            methods: [
                DBusMethod("Echo", in: [DBusArgument("text", String.self)], out: [DBusArgument("echoed", String.self)]) { call in
                    [.string(try call.argument(0, as: String.self))]
                },
                DBusMethod("Add", in: [DBusArgument("a", Int32.self), DBusArgument("b", Int32.self)], out: [DBusArgument("sum", Int32.self)]) { call in
                    let a = try call.argument(0, as: Int32.self)
                    let b = try call.argument(1, as: Int32.self)
                    return [.int32(a &+ b)]
                },
                DBusMethod("Roundtrip", in: [DBusArgument("value", "v")], out: [DBusArgument("value", "v")]) { call in
                    call.arguments
                },
                DBusMethod("Deny") { _ in throw DBusError.accessDenied("nobody may call Deny") },
                DBusMethod("Broken", out: [DBusArgument("text", "s")]) { _ in [.int32(1)] },
                DBusMethod("Whoami", out: [DBusArgument("sender", "s"), DBusArgument("uid", "u")]) { call in
                    [.string(call.sender), .uint32(try await call.connection.callerUID(call.sender))]
                },
                DBusMethod("ReadFD", in: [DBusArgument("fd", "h")], out: [DBusArgument("contents", "s")]) { call in
                    guard case let .unixFD(fd) = call.arguments[0] else { throw DBusError.invalidArgs("no fd") }
                    return [.string(try readAll(fd.rawValue))]
                },
                DBusMethod("OpenFD", in: [DBusArgument("contents", "s")], out: [DBusArgument("fd", "h")]) { call in
                    let fd = try pipeWith(try call.argument(0, as: String.self))
                    return [.unixFD(fd)]
                },
                DBusMethod("EmitPing", in: [DBusArgument("message", "s")]) { call in
                    try await call.connection.emitSignal(
                        path: call.path, interface: interfaceName, name: "Ping", arguments: call.arguments)
                    return []
                },
            ],
            properties: [
                .readOnly("Version", String.self, emitsChange: .const) { "1.2.3" },
                .readWrite("Count", UInt32.self, get: { await state.count }, set: { value, _ in
                    guard value < 1000 else { throw DBusError.invalidArgs("Count must be below 1000") }
                    await state.setCount(value)
                }),
                .readOnly("Label", String.self, emitsChange: .invalidates) { "label" },
                .readOnly("Tags", [String: UInt32].self) { ["a": 1, "b": 2] },
            ],
            signals: [DBusSignal("Ping", arguments: [DBusArgument("message", "s")])]
        )
    }
}

/// Reads everything from `fd` (not closing it).
func readAll(_ fd: Int32) throws -> String {
    var data = [UInt8]()
    var buffer = [UInt8](repeating: 0, count: 4096)
    _ = lseek(fd, 0, SEEK_SET)
    while true {
        let n = read(fd, &buffer, buffer.count)
        if n < 0 { throw DBusError.failed("read failed: errno \(errno)") }
        if n == 0 { break }
        data += buffer[0..<n]
    }
    return String(decoding: data, as: UTF8.self)
}

/// A pipe's read end with `contents` already written and the write end closed.
func pipeWith(_ contents: String) throws -> BusFileDescriptor {
    var fds: [Int32] = [-1, -1]
    guard pipe(&fds) == 0 else { throw DBusError.failed("pipe failed") }
    let bytes = Array(contents.utf8)
    _ = bytes.withUnsafeBytes { write(fds[1], $0.baseAddress, $0.count) }
    close(fds[1])
    return BusFileDescriptor(owning: fds[0])
}

/// Writes a python script to a temp file and runs it with /usr/bin/python3.
func runPython(_ script: String, _ arguments: [String]) async throws -> CommandResult {
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-dbus-\(UUID().uuidString).py")
    try script.write(to: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(at: file) }
    return try await ProcessRunner.runDetached("/usr/bin/python3", [file.path] + arguments)
}
