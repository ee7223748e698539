extension DBusObjectServer {
    /// Adds `interfaces` to the object already exported at `path` (a
    /// plugin's extra interface on its strategy object). Under an
    /// ObjectManager this emits `InterfacesAdded` with the new interfaces
    /// only, as the ObjectManager specification says.
    public func addInterfaces(_ interfaces: [DBusInterface], at path: String) async throws {
        for interface in interfaces { try interface.validate() }
        let managerPaths: [String] = try await connection.onQueueThrowing { [self] _ in
            guard let existing = objects[path] else { throw DBusError.unknownObject("no object is exported at \(path)") }
            let names = Set(existing.map(\.name))
            for interface in interfaces where names.contains(interface.name) {
                throw DBusError.invalidArgs("interface \(interface.name) is already exported at \(path)")
            }
            objects[path] = existing + interfaces
            return managers.filter { Self.isStrictDescendant(path, of: $0) }
        }
        try await announceAdded(interfaces, at: path, to: managerPaths)
    }

    /// Removes the named interfaces from the object at `path` (the object
    /// stays). Under an ObjectManager this emits `InterfacesRemoved`.
    /// Interfaces the object does not have are ignored.
    public func removeInterfaces(_ names: [String], at path: String) async throws {
        let (removed, managerPaths): ([String], [String]) = try await connection.onQueueThrowing { [self] _ in
            guard let existing = objects[path] else { return ([], []) }
            let removed = existing.map(\.name).filter { names.contains($0) }
            objects[path] = existing.filter { !names.contains($0.name) }
            return (removed, managers.filter { Self.isStrictDescendant(path, of: $0) })
        }
        guard !removed.isEmpty else { return }
        try await announceRemoved(removed, at: path, to: managerPaths)
    }
}
