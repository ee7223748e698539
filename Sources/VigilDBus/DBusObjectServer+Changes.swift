extension DBusObjectServer {
    /// One change to the exported objects, for ``apply(_:)``.
    public enum Change: Sendable {
        /// ``export(_:interfaces:)``.
        case export(path: String, interfaces: [DBusInterface])
        /// ``unexport(_:)``.
        case unexport(path: String)
        /// ``emit(path:interface:signal:arguments:)``.
        case emit(path: String, interface: String, signal: String, arguments: [BusValue] = [])
        /// ``emitPropertiesChanged(path:interface:properties:)``: the values
        /// read from the getters when the signal is built.
        case propertiesChanged(path: String, interface: String, properties: [String])
        /// ``emitPropertiesChanged(path:interface:values:)``: the values given.
        case propertiesChangedValues(path: String, interface: String, values: [(name: String, value: BusValue)])
    }

    /// Makes `changes` in order: objects appear and disappear and signals
    /// are sent in the order given, with no other change of this server in
    /// between. All of them take one hop to the connection's queue when
    /// every value they announce reads without waiting (immediate getters);
    /// a change that needs a wait is finished before the next one starts.
    /// Stops at the first change that fails and throws its error.
    public func apply(_ changes: [Change]) async throws {
        for change in changes {
            guard case let .export(path, interfaces) = change else { continue }
            try Self.validateExport(path, interfaces)
        }
        var rest = changes[...]
        while !rest.isEmpty {
            let batch = rest
            // How many were made on the queue, and what the one after them still needs.
            let (made, waiting): (Int, Waiting?) = try await connection.onQueueThrowing { [self] connection in
                for (offset, change) in batch.enumerated() {
                    if let waiting = try applyOnQueue(change, connection) { return (offset, waiting) }
                }
                return (batch.count, nil)
            }
            rest = rest.dropFirst(made)
            guard let waiting else { return }
            rest = rest.dropFirst()
            switch waiting {
            case let .announce(interfaces, path, managerPaths):
                try await announceAdded(interfaces, at: path, to: managerPaths)
            case let .readProperties(path, interface, declared):
                var changed: [BusDictEntry] = []
                var invalidated: [String] = []
                for property in declared {
                    if property.emitsChange == .true, let getter = property.getter {
                        changed.append(BusDictEntry(key: .string(property.name), value: .variant(try await getter(path))))
                    } else {
                        invalidated.append(property.name)
                    }
                }
                try await connection.emitSignal(
                    path: path, interface: DBusStandardInterfaces.properties, name: "PropertiesChanged",
                    arguments: [.string(interface), .dict(keySignature: "s", valueSignature: "v", changed), invalidated.busValue])
            }
        }
    }

    /// Queues `changes` on the connection's queue without waiting for them:
    /// they are made in order, before anything queued later on this
    /// connection (such as the reply of the method call that queued them),
    /// and after anything queued earlier. Every value they announce must
    /// read without waiting (immediate getters); a change that would have
    /// to wait, or fails, stops the batch, and its error goes to `failed`
    /// (on the queue). A handler that exports an object and then replies
    /// naming it needs no hop of its own to the queue this way.
    public func applyQueued(_ changes: [Change], failed: @escaping @Sendable (DBusError) -> Void) {
        for change in changes {
            guard case let .export(path, interfaces) = change else { continue }
            do {
                try Self.validateExport(path, interfaces)
            } catch {
                failed(error as? DBusError ?? .failed(String(describing: error)))
                return
            }
        }
        connection.queue.async { [self] in
            for change in changes {
                do {
                    if try applyOnQueue(change, connection) != nil {
                        failed(.failed("a change queued without waiting needs a getter that waits"))
                        return
                    }
                } catch {
                    failed(error as? DBusError ?? .failed(String(describing: error)))
                    return
                }
            }
        }
    }

    /// What a change begun on the queue still needs, off the queue.
    enum Waiting {
        /// The object is exported; its InterfacesAdded needs getters that wait.
        case announce([DBusInterface], path: String, managerPaths: [String])
        /// PropertiesChanged needs getters that wait (nothing was sent yet).
        case readProperties(path: String, interface: String, [DBusProperty])
    }

    static func validateExport(_ path: String, _ interfaces: [DBusInterface]) throws {
        guard DBusObjectPath.isValid(path) else { throw DBusError.invalidArgs("\"\(path)\" is not a valid object path") }
        var names = Set<String>()
        for interface in interfaces {
            try interface.validate()
            guard names.insert(interface.name).inserted else {
                throw DBusError.invalidArgs("interface \(interface.name) is exported twice at \(path)")
            }
        }
    }

    /// Makes `change` on the queue; returns what it still needs off the queue, if anything.
    private func applyOnQueue(_ change: Change, _ connection: DBusConnection) throws -> Waiting? {
        switch change {
        case let .export(path, interfaces):
            guard objects[path] == nil else { throw DBusError.invalidArgs("an object is already exported at \(path)") }
            objects[path] = interfaces
            let managerPaths = Array(managers.filter { Self.isStrictDescendant(path, of: $0) })
            guard !managerPaths.isEmpty else { return nil }
            guard let added = Self.immediateInterfacesAndProperties(interfaces, at: path) else {
                return .announce(interfaces, path: path, managerPaths: managerPaths)
            }
            for manager in managerPaths {
                try connection.sendOnQueue(DBusConnection.signalMessage(
                    path: manager, interface: DBusStandardInterfaces.objectManager, name: "InterfacesAdded",
                    arguments: [.objectPath(path), added]))
            }
        case let .unexport(path):
            guard let removed = objects.removeValue(forKey: path) else { throw DBusError.unknownObject("no object is exported at \(path)") }
            for manager in managers where Self.isStrictDescendant(path, of: manager) {
                try connection.sendOnQueue(DBusConnection.signalMessage(
                    path: manager, interface: DBusStandardInterfaces.objectManager, name: "InterfacesRemoved",
                    arguments: [.objectPath(path), removed.map(\.name).busValue]))
            }
        case let .emit(path, interface, signal, arguments):
            // Built first: invalid names are InvalidArgs whether or not the object exists.
            let message = try DBusConnection.signalMessage(path: path, interface: interface, name: signal, arguments: arguments)
            guard let interfaces = objects[path] else { throw DBusError.unknownObject("no object is exported at \(path)") }
            guard let declared = interfaces.first(where: { $0.name == interface }) else {
                throw DBusError.unknownInterface("the object at \(path) has no interface \(interface)")
            }
            guard let declaration = declared.signal(named: signal) else {
                throw DBusError.invalidArgs("\(interface) declares no signal \(signal)")
            }
            let actual = arguments.map(\.signature).joined()
            guard actual == declaration.signature else {
                throw DBusError.invalidArgs("signal \(interface).\(signal) is declared with signature \"\(declaration.signature)\", got \"\(actual)\"")
            }
            try connection.sendOnQueue(message)
        case let .propertiesChanged(path, interface, properties):
            let declared = try changingPropertiesOnQueue(path: path, interface: interface, properties: properties)
            var changed: [BusDictEntry] = []
            var invalidated: [String] = []
            for property in declared {
                if property.emitsChange == .true, property.getter != nil {
                    guard let immediate = property.immediateGetter else {
                        return .readProperties(path: path, interface: interface, declared)
                    }
                    changed.append(BusDictEntry(key: .string(property.name), value: .variant(try immediate(path))))
                } else {
                    invalidated.append(property.name)
                }
            }
            try sendPropertiesChangedOnQueue(connection, path: path, interface: interface, changed: changed, invalidated: invalidated)
        case let .propertiesChangedValues(path, interface, values):
            let declared = try changingPropertiesOnQueue(path: path, interface: interface, properties: values.map(\.name))
            var changed: [BusDictEntry] = []
            for (property, entry) in zip(declared, values) {
                guard property.emitsChange == .true else {
                    throw DBusError.invalidArgs("\(interface).\(property.name) is not announced with its value")
                }
                guard entry.value.signature == property.signature else {
                    throw DBusError.invalidArgs("\(interface).\(property.name) is declared \"\(property.signature)\", got \"\(entry.value.signature)\"")
                }
                changed.append(BusDictEntry(key: .string(property.name), value: .variant(entry.value)))
            }
            try sendPropertiesChangedOnQueue(connection, path: path, interface: interface, changed: changed, invalidated: [])
        }
        return nil
    }

    private func sendPropertiesChangedOnQueue(_ connection: DBusConnection, path: String, interface: String,
                                              changed: [BusDictEntry], invalidated: [String]) throws {
        try connection.sendOnQueue(DBusConnection.signalMessage(
            path: path, interface: DBusStandardInterfaces.properties, name: "PropertiesChanged",
            arguments: [.string(interface), .dict(keySignature: "s", valueSignature: "v", changed), invalidated.busValue]))
    }
}
