// The object server's routing of arbitrary messages (Sources/VigilDBus/
// DBusObjectServer.swift), with vigild's real objects behind it: a host
// runtime with two strategies, its org.vigil.Vigil1 API exported on a
// private dbus-daemon this fuzzer starts once. Each input is a method call
// as libdbus marshals it (dbus_message_demarshal); it is sent to the host
// from a plain libdbus client with any path, interface, member and body,
// and must be answered (a reply or an error) within 5 s, after which the
// host must still answer Properties.Get. A crash, a hang or a host that
// stops answering is a finding.
import CDBus
import CDBusShim
import Foundation
import BackgroundTask
import PeriodicWake
@testable import VigilDBus
@testable import VigilHost
import VigilKit

/// What the first input starts and every input uses. Built once: a host
/// per input would spend its time starting hosts.
private final class Target: @unchecked Sendable {
    // Invariant: used only from libFuzzer's thread (one input at a time);
    // the host runs on its own tasks and threads and is reached over the bus.
    var client: OpaquePointer
    let hostName: String
    let address: String
    var serial: UInt32 = 1

    init(client: OpaquePointer, hostName: String, address: String) {
        self.client = client
        self.hostName = hostName
        self.address = address
    }

    /// A new client connection, after the bus closed the last one (it does
    /// for a message it refuses, such as one that declares descriptors it
    /// does not carry): not a finding about the host.
    func reconnect() {
        dbus_connection_close(client)
        dbus_connection_unref(client)
        do {
            client = try Self.connectClient(address)
        } catch {
            fatalError("fuzz-object-server: \(error)")
        }
    }

    static func connectClient(_ address: String) throws -> OpaquePointer {
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let client = dbus_connection_open_private(address, &error), dbus_bus_register(client, &error) != 0 else {
            throw StartError(description: "the client cannot connect to \(address)")
        }
        dbus_connection_set_exit_on_disconnect(client, 0)
        return client
    }

    static let shared: Target = {
        do {
            return try start()
        } catch {
            fatalError("fuzz-object-server: cannot start the host: \(error)")
        }
    }()

    struct StartError: Error, CustomStringConvertible { var description: String }

    private static func start() throws -> Target {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-fuzz-object-server-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let address = try startBus(in: directory)
        let configPath = directory.appendingPathComponent("vigil.toml").path
        try """
            [host]
            state_dir = "\(directory.path)/state"
            power = "none"

            [[strategy]]
            name = "renew"
            kind = "background-task"
            budget = "1h"

            [[strategy]]
            name = "tick"
            kind = "periodic-wake"
            every = "1h"
            run = ["/bin/true"]
            """.write(toFile: configPath, atomically: true, encoding: .utf8)
        let semaphore = DispatchSemaphore(value: 0)
        let outcome = Outcome()
        Task {
            do {
                let plugins = PluginLoader(searchPath: [])
                try plugins.register([BackgroundTaskKind(), PeriodicWakeKind()], from: "fuzz-object-server")
                let config = try ConfigLoader.load(path: configPath, resolver: plugins)
                let clock = SystemClock()
                let runtime = try await HostRuntime.open(config: config, environment: HostRuntime.Environment(
                    clock: clock, scheduler: try WakeScheduler.system(clock: clock), logging: .discarding,
                    version: "fuzz", plugins: plugins))
                let strategies = await runtime.strategies(after: nil)
                // Unstructured task: never cancelled: the strategies run as long as the fuzzer.
                Task { await strategies.run() }
                _ = await strategies.started.wait()
                let connection = try await DBusConnection.connect(to: .address(address))
                let api = HostBusAPI(runtime: runtime, connection: connection, hostUID: getuid())
                try await api.export()
                outcome.set(.success((await connection.uniqueName, runtime, api, connection)))
            } catch {
                outcome.set(.failure(error))
            }
            semaphore.signal()
        }
        semaphore.wait()
        let (hostName, _, _, _) = try outcome.get()
        return Target(client: try connectClient(address), hostName: hostName, address: address)
    }

