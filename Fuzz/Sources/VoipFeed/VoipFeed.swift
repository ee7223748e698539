// What fuzz-mqtt and fuzz-sip share: a peer's byte stream fed to a
// voip-socket framer in reads of a given size, as the event thread feeds it.
@testable import VoipSocket

/// The control frames (MQTT packets other than PUBLISH and PINGRESP, SIP
/// responses) that `stream` yields in reads of `readSize` bytes, with a
/// ping out; framing errors end the stream, as they end a link.
/// `wire`: "mqtt" or "sip"; `mqttVersion5`: MQTT 5 rather than 3.1.1.
public func controlFrames(wire: String, mqttVersion5: Bool = false, stream: UnsafeRawBufferPointer, readSize: Int) -> [[UInt8]] {
    guard let wire = WireProtocol(rawValue: wire) else { return [] }
    var framer = FramingOptions(wire: wire, mqttVersion: mqttVersion5 ? .v5 : .v311).makeFramer()
    var awaitingPong = true
    var frames: [Frame] = []
    var offset = 0
    do {
        while offset < stream.count {
            let end = min(stream.count, offset + max(1, readSize))
            try framer.feed(UnsafeRawBufferPointer(rebasing: stream[offset..<end]), awaitingPong: &awaitingPong, into: &frames)
            offset = end
        }
    } catch {
        _ = error.description
    }
    return frames.compactMap { frame in
        if case let .control(bytes) = frame { return bytes }
        return nil
    }
}
