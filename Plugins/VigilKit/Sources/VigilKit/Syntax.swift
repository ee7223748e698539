/// A malformed duration or size, with a message fit for a config error.
public struct SyntaxError: Error, Hashable, Sendable {
    public var message: String
}

/// The duration notation of Vigil configs: one or more `<number><unit>` parts,
/// units `d`, `h`, `m`, `s`, `ms`, `us`, `ns`; e.g. `"90s"`, `"25m"`,
/// `"1h30m"`, `"1.5s"`, `"250ms"`. No sign: negative durations make no sense.
public enum DurationSyntax {
    private static let units: [(String, Int64)] = [
        ("ns", 1), ("us", 1_000), ("µs", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000),
        ("m", 60_000_000_000), ("h", 3_600_000_000_000), ("d", 86_400_000_000_000),
    ]

    public static func parse(_ text: String) -> Result<Duration, SyntaxError> {
        let s = text.trimmingWhitespace
        let example = "expected a duration such as \"90s\", \"25m\" or \"1h30m\", found \"\(text)\""
        if s.hasPrefix("-") { return .failure(SyntaxError(message: "expected a non-negative duration, found \"\(text)\"")) }
        guard !s.isEmpty else { return .failure(SyntaxError(message: example)) }
        var total: Double = 0
        var rest = Substring(s)
        while !rest.isEmpty {
            let number = rest.prefix { $0.isNumber || $0 == "." }
            guard !number.isEmpty, let value = Double(number) else { return .failure(SyntaxError(message: example)) }
            rest = rest.dropFirst(number.count)
            let unitText = rest.prefix { $0.isLetter }
            guard let unit = units.first(where: { $0.0 == unitText }) else {
                let msg = unitText.isEmpty
                    ? "missing unit in \"\(text)\": write e.g. \"\(number)s\" (units: d, h, m, s, ms, us, ns)"
                    : "unknown unit \"\(unitText)\" in \"\(text)\" (units: d, h, m, s, ms, us, ns)"
                return .failure(SyntaxError(message: msg))
            }
            rest = rest.dropFirst(unitText.count)
            total += value * Double(unit.1)
        }
        guard total < 9.2e18 else { return .failure(SyntaxError(message: "duration \"\(text)\" is too long")) }
        return .success(.nanoseconds(Int64(total.rounded())))
    }

