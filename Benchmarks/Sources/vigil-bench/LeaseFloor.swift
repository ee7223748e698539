// background-task's floor: BeginBackgroundTask+End answered by a minimal C
// server (Sources/CLeaseFloor, on libdbus like dbus-test-tool echo) that
// sends the messages vigild's API asks for per lease and does nothing else.
// Its rate, next to echo's, is the most any implementation of the API can
// reach on this bus and machine: the share of the gap to echo that is the
// API's (more messages per lease) rather than vigild's.
import CLeaseFloor
import Foundation
import Glibc
import VigilHost
import VigilKit

enum LeaseFloor {
    /// `vigil-bench background-task --lease-floor ADDRESS` runs the server.
    static let childFlag = "--lease-floor"
    /// The bus name the floor owns; paths, interfaces and members are vigild's.
    static let busName = "org.vigil.BenchLeaseFloor"

    /// Serves the floor on the bus at `address` in this process (the child)
    /// until the bus goes, then exits.
    static func serve(address: String) -> Never {
        var api = declaredAPI()
        exit(vigil_lease_floor_serve(address, &api))
    }

    /// Starts the floor as a child process on the bus at `address` and
    /// returns once it owns its name (it says `ready` on stdout).
    static func start(address: String) throws -> Process {
        let process = Process(), output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe")
        process.arguments = ["background-task", childFlag, address]
        process.standardOutput = output
        try process.run()
        // Blocks for the child's start (milliseconds), as the pong server's
        // `port N` line does; empty when the child exits instead.
        let said = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
        guard said == "ready\n" else {
            process.terminate()
            process.waitUntilExit()
            throw BenchError("the lease floor (vigil-bench background-task \(childFlag)) did not take \(busName) (its stderr says why)")
        }
        return process
    }

    /// What the C server needs, from VigilKit's declaration of the API. A
    /// lease property or signal the floor does not know how to fill stops
    /// the benchmark here, so the floor cannot drift from the API unseen.
    /// The strings live as long as the process (the server never returns
    /// while they are in use).
    private static func declaredAPI() -> vigil_floor_api {
        func text(_ s: String) -> UnsafePointer<CChar> {
            guard let copy = strdup(s) else { fatalError("LeaseFloor: out of memory copying \"\(s)\"") }
            return UnsafePointer(copy)
        }
        let acquired = VigilAPI.Host.leaseAcquired.declaration, released = VigilAPI.Host.leaseReleased.declaration
        precondition(acquired.signature == "oss" && released.signature == "os",
                     "LeaseFloor sends LeaseAcquired as (oss) and LeaseReleased as (os); the API declares (\(acquired.signature)) and (\(released.signature))")
        let begin = VigilAPI.Host.beginBackgroundTask.declaration
        precondition(begin.inArguments.map(\.signature).joined() == "sst" && begin.outArguments.map(\.signature).joined() == "oh",
                     "LeaseFloor answers BeginBackgroundTask(sst) -> (oh); the API declares otherwise")
        let lease = VigilAPI.lease, client = VigilAPI.clientLease
        let leaseFills: [String: (vigil_floor_fill, String?)] = [
            "Id": (vigil_FLOOR_ID, nil), "Strategy": (vigil_FLOOR_TEXT, ClientLeases.strategyName),
            "Kind": (vigil_FLOOR_TEXT, ClientLeases.strategyName), "Holds": (vigil_FLOOR_HOLDS, nil),
            "Reason": (vigil_FLOOR_REASON, nil), "AcquiredAt": (vigil_FLOOR_NOW, nil),
            "Deadline": (vigil_FLOOR_DEADLINE, nil), "Renewals": (vigil_FLOOR_ZERO, nil),
            "State": (vigil_FLOOR_TEXT, LeaseState.active.rawValue), "Status": (vigil_FLOOR_EMPTY_DICT, nil),
            "Owner": (vigil_FLOOR_OWNER, nil), "Uid": (vigil_FLOOR_UID, nil),
            "Pid": (vigil_FLOOR_PID, nil), "Name": (vigil_FLOOR_NAME, nil),
        ]
        func interface(_ declared: APIInterface) -> vigil_floor_interface {
            let properties = UnsafeMutablePointer<vigil_floor_property>.allocate(capacity: declared.properties.count)
            for (index, property) in declared.properties.enumerated() {
                guard let (fill, constant) = leaseFills[property.name] else {
                    preconditionFailure("LeaseFloor does not know what \(declared.name).\(property.name) holds; teach it (LeaseFloor.swift)")
                }
                let type: UInt8 = switch property.signature {
                case "t": UInt8(ascii: "t")
                case "u": UInt8(ascii: "u")
                case "s": UInt8(ascii: "s")
                case "a{sv}": UInt8(ascii: "d")
                default: preconditionFailure("LeaseFloor cannot send \(declared.name).\(property.name) of type \(property.signature)")
                }
                (properties + index).initialize(to: vigil_floor_property(
                    name: text(property.name), type: CChar(bitPattern: type), fill: Int32(fill.rawValue), text: constant.map(text)))
            }
            return vigil_floor_interface(name: text(declared.name), properties: properties, count: Int32(declared.properties.count))
        }
        let samplePath = VigilAPI.leasePath(LeaseID(1))
        return vigil_floor_api(
            bus_name: text(busName), root_path: text(VigilAPI.rootPath),
            lease_path_prefix: text(String(samplePath.dropLast())),
            host_interface: text(VigilAPI.hostInterface), begin_method: text(begin.name),
            acquired_signal: text(acquired.name), released_signal: text(released.name),
            leases_property: text(VigilAPI.Host.leases.name), strategy: text(ClientLeases.strategyName),
            end_method: text(VigilAPI.ClientLease.end.name), state_property: text(VigilAPI.Lease.state.name),
            released_state: text(LeaseState.released.rawValue),
            released_reason: text("ended by the client"), hangup_reason: text("the client closed its lease fd"),
            lease_ended_error: text(VigilAPI.leaseEndedError),
            object_manager_interface: text(VigilAPI.objectManagerInterface),
            properties_interface: text(VigilAPI.propertiesInterface),
            interfaces: (interface(lease), interface(client)))
    }
}
