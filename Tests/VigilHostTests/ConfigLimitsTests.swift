import Foundation
import Testing
import VigilKit
@testable import VigilHost

/// The documented limits of a config file (docs/configuration.md, "Limits"):
/// inputs past them get one clear problem instead of a crash.
@Suite("Config limits")
struct ConfigLimitsTests {
    static func dotted(_ parts: Int) -> String {
        (0..<parts).map { "k\($0)" }.joined(separator: ".")
    }

    static func onlyProblem(_ text: String) throws -> ConfigProblem {
        let config = try TempConfig(text)
        let error = try #require(loadProblems(config.path))
        try #require(error.problems.count == 1, "\(error)")
        return error.problems[0]
    }

    @Test(arguments: [1_000, 100_000])
    func dottedKeyPastTheDepthLimit(parts: Int) throws {
        let problem = try Self.onlyProblem("[host]\nsurvival_interval = \"1s\"\n\(Self.dotted(parts)) = 1\n")
        #expect(problem.location?.line == 3)
        #expect(problem.location?.column == 1)
        #expect(problem.message.contains("key nests more than 64 levels deep"), "\(problem)")
        #expect(problem.message.contains("the limit is 64 levels"))
    }

    @Test(arguments: [1_000, 100_000])
    func tableHeaderPastTheDepthLimit(parts: Int) throws {
        let problem = try Self.onlyProblem("# a comment\n\n[\(Self.dotted(parts))]\nx = 1\n")
        #expect(problem.location?.line == 3)
        #expect(problem.message.contains("table header nests more than 64 levels deep"), "\(problem)")
    }

    @Test func arrayOfTablesHeaderPastTheLimit() throws {
        let problem = try Self.onlyProblem("[[\(Self.dotted(64))]]\n")
        #expect(problem.message.contains("table header nests more than 64"), "\(problem)")
    }

    @Test func headerAndKeyDepthsAddUp() throws {
        let problem = try Self.onlyProblem("[\(Self.dotted(40))]\n\(Self.dotted(25)) = 1\n")
        #expect(problem.location?.line == 2)
        #expect(problem.message.contains("key nests more than 64"), "\(problem)")
    }

    @Test func inlineTablesAndArraysCount() throws {
        let inline = String(repeating: "{a = ", count: 70) + "1" + String(repeating: "}", count: 70)
        let problem = try Self.onlyProblem("x = \(inline)\n")
        #expect(problem.message.contains("inline table nests more than 64"), "\(problem)")
        let arrays = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        #expect(try Self.onlyProblem("x = \(arrays)\n").message.contains("array nests more than 64"))
        // Dotted keys inside inline tables count too.
        let dottedInline = "x = {\(Self.dotted(70)) = 1}\n"
        #expect(try Self.onlyProblem(dottedInline).message.contains("key nests more than 64"))
    }

    /// Exactly at the limit the file is parsed as usual: the problem is then
    /// about the content (an unknown top-level table), not the depth.
    @Test func depthAtTheLimitIsParsed() throws {
        let problem = try Self.onlyProblem("\(Self.dotted(64)) = 1\n")
        #expect(problem.message.contains("unknown top-level table \"k0\""), "\(problem)")
    }

    /// Strings, comments and multi-line values are skipped, so dots inside
    /// them are not mistaken for key parts.
    @Test func dotsInStringsAndCommentsDoNotCount() throws {
        let many = String(repeating: "a.", count: 500)
        let text = """
            # \(many)
            [host]
            survival_interval = "1s" # \(many)
            state_dir = "/tmp/\(many)"

            [[strategy]]
            name = "s"
            kind = "test-echo"
            message = \"\"\"
            [\(many)]
            \(many) = 1
            \"\"\"
            size = '\(many)'
            """
        let config = try TempConfig(text)
        let error = loadProblems(config.path)
        #expect(error == nil || !(error?.description.contains("levels deep") ?? false), "\(String(describing: error))")
    }

    @Test func nulEscapeIsRefused() throws {
        let problem = try Self.onlyProblem("[[strategy]]\nname = \"a\\u0000b\"\nkind = \"test-echo\"\nmessage = \"m\"\n")
        #expect(problem.location?.line == 2)
        #expect(problem.message.contains("NUL character"), "\(problem)")
    }

    /// Fuzz/Corpus/fuzz-config/regression-control-character-in-header made
    /// toml++ abort on an assertion in parse_key (debug builds); a raw NUL
    /// cut the document short.
    @Test(arguments: [
        ("[\u{13}host]\nstate_dir = \"/tmp\"\n", 2, "U+0013"),
        ("[host]\nstate_dir = \"/tmp\"\u{0}\n[[strategy]]\n", 19, "U+0000"),
        ("# comment \u{1B}[31m\n", 11, "U+001B"),
        ("a = 1\r\nb = \"x\ry\"\n", 7, "U+000D"),
    ])
    func rawControlCharactersAreRefused(text: String, column: Int, code: String) throws {
        let problem = try Self.onlyProblem(text)
        #expect(problem.location?.column == column, "\(problem)")
        #expect(problem.message.contains("control character \(code) is not allowed in TOML"), "\(problem)")
    }

    /// Fuzz/Corpus/fuzz-config/regression-header-first-character: toml++
    /// asserts that a table header's first key starts with a bare-key
    /// character or a quote.
    /// After a byte-order mark too (regression-header-after-bom: the
    /// precheck read the mark as a key and skipped the line).
    @Test(arguments: ["[!]\n", "[.]\n", "[ =]\n", "[[\u{E9}]]\n", "[\u{FFFD}strategy]\nname = \"a\"\n", "\u{FEFF} [ }\n", "\u{FEFF}[!]\n"])
    func tableHeadersMustStartWithAKey(text: String) throws {
        let problem = try Self.onlyProblem(text)
        #expect(problem.location?.line == 1, "\(problem)")
        #expect(problem.message.contains("a table header must start with a key"), "\(problem)")
    }

