import Foundation
import Testing
import VigilKit
@testable import VigilHost
@testable import VigilSurvival

/// StrategyContext.store on the survival store's SQLite file.
@Suite struct StrategyStoreTests {
    static func tempStore() throws -> (String, () -> Void) {
        var template = Array("/tmp/vigil-strategy-store-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw POSIXError(.EIO) }
        let directory = String(cString: dir)
        return (directory + "/survival.sqlite", { try? FileManager.default.removeItem(atPath: directory) })
    }

    @Test func recordsPersistPerStrategyAcrossReopening() async throws {
        let (path, cleanup) = try Self.tempStore()
        defer { cleanup() }
        do {
            let store = try SurvivalStore(path: path)
            let a = HostStrategyStore(store: store, strategy: "a")
            let b = HostStrategyStore(store: store, strategy: "b")
            try await a.put("download/1", Array("one".utf8))
            try await a.put("download/2", Array("two".utf8))
            try await a.put("download/2", Array("two again".utf8))
            try await b.put("download/1", [0, 1, 2, 255])
            try await a.delete("missing")
            #expect(try await a.get("download/2") == Array("two again".utf8))
            #expect(try await a.get("nothing") == nil)
        }
        // A new store on the same file (a restart) finds everything.
        let store = try SurvivalStore(path: path)
        let a = HostStrategyStore(store: store, strategy: "a")
        let b = HostStrategyStore(store: store, strategy: "b")
        #expect(try await a.all() == ["download/1": Array("one".utf8), "download/2": Array("two again".utf8)])
        #expect(try await b.all() == ["download/1": [0, 1, 2, 255]])
        try await a.delete("download/1")
        #expect(try await a.all().keys.sorted() == ["download/2"])
        #expect(try await b.get("download/1") == [0, 1, 2, 255])
    }

    @Test func theRecordTableIsANewNamedMigration() throws {
        #expect(SurvivalSchema.migrationNames.prefix(2) == ["v1-run-heartbeat-gap-leaseSpan-event", "v2-strategyRecord"])
    }

    @Test func detachedContextsKeepRecordsInMemory() async throws {
        let store = MemoryStrategyStore()
        try await store.put("k", [1])
        #expect(try await store.all() == ["k": [1]])
        let bus = DetachedStrategyBus(objectPath: "/org/vigil/Vigil1/Strategy/x")
        try await bus.register(APIInterface("org.example.X", objects: bus.objectPath), methods: [])
        let object = try await bus.exportObject(relativePath: "Item/1", interface: "org.example.Item", properties: [], values: [:])
        #expect(object.path == "/org/vigil/Vigil1/Strategy/x/Item/1")
    }
}
