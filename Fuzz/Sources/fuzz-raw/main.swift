// voip-socket's `protocol = "raw"` framing (Plugins/VoipSocket/Framing.swift):
// a peer's bytes, split into reads at places the input chooses, with a pong
// awaited and an optional delimiter. Beyond not crashing, it checks what the
// framer promises: every byte that is not the pong reaches `on_data` once,
// in order, so the data frames with the one pong put back where it was
// recognised give back the stream (but for a pong candidate still held at
// its end, never longer than the pong).
// Input: byte 0 the read size, byte 1 the pong's length (0-7), byte 2 the
// delimiter's length (0-3), then the pong, the delimiter and the stream.
@testable import VoipSocket

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRaw(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 3 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let readSize = max(1, Int(bytes[0]))
    let expectCount = Int(bytes[1] & 7), delimiterCount = Int(bytes[2] & 3)
    guard size >= 3 + expectCount + delimiterCount else { return 0 }
    let expect = Array(bytes[3..<(3 + expectCount)])
    let delimiter = Array(bytes[(3 + expectCount)..<(3 + expectCount + delimiterCount)])
    let stream = Array(bytes[(3 + expectCount + delimiterCount)...])

    var framer = RawFramer(expect: expect, delimiter: delimiter)
    framer.pingSent()
    var awaitingPong = !expect.isEmpty
    var frames: [Frame] = []
    stream.withUnsafeBytes { all in
        var offset = 0
        while offset < all.count {
            let end = min(all.count, offset + readSize)
            framer.feed(UnsafeRawBufferPointer(rebasing: all[offset..<end]), awaitingPong: &awaitingPong, into: &frames)
            offset = end
        }
    }
    var rebuilt: [UInt8] = []
    var pongs = 0
    for frame in frames {
        switch frame {
        case .data(let frame):
            precondition(!frame.bytes.isEmpty && frame.variables.isEmpty, "raw data frames carry bytes only")
            rebuilt += frame.bytes
        case .pong:
            pongs += 1
            rebuilt += framer.pong
        case .control:
            preconditionFailure("the raw framer yields no control frames")
        }
    }
    precondition(pongs <= 1, "one ping, \(pongs) pongs")
    precondition(pongs == 0 || !awaitingPong, "a pong was recognised but is still awaited")
    precondition(rebuilt.count <= stream.count && Array(stream.prefix(rebuilt.count)) == rebuilt,
                 "the frames are not the stream: bytes lost, repeated or reordered")
    precondition(stream.count - rebuilt.count <= framer.pong.count, "more bytes held back than a pong's length")
    return 0
}