    /// A private dbus-daemon (session type, everyone allowed everything) in
    /// `directory`; returns its address. It lives as long as the fuzzer.
    private static func startBus(in directory: URL) throws -> String {
        let configFile = directory.appendingPathComponent("bus.conf")
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig><type>session</type><listen>unix:dir=\(directory.path)</listen><auth>EXTERNAL</auth>
            <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
            </busconfig>
            """.write(to: configFile, atomically: true, encoding: .utf8)
        let bus = Process()
        // It ends with the fuzzer, however the fuzzer ends (a finding is an
        // abort): the parent-death signal of the thread that starts it,
        // libFuzzer's own, which lives as long as the process.
        bus.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        bus.arguments = ["--pdeathsig", "KILL", "--", "/usr/bin/dbus-daemon", "--nofork", "--print-address=1", "--config-file=\(configFile.path)"]
        let pipe = Pipe()
        bus.standardOutput = pipe
        bus.standardError = FileHandle.nullDevice
        try bus.run()
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = pipe.fileHandleForReading.availableData
            if chunk.isEmpty { throw StartError(description: "dbus-daemon printed no address") }
            line += chunk
        }
        return String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// The host's start-up result, handed from its task to the fuzzer's thread.
private final class Outcome: @unchecked Sendable {
    // Invariant: written once by the start-up task before it signals the
    // semaphore, read once by the fuzzer's thread after waiting on it.
    private var result: Result<(String, HostRuntime, HostBusAPI, DBusConnection), any Error>?
    func set(_ r: Result<(String, HostRuntime, HostBusAPI, DBusConnection), any Error>) { result = r }
    func get() throws -> (String, HostRuntime, HostBusAPI, DBusConnection) {
        guard let result else { throw CancellationError() }
        return try result.get()
    }
}

private enum Answer {
    /// A reply or an error (the message, when libdbus kept it).
    case answered(OpaquePointer?)
    /// Nothing within the time: the host hangs.
    case none
    /// The bus closed the client's connection.
    case disconnected
}

/// Sends `message` to the host and waits (5 s at most) for its answer.
private func roundTrip(_ target: Target, _ message: OpaquePointer) -> Answer {
    var error = CDBus.DBusError()
    dbus_error_init(&error)
    defer { dbus_error_free(&error) }
    if let reply = dbus_connection_send_with_reply_and_block(target.client, message, 5_000, &error) { return .answered(reply) }
    if dbus_connection_get_is_connected(target.client) == 0 { return .disconnected }
    // An error reply is an answer; libdbus reports NoReply when the time ran out.
    let name = error.name.map { String(cString: $0) } ?? ""
    return name == "org.freedesktop.DBus.Error.NoReply" ? .none : .answered(nil)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzObjectServer(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let target = Target.shared
    var error = CDBus.DBusError()
    dbus_error_init(&error)
    defer { dbus_error_free(&error) }
    let message = data.withMemoryRebound(to: CChar.self, capacity: size) { dbus_message_demarshal($0, Int32(clamping: size), &error) }
    guard let message else { return 0 }
    defer { dbus_message_unref(message) }
    // Only calls are routed. Descriptors cannot come from bytes: a message
    // that declares some would be refused by the bus (and cost the client
    // its connection) before the host saw it.
    guard dbus_message_get_type(message) == CDBUS_MESSAGE_TYPE_METHOD_CALL, !DBusMarshal.signature(of: message).contains("h") else { return 0 }
    target.serial = target.serial == UInt32.max ? 1 : target.serial + 1
    dbus_message_set_serial(message, target.serial)
    dbus_message_set_no_reply(message, 0)
    guard dbus_message_set_destination(message, target.hostName) != 0 else { return 0 }
    let header = DBusMarshal.decodeHeader(message)
    switch roundTrip(target, message) {
    case let .answered(reply):
        if let reply { dbus_message_unref(reply) }  // closes any fd it carried: a lease it began ends
    case .disconnected:
        target.reconnect()
    case .none:
        fatalError("no answer within 5 s to \(header.interface ?? "-").\(header.member ?? "-") at \(header.path ?? "-") with signature \"\(DBusMarshal.signature(of: message))\"")
    }
    // The host still answers.
    guard let probe = dbus_message_new_method_call(target.hostName, VigilAPI.rootPath, VigilAPI.propertiesInterface, "Get") else { return 0 }
    defer { dbus_message_unref(probe) }
    guard (try? DBusMarshal.append([.string(VigilAPI.hostInterface), .string("Version")], to: probe)) != nil else { return 0 }
    guard case let .answered(answer?) = roundTrip(target, probe), dbus_message_get_type(answer) == CDBUS_MESSAGE_TYPE_METHOD_RETURN else {
        fatalError("the host no longer answers Properties.Get after \(header.interface ?? "-").\(header.member ?? "-") at \(header.path ?? "-")")
    }
    dbus_message_unref(answer)
    return 0
}