    /// Fuzz/Corpus/fuzz-config/regression-array-value-terminator: toml++
    /// asserts that an array element does not start with `}` or a Unicode
    /// line break; vigild (release builds too) aborted on `a = [ }`.
    @Test(arguments: [
        ("a = [ }\n", 1, 7, "\"}\""),
        ("a = [ 1, }, 2 ]\n", 1, 10, "\"}\""),
        ("a = [\n  # a comment\n  }\n]\n", 3, 3, "\"}\""),
        ("[host]\nplugin_path = [[ }]]\n", 2, 18, "\"}\""),
        ("a = [\u{2028} 1]\n", 1, 6, "U+2028"),
        ("a = [1,\u{2029}]\n", 1, 8, "U+2029"),
        ("a = [\u{85} 1]\n", 1, 6, "U+0085"),
    ])
    func arrayElementsMustStartWithAValue(text: String, line: Int, column: Int, found: String) throws {
        let problem = try Self.onlyProblem(text)
        #expect(problem.location?.line == line && problem.location?.column == column, "\(problem)")
        #expect(problem.message.hasPrefix("an array holds \(found)"), "\(problem)")
        #expect(problem.message.hasSuffix("where a value or \"]\" belongs"), "\(problem)")
    }

    /// What TOML allows is still parsed: braces and line separators in
    /// strings and comments, inline tables in arrays, empty arrays.
    @Test func bracesAndLineSeparatorsInStringsAndCommentsPass() throws {
        let config = try TempConfig("""
            [host]
            plugin_path = ["}", '}', \"\"\"}\u{2028}\"\"\", [] ] # } \u{2028}
            [[strategy]]
            name = "a"
            kind = "test-echo"
            message = "[ }"
            """)
        let error = loadProblems(config.path)
        #expect(error == nil || !error!.problems.contains { $0.message.contains("an array holds") }, "\(String(describing: error))")
    }

    @Test(arguments: [
        ("a\\nnotice vigild: run 1 ended: stopped", "a newline (U+000A) at character 2"),
        ("bell\\u001b[31m", "an escape character (U+001B) at character 5"),
        ("tab\\there", "a tab (U+0009)"),
        ("rtl\\u202Eoverride", "a non-printable character (U+202E)"),
    ])
    func namesMustBePrintable(name: String, reason: String) throws {
        let problem = try Self.onlyProblem("[[strategy]]\nname = \"\(name)\"\nkind = \"test-echo\"\nmessage = \"m\"\n")
        #expect(problem.keyPath == "strategy[0].name")
        #expect(problem.message.contains(reason), "\(problem)")
        #expect(problem.message.contains("names must be printable text"))
    }

    @Test func namesAreBounded() throws {
        let long = String(repeating: "n", count: 129)
        let problem = try Self.onlyProblem("[[strategy]]\nname = \"\(long)\"\nkind = \"test-echo\"\nmessage = \"m\"\n")
        #expect(problem.message == "name is 129 bytes long; the limit is 128 bytes")
        let config = try TempConfig("[[strategy]]\nname = \"\(long.dropLast())\"\nkind = \"test-echo\"\nmessage = \"m\"\n")
        #expect(try load(config.path).strategies.map(\.name) == [String(long.dropLast())])
    }

    @Test func fileSizeIsBounded() throws {
        let filler = "# " + String(repeating: "x", count: 1022) + "\n"
        let config = try TempConfig(String(repeating: filler, count: 2049))
        let problem = try #require(loadProblems(config.path)?.problems.first)
        #expect(problem.message == "config file is larger than 2097152 bytes; the limit is 2 MiB", "\(problem)")
    }

    @Test func strategyCountIsBounded() throws {
        let config = try TempConfig(String(repeating: "[[strategy]]\n", count: ConfigLimits.maxStrategies + 1))
        let error = try #require(loadProblems(config.path))
        #expect(error.problems.count == 1)
        #expect(error.problems[0].message == "10001 [[strategy]] tables; the limit is 10000 per file", "\(error)")
    }

    /// Past 100 problems the rest are counted, not listed, and text from the
    /// file is escaped before it reaches a terminal.
    @Test func reportIsBoundedAndEscaped() throws {
        let keys = (0..<500).map { "unknown\($0) = 1" }.joined(separator: "\n")
        let config = try TempConfig("[host]\n\"esc\\u001b[2Jkey\" = 1\n\(keys)\n")
        let error = try #require(loadProblems(config.path))
        #expect(error.problems.count == 501)
        let lines = error.description.split(separator: "\n")
        #expect(lines.count == 102)
        #expect(lines[100] == "... and 401 more problems not shown (at most 100 are listed)")
        #expect(lines[101].hasSuffix("501 problems in \(config.path)"))
        #expect(lines[0].contains("unknown key \"esc\\e[2Jkey\""), "\(lines[0])")
        #expect(!error.description.contains("\u{1B}"))
    }

    @Test func terminalEscapes() {
        #expect(TerminalText.escaped("plain ünïcode") == "plain ünïcode")
        #expect(TerminalText.escaped("a\nb\r\t\u{1B}[0m\u{0}\u{7F}") == "a\\nb\\r\\t\\e[0m\\u{0}\\u{7F}")
    }
}
