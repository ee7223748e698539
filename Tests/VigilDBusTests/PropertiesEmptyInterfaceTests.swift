import Testing
@testable import VigilDBus

/// Properties.Get and GetAll with an empty interface name, as the D-Bus
/// specification allows: every interface of the object is searched.
@Suite struct PropertiesEmptyInterfaceTests {
    @Test func emptyInterfaceNameSearchesEveryInterface() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let version = try await client.call(
                destination: TestService.name, path: TestService.path, interface: DBusStandardInterfaces.properties,
                member: "Get", arguments: [.string(""), .string("Version")])
            #expect(version.body == [.variant(.string("1.2.3"))])
            let all = try await client.call(
                destination: TestService.name, path: TestService.path, interface: DBusStandardInterfaces.properties,
                member: "GetAll", arguments: [""], returning: [String: DBusVariant].self)
            #expect(Set(all.keys).isSuperset(of: ["Version", "Count", "Label", "Tags"]), "\(all.keys)")
            #expect(all["Version"] == DBusVariant("1.2.3"))
            await #expect(throws: DBusError.self) {
                try await client.call(
                    destination: TestService.name, path: TestService.path, interface: DBusStandardInterfaces.properties,
                    member: "Get", arguments: [.string(""), .string("NoSuchProperty")])
            }
            await client.close()
        }
    }
}