    /// The shortest notation `parse` reads back: "1h30m", "90ms", "0s".
    public static func format(_ d: Duration) -> String {
        var ns = d.nanoseconds
        if ns == 0 { return "0s" }
        var out = ns < 0 ? "-" : ""
        ns = ns.magnitude > Int64.max.magnitude ? Int64.max : abs(ns)
        for (name, size) in [("d", Int64(86_400_000_000_000)), ("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000), ("ns", 1)] where ns >= size {
            out += "\(ns / size)\(name)"
            ns %= size
        }
        return out
    }

    /// A duration for people, as every log line, `vigilctl` and the docs
    /// write it: at most two units, rounded, e.g. "3m47s", "1h02m",
    /// "2d05h", "42s", "1.5s", "814ms", "66us". `parse` reads it back
    /// (approximately: exact values are in `--json` and the metrics).
    public static func human(_ d: Duration) -> String {
        let ns = d.nanoseconds
        if ns < 0 { return "-" + human(.nanoseconds(ns == .min ? .max : -ns)) }
        // The unit the value is rounded to: the smaller of the two shown.
        func grain(_ n: Int64) -> Int64 {
            switch n {
            case 86_400_000_000_000...: 3_600_000_000_000
            case 3_600_000_000_000...: 60_000_000_000
            case 60_000_000_000...: 1_000_000_000
            case 10_000_000_000...: 1_000_000_000
            case 1_000_000_000...: 100_000_000
            case 1_000_000...: 1_000_000
            case 1_000...: 1_000
            default: 1
            }
        }
        let g = grain(ns)
        let (sum, overflow) = ns.addingReportingOverflow(g / 2)
        // Rounding up may reach the next range (59.6s: 1m); the rounded
        // value is a whole number of that range's grain too.
        let n = overflow ? ns / g * g : sum / g * g
        func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        func pair(_ big: Int64, _ bigName: String, _ small: Int64, _ smallName: String) -> String {
            n % big == 0 ? "\(n / big)\(bigName)" : "\(n / big)\(bigName)\(two(n % big / small))\(smallName)"
        }
        switch n {
        case 0: return "0s"
        case 86_400_000_000_000...: return pair(86_400_000_000_000, "d", 3_600_000_000_000, "h")
        case 3_600_000_000_000...: return pair(3_600_000_000_000, "h", 60_000_000_000, "m")
        case 60_000_000_000...: return pair(60_000_000_000, "m", 1_000_000_000, "s")
        case 10_000_000_000...: return "\(n / 1_000_000_000)s"
        case 1_000_000_000...:
            let tenths = n / 100_000_000
            return tenths % 10 == 0 ? "\(tenths / 10)s" : "\(tenths / 10).\(tenths % 10)s"
        case 1_000_000...: return "\(n / 1_000_000)ms"
        case 1_000...: return "\(n / 1_000)us"
        default: return "\(n)ns"
        }
    }
}

/// Byte sizes: an integer with an optional unit, `B`, `k`/`KB` (1000),
/// `KiB` (1024), `M`/`MB`, `MiB`, `G`/`GB`, `GiB`, `T`/`TB`, `TiB`.
public enum ByteSizeSyntax {
    private static let units: [String: Int64] = [
        "": 1, "b": 1,
        "k": 1_000, "kb": 1_000, "kib": 1 << 10,
        "m": 1_000_000, "mb": 1_000_000, "mib": 1 << 20,
        "g": 1_000_000_000, "gb": 1_000_000_000, "gib": 1 << 30,
        "t": 1_000_000_000_000, "tb": 1_000_000_000_000, "tib": 1 << 40,
    ]

    public static func parse(_ text: String) -> Result<Int64, SyntaxError> {
        let s = text.trimmingWhitespace
        if s.hasPrefix("-") { return .failure(SyntaxError(message: "expected a non-negative byte size, found \"\(text)\"")) }
        let number = s.prefix { $0.isNumber || $0 == "." }
        let unit = s.dropFirst(number.count).trimmingWhitespace.lowercased()
        guard let value = Double(number), let scale = units[unit] else {
            return .failure(SyntaxError(message: "expected a byte size such as \"64KiB\", \"10MB\" or 4096, found \"\(text)\""))
        }
        let bytes = value * Double(scale)
        guard bytes < 9.2e18 else { return .failure(SyntaxError(message: "byte size \"\(text)\" is too large")) }
        return .success(Int64(bytes.rounded()))
    }
}

/// Did-you-mean suggestions for misspelled keys and kinds.
public enum Spelling {
    /// The candidate closest to `word` by edit distance, if close enough to be
    /// a plausible typo (at most a third of the word's length, minimum 1).
    public static func suggestion(for word: String, among candidates: some Sequence<String>) -> String? {
        let limit = max(1, word.count / 3)
        var best: (String, Int)?
        for c in candidates {
            let d = distance(word.lowercased(), c.lowercased())
            if d <= limit, d < (best?.1 ?? .max) { best = (c, d) }
        }
        return best?.0
    }

    /// Levenshtein distance with adjacent transpositions counted as one edit.
    public static func distance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var prev2 = [Int](repeating: 0, count: b.count + 1)
        var prev = Array(0...b.count)
        var cur = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            cur[0] = i
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    cur[j] = min(cur[j], prev2[j - 2] + 1)
                }
            }
            (prev2, prev, cur) = (prev, cur, prev2)
        }
        return prev[b.count]
    }
}

extension StringProtocol {
    var trimmingWhitespace: String {
        String(drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }
}
