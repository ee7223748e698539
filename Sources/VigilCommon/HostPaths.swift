import Foundation

/// Where Vigil keeps its files when the config does not say.
public enum HostPaths {
    /// The default state directory: `/var/lib/vigil` for root, else
    /// `$XDG_STATE_HOME/vigil` or `~/.local/state/vigil`. `$VIGIL_STATE_DIR`
    /// overrides all of them.
    public static func defaultStateDir(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let dir = environment["VIGIL_STATE_DIR"], !dir.isEmpty { return dir }
        if getuid() == 0 { return "/var/lib/vigil" }
        if let xdg = environment["XDG_STATE_HOME"], xdg.hasPrefix("/") { return xdg + "/vigil" }
        let home = environment["HOME"] ?? NSHomeDirectory()
        return home + "/.local/state/vigil"
    }

    /// The survival log inside a state directory.
    /// Where vigild looks for its config when given none, in order:
    /// `/etc/vigil/vigil.toml` for root, else the user's then the system's.
    public static func defaultConfigCandidates(environment env: [String: String] = ProcessInfo.processInfo.environment) -> [String] {
        getuid() == 0
            ? ["/etc/vigil/vigil.toml"]
            : [(env["XDG_CONFIG_HOME"] ?? NSHomeDirectory() + "/.config") + "/vigil/vigil.toml", "/etc/vigil/vigil.toml"]
    }

    /// The config to use when none is given: `$VIGIL_CONFIG`, else the first
    /// of ``defaultConfigCandidates(environment:)`` that exists; nil and the
    /// places looked at when there is none.
    public static func defaultConfig(environment env: [String: String] = ProcessInfo.processInfo.environment) -> (path: String?, candidates: [String]) {
        if let path = env["VIGIL_CONFIG"], !path.isEmpty { return (path, [path]) }
        let candidates = defaultConfigCandidates(environment: env)
        return (candidates.first { FileManager.default.fileExists(atPath: $0) }, candidates)
    }

    public static func survivalStore(stateDir: String) -> String {
        (stateDir as NSString).appendingPathComponent("survival.sqlite")
    }
}
