import Foundation
import Testing
import VigilDBus
@testable import VigilHost
import VigilKit
import VigilKitTesting

/// The contract (VigilKit's ``VigilAPI``) as vigild uses it: interfaces are
/// built only from complete bindings, rows cross the wire unchanged, and
/// the XML generated from it is what GLib's binding generator accepts.
@Suite struct IntrospectionContractTests {
    @Test func anInterfaceNeedsAHandlerForEveryDeclaredMemberAndNoOther() throws {
        let api = VigilAPI.clientLease
        let end = DBusMethod(VigilAPI.ClientLease.end) { _ in BusTuple() }
        let renew = DBusMethod(VigilAPI.ClientLease.renew) { _, _ in BusTuple() }
        let properties: [DBusProperty] = [
            .immediate(VigilAPI.ClientLease.owner) { _ in "" }, .immediate(VigilAPI.ClientLease.uid) { _ in 0 },
            .immediate(VigilAPI.ClientLease.pid) { _ in 0 }, .immediate(VigilAPI.ClientLease.name) { _ in "" },
        ]
        #expect(throws: APIBindingError("org.vigil.Vigil1.ClientLease: declared method without a handler: Renew")) {
            try DBusInterface(checking: api, methods: [end], properties: properties)
        }
        #expect(throws: APIBindingError("org.vigil.Vigil1.ClientLease: property handler for an undeclared member: Colour")) {
            try DBusInterface(checking: api, methods: [end, renew],
                              properties: properties + [.immediate(Property("org.example", "Colour", String.self, emitsChange: .const)) { _ in "" }])
        }
        #expect(throws: APIBindingError.self) {
            try DBusInterface(checking: api, methods: [end, renew], properties: properties.filter { $0.name != "Uid" })
        }
        // A property of the same name declared with another type elsewhere.
        let uid = Property("org.example.Other", "Uid", String.self, emitsChange: .const)
        #expect(throws: APIBindingError("org.vigil.Vigil1.ClientLease.Uid is bound with another interface's declaration")) {
            try DBusInterface(checking: api, methods: [end, renew], properties: properties.filter { $0.name != "Uid" } + [.immediate(uid) { _ in "" }])
        }
        // A method of the same name declared with other types elsewhere.
        let other = Method("org.example.Other", "Renew", in: Arg("budget", String.self))
        #expect(throws: APIBindingError("org.vigil.Vigil1.ClientLease.Renew is bound with another interface's declaration")) {
            try DBusInterface(checking: api, methods: [end, DBusMethod(other) { _, _ in BusTuple() }], properties: properties)
        }
        let bound = try DBusInterface(checking: api, methods: [renew, end], properties: properties)
        #expect(bound.methods.map(\.name) == api.methods.map(\.name))
        #expect(bound.methods.map(\.inSignature) == api.methods.map(\.inSignature))
        #expect(bound.properties.map(\.emitsChange.rawValue) == api.properties.map(\.emitsChange.rawValue))
        #expect(bound.signals.map(\.signature) == api.signals.map(\.signature))
        #expect(throws: Never.self) { try bound.validate() }
    }

    @Test func rowsCrossTheWireUnchanged() throws {
        var row = StrategyRow()
        row.path = VigilAPI.strategyPath("mail-sync")
        row.name = "mail-sync"
        row.restarts = 2
        let wire = StrategyRow.array([row])
        #expect(wire.signature == VigilAPI.Host.listStrategies.declaration.outSignature)
        #expect(throws: Never.self) { try wire.validate() }
        #expect(try StrategyRow.rows(wire) == [row])
        #expect(throws: APIDecodingError.self) { try LeaseRow.rows(wire) }
    }

    /// docs/dbus-api.md shows each row's signature as the contract derives it.
    @Test func theDocsShowTheDeclaredRowSignatures() throws {
        let docs = try String(contentsOfFile: Self.packageRoot + "/docs/dbus-api.md", encoding: .utf8)
        for signature in [LeaseRow.arraySignature, StrategyRow.arraySignature, RunRow.arraySignature] {
            #expect(docs.contains("`\(signature)`"), "docs/dbus-api.md lacks \(signature)")
        }
        for property in VigilAPI.download.properties {
            #expect(docs.contains("| `\(property.name)` | `\(property.signature)` |"), "docs/dbus-api.md lacks Download.\(property.name)")
        }
        for property in VigilAPI.strategy.properties {
            #expect(docs.contains("| `\(property.name)` | `\(property.signature)` |"), "docs/dbus-api.md lacks Strategy.\(property.name)")
        }
    }

    /// The Strategy object's cost properties are the fields of one row,
    /// declared once: read when asked (no change signal), and decoded by
    /// vigilctl with the row vigild encodes with.
    @Test func theCostPropertiesAreTheCostRow() throws {
        let declared = VigilAPI.strategy.properties.filter { $0.emitsChange == .false }
        #expect(declared.map(\.name) == StrategyCostRow.fields.map(\.name))
        #expect(declared.allSatisfy { $0.signature == "t" })
        let row = StrategyCostRow(wakeups: 1, systemWakes: 2, sleepHeldUsec: 3, idleHeldUsec: 4, childCPUUsec: 5, bytesSent: 6, bytesReceived: 7)
        #expect(try StrategyCostRow(properties: row.properties) == row)
        #expect(row + row == StrategyCostRow(wakeups: 2, systemWakes: 4, sleepHeldUsec: 6, idleHeldUsec: 8, childCPUUsec: 10, bytesSent: 12, bytesReceived: 14))
    }

    /// gdbus-codegen (GLib's binding generator) turns the generated XML into
    /// C code with an interface struct per interface, a handler per method
    /// and a getter per property.
    @Test func gdbusCodegenGeneratesCodeForEveryInterface() async throws {
        let dir = NSTemporaryDirectory() + "vigil-codegen-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let xml = dir + "/org.vigil.Vigil1.xml"
        try HostBusAPI.introspectionXML().write(toFile: xml, atomically: true, encoding: .utf8)
        let prefix = VigilAPI.busName + "."
        let result = try await ProcessRunner.runDetached("/usr/bin/gdbus-codegen", [
            "--interface-prefix", prefix, "--c-namespace", "Vigil", "--generate-c-code", "vigil", "--output-directory", dir, xml,
        ])
        try #require(result.status == 0, "gdbus-codegen failed: \(result.stderr)")
        let header = try String(contentsOfFile: dir + "/vigil.h", encoding: .utf8)
        for interface in VigilAPI.interfaces {
            let short = String(interface.name.dropFirst(prefix.count))
            #expect(header.contains("struct _Vigil\(short)Iface"), "no interface struct for \(interface.name)")
            for method in interface.methods {
                #expect(header.contains("(*handle_\(Self.snake(method.name))) ("), "no handler for \(interface.name).\(method.name)")
            }
            for property in interface.properties {
                #expect(header.contains("vigil_\(Self.snake(short))_get_\(Self.snake(property.name)) ("), "no getter for \(interface.name).\(property.name)")
            }
            for signal in interface.signals {
                #expect(header.contains("vigil_\(Self.snake(short))_emit_\(Self.snake(signal.name)) ("), "no emitter for \(interface.name).\(signal.name)")
            }
        }
    }

    /// The freedesktop inhibit interfaces vigild serves are documented by
    /// XML generated from the declarations it exports: the file in docs/
    /// is that XML, and gdbus-codegen makes a handler for each method.
    @Test func theInhibitInterfacesXMLIsGeneratedAndGdbusCodegenAcceptsIt() async throws {
        let generated = HostBusAPI.inhibitIntrospectionXML()
        let docs = try String(contentsOfFile: Self.packageRoot + "/docs/freedesktop-inhibit.xml", encoding: .utf8)
        #expect(docs == generated, "docs/freedesktop-inhibit.xml is stale: regenerate it with `vigild --print-inhibit-introspection > docs/freedesktop-inhibit.xml`")
        let dir = NSTemporaryDirectory() + "vigil-codegen-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let xml = dir + "/inhibit.xml"
        try generated.write(toFile: xml, atomically: true, encoding: .utf8)
        let result = try await ProcessRunner.runDetached("/usr/bin/gdbus-codegen", [
            "--interface-prefix", "org.freedesktop.", "--c-namespace", "Fd", "--generate-c-code", "inhibit", "--output-directory", dir, xml,
        ])
        try #require(result.status == 0, "gdbus-codegen failed: \(result.stderr)")
        let header = try String(contentsOfFile: dir + "/inhibit.h", encoding: .utf8)
        let declared = [InhibitBusBridge.powerManagement(nil), InhibitBusBridge.screenSaver(nil), InhibitBusBridge.portal(nil)]
        for interface in declared {
            #expect(generated.contains("<interface name=\"\(interface.name)\">"), "the XML lacks \(interface.name)")
            for method in interface.methods {
                #expect(header.contains("(*handle_\(Self.snake(method.name))) ("), "no handler for \(interface.name).\(method.name)")
            }
        }
        for name in [InhibitBusNames.requestInterface, InhibitBusNames.sessionInterface] {
            #expect(generated.contains("<interface name=\"\(name)\">"), "the XML lacks \(name)")
        }
    }

    /// CamelCase to snake_case, as gdbus-codegen names C symbols.
    static func snake(_ name: String) -> String {
        var out = ""
        var previous: Character?
        for character in name {
            if character.isUppercase, let previous, previous.isLowercase || previous.isNumber { out += "_" }
            out += character.lowercased()
            previous = character
        }
        return out
    }

    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
}

