import Foundation
import Glibc
import Testing
@testable import VigilDBus
import VigilKit

/// The Swift client side against the Swift object server.
@Suite("DBusConnection client")
struct ClientTests {
    func call(_ client: DBusConnection, _ member: String, _ arguments: [BusValue], interface: String = TestService.interfaceName,
              path: String = TestService.path) async throws -> DBusMessage {
        try await client.call(destination: TestService.name, path: path, interface: interface, member: member, arguments: arguments)
    }

    @Test func valuesRoundTripThroughTheWholeTypeSystem() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let values: [BusValue] = [
                .byte(255), .bool(true), .int16(-2), .uint16(65535), .int32(.min), .uint32(.max), .int64(.min), .uint64(.max),
                .double(3.25), .string("héllo ✓"), .objectPath("/a/b_c"), .signature("a{sv}(ii)"),
                .array(elementSignature: "s", []), .array(elementSignature: "y", [.byte(1), .byte(2)]),
                .array(elementSignature: "ai", [.array(elementSignature: "i", [.int32(1)])]),
                .dict(keySignature: "s", valueSignature: "v", [BusDictEntry(key: .string("k"), value: .variant(.uint32(1)))]),
                .structure([.int32(1), .string("x"), .structure([.bool(false)])]),
                .variant(.variant(.string("nested"))),
                ["x": [1, 2] as [Int32]].busValue,
            ]
            for value in values {
                let reply = try await call(client, "Roundtrip", [.variant(value)])
                #expect(reply.body == [.variant(value)], "round trip of \(value.signature)")
            }
            let decoded = try await client.call(destination: TestService.name, path: TestService.path, interface: TestService.interfaceName,
                                                member: "Add", arguments: [Int32(2), Int32(3)], returning: Int32.self)
            #expect(decoded == 5)
            // Typed decoding with the wrong type is an error, not a crash.
            let reply = try await call(client, "Echo", [.string("x")])
            #expect(throws: DBusError.self) { try reply.argument(0, as: UInt32.self) }
            #expect(throws: DBusError.self) { try reply.argument(3, as: String.self) }
            await client.close()
        }
    }

    @Test func invalidValuesAreRejectedBeforeLibdbus() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let bad: [[BusValue]] = [
                [.objectPath("not/a/path")],
                [.objectPath("/trailing/")],
                [.string("nul\u{0}inside")],
                [.signature("a{")],
                [.array(elementSignature: "s", [.int32(1)])],
                [.dict(keySignature: "v", valueSignature: "s", [])],
                [.structure([])],
            ]
            for arguments in bad {
                await #expect(throws: DBusError.self) { try await call(client, "Roundtrip", arguments) }
            }
            await #expect(throws: DBusError.self) {
                try await client.call(destination: TestService.name, path: "bad path", interface: nil, member: "Echo")
            }
            await #expect(throws: DBusError.self) {
                try await client.call(destination: TestService.name, path: "/x", interface: "no dots", member: "Echo")
            }
            await #expect(throws: DBusError.self) {
                try await client.call(destination: "bad..name", path: "/x", interface: nil, member: "Echo")
            }
            #expect(try await call(client, "Echo", [.string("ok")]).body == [.string("ok")])
            await client.close()
        }
    }

    @Test func fileDescriptorsTravelBothWays() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            #expect(await client.canSendFileDescriptors)
            let sent = try pipeWith("from swift")
            let read = try await call(client, "ReadFD", [.unixFD(sent)])
            #expect(read.body == [.string("from swift")])
            // Our copy stays ours (libdbus sent a dup).
            #expect(fcntl(sent.rawValue, F_GETFD) >= 0)
            let opened = try await call(client, "OpenFD", [.string("from the service")])
            let fd = try BusFileDescriptor.decode(opened.body[0])
            #expect(try readAll(fd.rawValue) == "from the service")
            await client.close()
        }
    }

    @Test func requestingAnOwnedNameFailsWithATypedError() async throws {
        try await TestService.with { service in
            let other = try await service.bus.connect()
            let owner = await service.connection.uniqueName
            await #expect(throws: DBusNameRequestError.alreadyOwned(name: TestService.name, owner: owner)) {
                try await other.requestName(TestService.name)
            }
            do {
                try await other.requestName(TestService.name)
            } catch {
                #expect(String(describing: error).contains("already owned by \(owner)"))
            }
            await #expect(throws: DBusNameRequestError.invalidName("no")) { try await other.requestName("no") }
            await other.close()
        }
    }

    @Test func errorsFromHandlersReachTheClient() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            await #expect(throws: DBusError(name: DBusError.Name.accessDenied, message: "nobody may call Deny")) {
                try await call(client, "Deny", [])
            }
            do {
                _ = try await call(client, "Echo", [.int32(1)])
                Issue.record("a wrong signature was accepted")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.invalidArgs)
                #expect(error.message.contains("\"s\"") && error.message.contains("\"i\""), "\(error.message)")
            }
            let whoami = try await call(client, "Whoami", [])
            #expect(whoami.body == [.string(await client.uniqueName), .uint32(getuid())])
            await client.close()
        }
    }

    /// An interface whose property reads without waiting, with a signal.
    static let quickInterface = DBusInterface(
        "org.vigil.Quick1", properties: [DBusProperty("Name", signature: "s", immediate: { .string("quick") })],
        signals: [DBusSignal("Done", arguments: [DBusArgument("what", "s")])])
    /// An interface whose property is read by a getter that may wait.
    static let slowInterface = DBusInterface("org.vigil.Slow1", properties: [.readOnly("Name", String.self) { "slow" }])

    /// `apply` makes its changes in order, with values read off the queue
    /// where a getter waits, and stops at the first that fails.
    @Test func applyMakesChangesInOrderAndStopsAtTheFirstFailure() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let signals = try await client.signals(matching: DBusMatchRule(sender: TestService.name))
            var iterator = signals.makeAsyncIterator()
            let quick = Self.quickInterface
            let slow = Self.slowInterface
            let (quickPath, slowPath) = ("/org/vigil/Test/Quick", "/org/vigil/Test/Slow")
            await #expect(throws: DBusError.self) {
                try await service.server.apply([
                    .export(path: quickPath, interfaces: [quick]),
                    .export(path: slowPath, interfaces: [slow]),
                    .propertiesChanged(path: slowPath, interface: "org.vigil.Slow1", properties: ["Name"]),
                    .emit(path: quickPath, interface: "org.vigil.Quick1", signal: "Done", arguments: [.string("first")]),
                    .propertiesChangedValues(path: quickPath, interface: "org.vigil.Quick1", values: [(name: "Name", value: .string("renamed"))]),
                    .unexport(path: quickPath),
                    // Fails (the object is gone): what follows is not made.
                    .emit(path: quickPath, interface: "org.vigil.Quick1", signal: "Done", arguments: [.string("gone")]),
                    .unexport(path: slowPath),
                ])
            }
            var seen: [String] = []
            for _ in 0..<6 {
                let message = try #require(await iterator.next())
                let first: String = switch message.body.first {
                case let .objectPath(path)?: path
                case let .string(text)?: text
                default: "?"
                }
                seen.append("\(message.member ?? "") \(message.path ?? "") \(first)")
            }
            #expect(seen == [
                "InterfacesAdded /org/vigil \(quickPath)",
                "InterfacesAdded /org/vigil \(slowPath)",
                "PropertiesChanged \(slowPath) org.vigil.Slow1",
                "Done \(quickPath) first",
                "PropertiesChanged \(quickPath) org.vigil.Quick1",
                "InterfacesRemoved /org/vigil \(quickPath)",
            ])
            let exported = await service.server.exportedPaths
            #expect(exported.contains(slowPath) && !exported.contains(quickPath))
            await client.close()
        }
    }

    /// `applyQueued` makes its changes on the queue ahead of anything
    /// queued after it (as a handler's reply), without the caller waiting;
    /// a change that would have to wait for a getter is refused.
    @Test func applyQueuedMakesChangesBeforeWorkQueuedLater() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let signals = try await client.signals(matching: DBusMatchRule(sender: TestService.name))
            var iterator = signals.makeAsyncIterator()
            let quick = Self.quickInterface
            let quickPath = "/org/vigil/Test/Queued"
            let failures = Lock<[String]>([])
            service.server.applyQueued([
                .export(path: quickPath, interfaces: [quick]),
                .emit(path: quickPath, interface: "org.vigil.Quick1", signal: "Done", arguments: [.string("queued")]),
            ]) { error in failures.withLock { $0.append(error.message) } }
            // Queued after the changes: it sees the object.
            #expect(await service.server.exportedPaths.contains(quickPath))
            var seen: [String] = []
            for _ in 0..<2 {
                let message = try #require(await iterator.next())
                seen.append("\(message.member ?? "") \(message.path ?? "")")
            }
            #expect(seen == ["InterfacesAdded /org/vigil", "Done \(quickPath)"])

            let slow = Self.slowInterface
            service.server.applyQueued([.export(path: "/org/vigil/Test/SlowQueued", interfaces: [slow])]) { error in
                failures.withLock { $0.append(error.message) }
            }
            _ = await service.server.exportedPaths
            #expect(failures.withLock { $0 } == ["a change queued without waiting needs a getter that waits"])
            await client.close()
        }
    }

    @Test func signalsObjectManagerAndPropertiesChanged() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            let managerSignals = try await client.signals(matching: DBusMatchRule(
                sender: TestService.name, path: "/org/vigil", interface: "org.freedesktop.DBus.ObjectManager"))
            let propertySignals = try await client.signals(matching: DBusMatchRule(
                path: TestService.path, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"))
            var managerIterator = managerSignals.makeAsyncIterator()
            var propertyIterator = propertySignals.makeAsyncIterator()

            let child = DBusInterface("org.vigil.Child1", properties: [.readOnly("Name", String.self) { "child" }])
            try await service.server.export("/org/vigil/Test/Child", interfaces: [child])
            let added = try #require(await managerIterator.next())
            #expect(added.member == "InterfacesAdded")
            #expect(added.body.first == .objectPath("/org/vigil/Test/Child"))
            let interfaces = try added.argument(1, as: [String: [String: DBusVariant]].self)
            #expect(interfaces["org.vigil.Child1"]?["Name"] == DBusVariant("child"))

            let managed = try await client.call(destination: TestService.name, path: "/org/vigil", interface: "org.freedesktop.DBus.ObjectManager",
                                                member: "GetManagedObjects", arguments: [], returning: [DBusObjectPath: [String: [String: DBusVariant]]].self)
            #expect(Set(managed.keys.map(\.rawValue)) == ["/org/vigil/Test", "/org/vigil/Test/Child"])
            #expect(managed[try DBusObjectPath(TestService.path)]?[TestService.interfaceName]?["Count"] == DBusVariant(UInt32(7)))

            try await service.server.unexport("/org/vigil/Test/Child")
            let removed = try #require(await managerIterator.next())
            #expect(removed.member == "InterfacesRemoved")
            #expect(removed.body == [.objectPath("/org/vigil/Test/Child"), ["org.vigil.Child1"].busValue])

            try await client.call(destination: TestService.name, path: TestService.path, interface: "org.freedesktop.DBus.Properties",
                                  member: "Set", arguments: [.string(TestService.interfaceName), .string("Count"), .variant(.uint32(9))])
            let changed = try #require(await propertyIterator.next())
            #expect(changed.body == [.string(TestService.interfaceName),
                                     .dict(keySignature: "s", valueSignature: "v", [BusDictEntry(key: .string("Count"), value: .variant(.uint32(9)))]),
                                     .array(elementSignature: "s", [])])
            try await service.server.emitPropertiesChanged(path: TestService.path, interface: TestService.interfaceName, properties: ["Label"])
            let invalidated = try #require(await propertyIterator.next())
            #expect(invalidated.body.last == ["Label"].busValue)
            await #expect(throws: DBusError.self) {
                try await service.server.emitPropertiesChanged(path: TestService.path, interface: TestService.interfaceName, properties: ["Version"])
            }
            // Declared signals are checked against their declaration.
            await #expect(throws: DBusError.self) {
                try await service.server.emit(path: TestService.path, interface: TestService.interfaceName, signal: "Ping", arguments: [.int32(1)])
            }
            await client.close()
        }
    }

    @Test func systemBusAddressComesFromTheEnvironment() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address, 1)
        // Processes the suite starts later must not inherit a stopped test bus.
        defer { unsetenv("DBUS_SYSTEM_BUS_ADDRESS") }
        #expect(try DBusConnection.address(of: .system) == bus.address)
        let connection = try await DBusConnection.connect(to: .system)
        #expect(await connection.uniqueName.hasPrefix(":"))
        await connection.close()
    }

    @Test func thousandsOfRandomBadCallsLeaveTheServiceAnswering() async throws {
        try await TestService.with { service in
            let client = try await service.bus.connect()
            var generator = SystemRandomNumberGenerator()
            let members = ["Echo", "Add", "Nope", "Get", "Set", "GetAll", "Introspect", "Roundtrip", "ReadFD", "Deny", "Broken"]
            let interfaces: [String?] = [nil, TestService.interfaceName, "org.freedesktop.DBus.Properties",
                                         "org.freedesktop.DBus.Introspectable", "org.vigil.Nope", "org.freedesktop.DBus.ObjectManager"]
            let paths = [TestService.path, "/", "/org/vigil", "/nope", "/org/vigil/Test/Deeper"]
            let pool: [BusValue] = [.int32(1), .string("s"), .uint32(5000), .variant(.string("x")), .bool(true),
                                     .array(elementSignature: "y", []), .string(TestService.interfaceName), .string("Count"),
                                     .variant(.uint32(3)), .structure([.int32(1)])]
            let expectedNames: Set<String> = [DBusError.Name.invalidArgs, DBusError.Name.unknownMethod, DBusError.Name.unknownObject,
                                              DBusError.Name.unknownInterface, DBusError.Name.unknownProperty,
                                              DBusError.Name.propertyReadOnly, DBusError.Name.accessDenied, DBusError.Name.failed]
            var unexpected: [String] = []
            for _ in 0..<30 {
                try await withThrowingTaskGroup(of: String?.self) { group in
                    for _ in 0..<100 {
                        let member = members.randomElement(using: &generator)!
                        let interface = interfaces.randomElement(using: &generator)!
                        let path = paths.randomElement(using: &generator)!
                        let arguments = (0..<Int.random(in: 0...3, using: &generator)).map { _ in pool.randomElement(using: &generator)! }
                        group.addTask {
                            do {
                                _ = try await client.call(destination: TestService.name, path: path, interface: interface,
                                                          member: member, arguments: arguments)
                                return nil
                            } catch let error as DBusError {
                                return expectedNames.contains(error.name) ? nil : "\(member) \(arguments): \(error)"
                            }
                        }
                    }
                    for try await result in group { if let result { unexpected.append(result) } }
                }
            }
            #expect(unexpected.isEmpty, "\(unexpected.prefix(5))")
            // A huge array with the wrong signature is refused as InvalidArgs.
            let huge = BusValue.array(elementSignature: "u", Array(repeating: .uint32(7), count: 1_000_000))
            await #expect(throws: DBusError(name: DBusError.Name.invalidArgs,
                                            message: "org.vigil.Test1.Echo expects arguments of signature \"s\", got \"au\"")) {
                try await call(client, "Echo", [huge])
            }
            #expect(try await call(client, "Echo", [.string("alive")]).body == [.string("alive")])
            await client.close()
        }
    }
}
