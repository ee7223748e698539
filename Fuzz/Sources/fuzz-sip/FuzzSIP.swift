// SIP message framing and the REGISTER reply parser (Plugins/VoipSocket/
// Framing.swift, SIP.swift): what a registrar sends, split into reads at
// places the input chooses; each response is then read as the strategy
// reads a reply to its REGISTER. Thin on purpose: it calls only what the
// strategy calls. Input: byte 0 is the read size; the rest is the stream.
@testable import VoipSocket
import VoipFeed

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSIP(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let stream = UnsafeRawBufferPointer(start: data + 1, count: size - 1)
    let responses = controlFrames(wire: "sip", stream: stream, readSize: Int(data[0]))
    let settings = SIPSettings(aor: "sip:alice@example.org", registrar: "sip:example.org", password: "secret", instanceID: "00000000-0000-0000-0000-000000000001")
    var registration = SIPRegistration(settings: settings, transport: "tcp")
    _ = registration.request(local: "127.0.0.1:5060", password: "secret")
    for bytes in responses {
        // As VoipSocket.register reads a reply.
        let head = SIPFramer.headerEnd(bytes, from: 0).map { String(decoding: bytes[..<$0], as: UTF8.self) } ?? ""
        let response = SIPMessage(head: head)
        _ = registration.answers(response)
        _ = (response.statusCode, response.reason, response.header("min-expires"))
        // A reply that lists no binding of ours is refused with an error.
        if let granted = try? registration.granted(by: response) {
            _ = renewalDelay(for: granted.expires)
        }
        if registration.take(challengeOf: response, hasPassword: true) {
            _ = registration.request(local: "127.0.0.1:5060", password: "secret")
        }
    }
    return 0
}
