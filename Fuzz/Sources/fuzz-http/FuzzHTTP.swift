// download-session's reading of an HTTP response (Plugins/DownloadSession/
// ResponseHead.swift): the status line and header fields as libcurl hands
// them over one line at a time, Content-Range and Content-Length against a
// resume, and Retry-After (HTTPDate). Input: lines separated by LF; a line "@N" sets
// the resume offset to N.
@testable import DownloadSession

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    var head = ResponseHead()
    var resumeFrom: Int64 = 0
    for line in input.split(separator: 0x0A, omittingEmptySubsequences: false) {
        if line.first == UInt8(ascii: "@"), let offset = Int64(String(decoding: line.dropFirst(), as: UTF8.self)) {
            resumeFrom = offset
            continue
        }
        (Array(line) + [0x0D, 0x0A]).withUnsafeBytes { head.take(line: $0) }
    }
    _ = head.status
    // The expected total as the first response gave it (any length; twice
    // the offset where that fits, so that the check can also pass).
    let (twice, overflow) = resumeFrom.multipliedReportingOverflow(by: 2)
    _ = head.partialContentProblem(resumeFrom: resumeFrom, expectedTotal: resumeFrom > 0 ? (overflow ? Int64.max : twice) : nil)
    _ = head.totalLength(resumeFrom: resumeFrom)
    _ = ResponseHead.completeLength(head["content-range"])
    if let retryAfter = head["retry-after"] {
        _ = RetryAfter.parse(retryAfter, nowWallMicros: 1_700_000_000_000_000)
        // A date reads as a second of years 1 to 9999, nothing else.
        if let seconds = HTTPDate.secondsSinceEpoch(retryAfter) {
            precondition((-62_135_596_800...253_402_300_799).contains(seconds), "\(retryAfter) read as \(seconds)")
        }
    }
    return 0
}
