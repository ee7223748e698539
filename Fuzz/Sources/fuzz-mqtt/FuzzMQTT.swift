// MQTT packet framing (Plugins/VoipSocket/Framing.swift, MQTT.swift): what a
// broker sends, split into reads at places the input chooses, then every
// control packet through the CONNACK, SUBACK and properties readers.
// Input: byte 0 picks the version (bit 0) and the read size (bits 1...);
// the rest is the stream.
@testable import VoipSocket
import VoipFeed

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMQTT(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let version: MQTTSettings.Version = data[0] & 1 == 0 ? .v311 : .v5
    let stream = UnsafeRawBufferPointer(start: data + 1, count: size - 1)
    for packet in controlFrames(wire: "mqtt", mqttVersion5: version == .v5, stream: stream, readSize: Int(data[0] >> 1)) {
        _ = MQTTPacket.connack(packet, version: version)
        _ = MQTTPacket.subackRefusal(packet, topics: ["a/b", "c"], packetID: 1, version: version)
        _ = MQTTPacket.describe(packet)
        _ = MQTTProperties(packet.dropFirst())
    }
    return 0
}
