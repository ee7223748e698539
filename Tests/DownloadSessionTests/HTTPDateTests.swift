import Testing
@testable import DownloadSession

/// `Retry-After` dates from the server (RFC 9110 §5.6.7), read without
/// Foundation's DateFormatter, which stops the process on some non-ASCII.
@Suite struct HTTPDateTests {
    /// 1994-11-06 08:49:37 UTC, RFC 9110's own example.
    static let example: Int64 = 784_111_777

    @Test func theThreeFormsOfRFC9110Agree() {
        #expect(HTTPDate.secondsSinceEpoch("Sun, 06 Nov 1994 08:49:37 GMT") == Self.example)
        #expect(HTTPDate.secondsSinceEpoch("Sunday, 06-Nov-94 08:49:37 GMT") == Self.example)
        #expect(HTTPDate.secondsSinceEpoch("Sun Nov  6 08:49:37 1994") == Self.example)
    }

    @Test func calendarEdges() {
        #expect(HTTPDate.secondsSinceEpoch("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
        #expect(HTTPDate.secondsSinceEpoch("Wed, 31 Dec 1969 23:59:59 GMT") == -1)
        #expect(HTTPDate.secondsSinceEpoch("Tue, 29 Feb 2000 12:00:00 GMT") == 951_825_600)
        #expect(HTTPDate.secondsSinceEpoch("Sat, 28 Nov 2026 08:00:00 GMT") == 1_795_852_800)
        #expect(HTTPDate.secondsSinceEpoch("Fri, 31 Dec 9999 23:59:59 GMT") == 253_402_300_799)
        #expect(HTTPDate.secondsSinceEpoch("Mon, 01 Jan 0001 00:00:00 GMT") == -62_135_596_800)
        // A leap second is a valid time of day.
        #expect(HTTPDate.secondsSinceEpoch("Sat, 31 Dec 2016 23:59:60 GMT") == 1_483_228_800)
        #expect(HTTPDate.secondsSinceEpoch("Thu, 01-Jan-70 00:00:00 GMT") == nil)  // the long name is required
        #expect(HTTPDate.secondsSinceEpoch("Thursday, 01-Jan-70 00:00:00 GMT") == 0)
        #expect(HTTPDate.secondsSinceEpoch("Thursday, 01-Jan-49 00:00:00 GMT") == 2_493_072_000)
        #expect(HTTPDate.secondsSinceEpoch("Thu Jan 15 00:00:00 1970") == 1_209_600)
    }

    @Test(arguments: [
        "",
        "2",
        "Wed, 21\u{07B0}ct 2015 07:28:00 WMT",  // fuzz-http's crash input
        "Wed, 21 Oct 2015 07:28:00 WMT",
        "Wed, 21 Oct 2015 07:28:00 gmt",
        "Wed, 21 oct 2015 07:28:00 GMT",
        "Wed, 21 Oct 2015 07:28:00 GMT ",
        "Wed, 21 Oct 15 07:28:00 GMT",
        "Wed, 1 Oct 2015 07:28:00 GMT",
        "Wed,21 Oct 2015 07:28:00 GMT",
        "Xyz, 21 Oct 2015 07:28:00 GMT",
        "Wed, 30 Feb 2016 07:28:00 GMT",
        "Wed, 29 Feb 2100 07:28:00 GMT",
        "Wed, 31 Apr 2015 07:28:00 GMT",
        "Wed, 00 Oct 2015 07:28:00 GMT",
        "Wed, 21 Oct 0000 07:28:00 GMT",
        "Wed, 21 Oct 2015 24:00:00 GMT",
        "Wed, 21 Oct 2015 07:60:00 GMT",
        "Wed, 21 Oct 2015 07:28:61 GMT",
        "Wed, 21 Oct 2015 7:28:00 GMT",
        "Wed, 21 Oct 2015 07:28 GMT",
        "Wed, 21 Oct +015 07:28:00 GMT",
        "Wednesday, 21 Oct 2015 07:28:00 GMT",
        "Wed Oct 21 07:28:00 15",
        "Wed Oct 21 07:28:00 2015 GMT",
        "Wed\u{2028}Oct 21 07:28:00 2015",
    ])
    func anythingElseIsNil(_ text: String) {
        #expect(HTTPDate.secondsSinceEpoch(text) == nil)
    }

    @Test func retryAfterIsSecondsOrADate() {
        let now: Int64 = 784_111_777 * 1_000_000
        #expect(RetryAfter.parse(" 120 ", nowWallMicros: now) == .seconds(120))
        #expect(RetryAfter.parse("99999999999999999999999", nowWallMicros: now) == .seconds(Int64.max))
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:50:07 GMT", nowWallMicros: now) == .seconds(30))
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:00:00 GMT", nowWallMicros: now) == .zero)
        #expect(RetryAfter.parse("-5", nowWallMicros: now) == nil)
        #expect(RetryAfter.parse("+5", nowWallMicros: now) == nil)
        #expect(RetryAfter.parse("Wed, 21\u{07B0}ct 2015 07:28:00 WMT", nowWallMicros: now) == nil)
    }
}
