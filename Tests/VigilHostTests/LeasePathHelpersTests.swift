import Foundation
import Testing
import VigilHost
import VigilKit

/// The helpers every BeginBackgroundTask goes through (ClientText's
/// excerpt, the caller's executable, an array's bus value), made cheaper for
/// the lease figure: each still says what it said before.
@Suite("Per-lease helpers")
struct LeasePathHelpersTests {
    @Test func excerptKeepsTextUpToTheLimitAndCutsBeyondIt() {
        let long = String(repeating: "x", count: 200)
        #expect(ClientText.excerpt(long) == String(repeating: "x", count: ClientText.excerptLimit) + "…")
        let exact = String(repeating: "y", count: ClientText.excerptLimit)
        #expect(ClientText.excerpt(exact) == exact)
        #expect(ClientText.excerpt("") == "")
        #expect(ClientText.excerpt("/usr/bin/vigilctl") == "/usr/bin/vigilctl")
    }

    @Test func excerptCountsEscapesAtTheirShownWidth() {
        #expect(ClientText.excerpt("a\nb") == "a\\nb")
        // "ab" is 2, the escape "\n" 2 more: past a limit of 3, so cut before it.
        #expect(ClientText.excerpt("ab\nc", limit: 3) == "ab…")
        #expect(ClientText.excerpt("ab\nc", limit: 4) == "ab\\n…")
        #expect(ClientText.excerpt("ab\nc", limit: 5) == "ab\\nc")
        // Scalars, not bytes: four two-byte letters fill a limit of 4.
        #expect(ClientText.excerpt("éééé", limit: 4) == "éééé")
        #expect(ClientText.excerpt("ééééé", limit: 4) == "éééé…")
    }

    @Test func executableIsTheTargetOfProcExe() throws {
        let expected = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        #expect(InhibitCaller.executable(of: UInt32(getpid())) == expected)
        #expect(InhibitCaller.executable(of: 0) == nil)
        // Past pid_max: no such process.
        #expect(InhibitCaller.executable(of: UInt32(Int32.max)) == nil)
    }

    @Test func anArrayIsItsElementsBusValues() {
        #expect(["a", "b"].busValue == .array(elementSignature: "s", [.string("a"), .string("b")]))
        #expect([UInt32]().busValue == .array(elementSignature: "u", []))
        #expect([["k": UInt32(1)]].busValue
            == .array(elementSignature: "a{su}", [.dict(keySignature: "s", valueSignature: "u", [BusDictEntry(key: .string("k"), value: .uint32(1))])]))
    }
}
