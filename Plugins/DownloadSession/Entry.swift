import VigilKit

@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([DownloadSessionKind()])
}
