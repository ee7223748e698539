import Foundation
import Testing
import VigilHost
import VigilKit

struct NamedKind: StrategyKind {
    var name: String
    var summary: String { "test kind" }
    func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy { Idle() }
    struct Idle: KeepAliveStrategy {
        func run(in context: StrategyContext) async throws {}
    }
}

@Suite struct PluginLoaderTests {
    @Test func twoPluginsClaimingOneKindIsAnError() throws {
        let loader = PluginLoader(searchPath: [])
        try loader.register([NamedKind(name: "a"), NamedKind(name: "b")], from: "/opt/one/libvigil-a.so")
        #expect(throws: PluginLoadError.self) {
            try loader.register([NamedKind(name: "b")], from: "/opt/two/libvigil-b.so")
        }
        do {
            try loader.register([NamedKind(name: "b")], from: "/opt/two/libvigil-b.so")
        } catch {
            #expect(error.code == .kindConflict)
            #expect(error.message == "two plugins claim kind \"b\": /opt/one/libvigil-a.so and /opt/two/libvigil-b.so")
        }
    }

    @Test func missingLibraryNamesTheSearchPath() {
        let loader = PluginLoader(searchPath: ["/nonexistent/one", "/nonexistent/two"])
        guard case .failure(let error) = loader.loadKind("sync-thing") else {
            Issue.record("loaded a kind that has no library")
            return
        }
        #expect(error.code == .notFound)
        #expect(error.message == "no plugin for kind \"sync-thing\": libvigil-sync-thing.so is not in any of /nonexistent/one, /nonexistent/two")
    }

    @Test func kindNamesCannotEscapeTheSearchPath() {
        let loader = PluginLoader(searchPath: ["/tmp"])
        guard case .failure(let error) = loader.loadKind("../etc/x") else {
            Issue.record("accepted a path as a kind")
            return
        }
        #expect(error.code == .invalidKindName)
    }

    @Test func unnamedKindsAreNeverLoaded() throws {
        // The build directory holds libvigil-periodic-wake.so; listing
        // available kinds must not load it.
        let loader = PluginLoader(searchPath: [try #require(PluginLoader.executableDirectory())])
        #expect(loader.availableKinds().contains("periodic-wake"))
        #expect(loader.registeredKinds.isEmpty)
    }

    @Test func searchPathOrder() {
        let path = PluginLoader.defaultSearchPath(configured: ["/cfg"], environment: ["VIGIL_PLUGIN_PATH": "/env1:/env2"])
        #expect(Array(path.prefix(3)) == ["/env1", "/env2", "/cfg"])
        #expect(Array(path.suffix(2)) == ["/usr/local/lib/vigil/plugins", "/usr/lib/vigil/plugins"])
    }
}
