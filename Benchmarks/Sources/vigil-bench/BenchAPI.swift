// The calls the D-Bus benchmarks make, named from vigild's contract
// (VigilKit's VigilAPI): bus name, object paths, interface names, members
// and property names come from the declaration, which stops the benchmark
// (precondition) if it lacks a member used here.
import VigilDBus
import VigilKit

/// One method call to repeat.
struct BenchCall: Sendable {
    var destination: String
    var path: String
    var interface: String
    var member: String
    var arguments: [BusValue]
}

enum BenchAPI {
    /// The bus name the C reference service (dbus-test-tool echo) owns.
    static let echoName = "org.vigil.BenchEcho"

    /// `Host.<method>` on vigild's root object; with `destination` the same
    /// call sent to another service (the echo reference).
    static func host<each In, Out>(_ method: Method<repeat each In, Out>, _ arguments: repeat each In,
                                   destination: String = VigilAPI.busName) -> BenchCall {
        BenchCall(destination: destination, path: VigilAPI.rootPath, interface: method.interface,
                  member: method.name, arguments: method.encode(repeat each arguments))
    }

    /// `Properties.Get` of a Host property on vigild's root object (or on `destination`).
    static func hostProperty<T>(_ property: Property<T>, destination: String = VigilAPI.busName) -> BenchCall {
        BenchCall(destination: destination, path: VigilAPI.rootPath, interface: VigilAPI.propertiesInterface, member: "Get",
                  arguments: [.string(property.interface), .string(property.name)])
    }

    /// `Host.BeginBackgroundTask(name, reason, budget)` (to vigild, or to `destination`).
    static func beginBackgroundTask(name: String, reason: String, budgetMicros: UInt64, destination: String = VigilAPI.busName) -> BenchCall {
        host(VigilAPI.Host.beginBackgroundTask, name, reason, budgetMicros, destination: destination)
    }

    /// `ClientLease.End` on the lease object at `path` (of vigild, or of `destination`).
    static func endLease(at path: String, destination: String = VigilAPI.busName) -> BenchCall {
        BenchCall(destination: destination, path: path, interface: VigilAPI.clientLeaseInterface,
                  member: VigilAPI.ClientLease.end.name, arguments: [])
    }
}

extension DBusConnection {
    @discardableResult
    func call(_ call: BenchCall) async throws -> DBusMessage {
        try await self.call(destination: call.destination, path: call.path, interface: call.interface,
                            member: call.member, arguments: call.arguments)
    }

    /// Whether `name` has an owner on the bus (the bus driver's NameHasOwner).
    func nameHasOwner(_ name: String) async throws -> Bool {
        try await call(destination: DBusConnection.busDriverName, path: "/org/freedesktop/DBus", interface: DBusConnection.busDriverName,
                       member: "NameHasOwner", arguments: [name], returning: Bool.self)
    }

    /// Begins a client lease and ends it; returns the lease's object path
    /// once both replied.
    @discardableResult
    func beginAndEnd(reason: String, destination: String = VigilAPI.busName) async throws -> String {
        let reply = try await call(BenchAPI.beginBackgroundTask(name: "bench", reason: reason, budgetMicros: 60_000_000, destination: destination))
        guard case .objectPath(let path) = reply.body.first else { throw DBusError.failed("BeginBackgroundTask replied without a lease path") }
        try await call(BenchAPI.endLease(at: path, destination: destination))
        if case .unixFD(let fd) = reply.body.last { fd.close() }
        return path
    }
}
