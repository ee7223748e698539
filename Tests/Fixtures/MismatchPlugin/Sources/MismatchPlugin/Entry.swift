@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    let header = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
    header.storeBytes(of: 0x4C47_4956 as UInt32, as: UInt32.self)   // "VIGL"
    header.storeBytes(of: 999 as UInt32, toByteOffset: 4, as: UInt32.self)   // SDK version 999
    header.storeBytes(of: 0 as UInt64, toByteOffset: 8, as: UInt64.self)     // never read
    return header
}
