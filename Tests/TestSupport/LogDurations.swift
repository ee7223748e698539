/// Log lines that write a duration in more than two units ("3m47s257ms",
/// "814ms66us507ns"): people read at most two ("3m47s", "814ms", "1h02m").
public func durationsOverTwoUnits(in lines: [String]) -> [String] {
    // Three number-and-unit parts in a row (units as the config writes
    // them), as a word of its own: not inside a hash or an id.
    let overTwoUnits = /\b\d+(?:\.\d+)?(?:ms|us|µs|ns|d|h|m|s)(?:\d+(?:ms|us|µs|ns|d|h|m|s)){2,}\b/
    // A UUID's last group can read as days ("…-15913d84d23d"), and so can
    // a long hex id: both are taken out before the check.
    let idLike = /[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}|\b[0-9A-Fa-f]{16,}\b/
    return lines.filter { $0.replacing(idLike, with: " ").contains(overTwoUnits) }
}
