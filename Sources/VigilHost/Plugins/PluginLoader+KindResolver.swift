import Foundation
import VigilKit

extension PluginLoader: KindResolver {
    public func resolve(kind: String) -> Result<any StrategyKind, KindResolutionError> {
        loadKind(kind).mapError { KindResolutionError($0.message) }
    }
}

extension ConfigLoader {
    /// Reads a config, loads exactly the plugins its strategies name (on the
    /// search path built from `$VIGIL_PLUGIN_PATH` and `[host] plugin_path`)
    /// and validates everything. What vigild and `vigilctl check-config` use.
    public static func loadWithPlugins(
        path: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigError) -> (config: VigilConfig, plugins: PluginLoader) {
        let document = try loadDocument(path: path)
        let plugins = PluginLoader(searchPath: PluginLoader.defaultSearchPath(configured: document.host.pluginPath, environment: environment))
        switch validate(document, resolver: plugins) {
        case .success(let config): return (config, plugins)
        case .failure(let error): throw error
        }
    }
}