/// A strategy cannot put a contract interface on the bus in another shape.
@Suite struct IntrospectionContractStrategyTests {
    @Test func aStrategyCannotRegisterADeclaredInterfaceInAnotherShape() async throws {
        let bridge = StrategyBusBridge(logging: WaitableLog<LogLine>().logging)
        let bus = bridge.bus(for: "dl")
        let api = VigilAPI.DownloadSession.self
        let methods = [
            api.enqueue.bind(mutating: true) { _, _, _, _ in BusTuple(ObjectPath("/")) },
            api.cancel.bind(mutating: true) { _, _ in BusTuple() },
            api.pause.bind(mutating: true) { _, _ in BusTuple() },
            api.resume.bind(mutating: true) { _, _ in BusTuple() },
        ]
        try await bus.register(VigilAPI.downloadSession, methods: methods)
        // The contract's interface name with another Enqueue (an older SDK's).
        let older = Method(api.interface, "Enqueue", in: Arg("url", [UInt8].self), out: Arg("download", ObjectPath.self))
        var olderInterface = VigilAPI.downloadSession
        olderInterface.methods[0] = older.declaration
        let olderMethods = [older.bind(mutating: true) { _, _ in BusTuple(ObjectPath("/")) }] + methods.dropFirst()
        await #expect(throws: BusMethodError.self) { try await bus.register(olderInterface, methods: olderMethods) }
        await #expect(throws: BusMethodError.self) { try await bus.register(VigilAPI.downloadSession, methods: Array(methods.dropLast())) }
        // An interface the contract does not declare is the strategy's own.
        try await bus.register(APIInterface("org.example.Mine", objects: "", methods: olderMethods.map(\.declaration)), methods: olderMethods)

        let values = DownloadRow().properties
        let object = try await bus.exportObject(relativePath: VigilAPI.downloadRelativePath(1), interface: VigilAPI.downloadInterface,
                                                properties: VigilAPI.download.properties, values: values)
        await #expect(throws: BusMethodError.self) {
            try await bus.exportObject(relativePath: VigilAPI.downloadRelativePath(2), interface: VigilAPI.downloadInterface,
                                       properties: VigilAPI.download.properties.map { BusProperty($0.name, $0.signature) }, values: values)
        }
        await object.remove()
        await bridge.runEnded("dl")
    }
}
