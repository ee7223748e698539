import CVoipTLS

/// `[strategy.sip]`: the optional registration the flow carries.
struct SIPSettings: Sendable, Hashable {
    /// The address of record, "sip:alice@example.org"; nil: no REGISTER.
    var aor: String?
    /// The Request-URI of REGISTER, "sip:example.org" (default: the AOR's domain).
    var registrar: String = ""
    var expires: Duration = .seconds(600)
    /// Digest user name (default: the AOR's user part).
    var username: String?
    var password: String?
    var passwordFile: String?
    /// RFC 5626 outbound: `+sip.instance` and `reg-id` on the Contact,
    /// `Supported: outbound`.
    var outbound = true
    var instanceID = ""

    /// The user and host parts of "sip:user@host" (or "sips:").
    static func parts(of uri: String) -> (user: String, host: String)? {
        let lower = uri.lowercased()
        let rest: Substring
        if lower.hasPrefix("sip:") { rest = uri.dropFirst(4) } else if lower.hasPrefix("sips:") { rest = uri.dropFirst(5) } else { return nil }
        let hostPart = rest.split(separator: ";", maxSplits: 1).first ?? ""
        guard let at = hostPart.firstIndex(of: "@") else { return hostPart.isEmpty ? nil : ("", String(hostPart)) }
        let user = hostPart[..<at], host = hostPart[hostPart.index(after: at)...]
        guard !host.isEmpty, !user.isEmpty else { return nil }
        return (String(user), String(host))
    }
}

/// One registration of an AOR over one flow: REGISTER requests with a
/// stable Call-ID and From tag, rising CSeq, fresh Via branches, and digest
/// credentials once the registrar asked for them (RFC 3261 §10, RFC 5626 §4.2).
struct SIPRegistration: Sendable {
    let settings: SIPSettings
    /// "tcp" or "tls".
    let transport: String
    let callID = randomHex(16) + "@vigil"
    let fromTag = randomHex(8)
    private(set) var cseq: UInt32 = 0
    private var challenge: DigestChallenge?
    private var nonceCount: UInt32 = 0

    init(settings: SIPSettings, transport: String) {
        self.settings = settings
        self.transport = transport
    }

    /// Our Contact URI (the flow's local address), set by `request`.
    private(set) var contactURI = ""

    /// Our `+sip.instance` (RFC 5626), when the registration is outbound.
    var instance: String? { settings.outbound && !settings.instanceID.isEmpty ? "<urn:uuid:\(settings.instanceID)>" : nil }

    /// The next REGISTER, sent from `local` ("1.2.3.4:5" or "[::1]:5"),
    /// asking for `expires` (nil: `sip.expires`; zero: remove our binding).
    mutating func request(local: String, password: String?, expires: Duration? = nil) -> [UInt8] {
        cseq += 1
        let aor = settings.aor ?? ""
        let user = SIPSettings.parts(of: aor)?.user ?? ""
        contactURI = "sip:\(user.isEmpty ? "" : user + "@")\(local);transport=\(transport)"
        var contact = "<\(contactURI)>"
        if settings.outbound { contact += ";+sip.instance=\"<urn:uuid:\(settings.instanceID)>\";reg-id=1" }
        var lines = [
            "REGISTER \(settings.registrar) SIP/2.0",
            "Via: SIP/2.0/\(transport.uppercased()) \(local);branch=z9hG4bK\(randomHex(12));rport",
            "Max-Forwards: 70",
            "From: <\(aor)>;tag=\(fromTag)",
            "To: <\(aor)>",
            "Call-ID: \(callID)",
            "CSeq: \(cseq) REGISTER",
            "Contact: \(contact)",
            "Expires: \((expires ?? settings.expires).components.seconds)",
            "User-Agent: vigil voip-socket",
        ]
        if settings.outbound { lines.append("Supported: outbound, path") }
        if let challenge, let password {
            nonceCount += 1
            lines.append(challenge.authorization(
                username: settings.username ?? user, password: password, method: "REGISTER", uri: settings.registrar,
                nonceCount: nonceCount))
        }
        lines.append("Content-Length: 0")
        return Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8)
    }

    /// Skips a CSeq: a renewal cut off by a stop may have sent the next
    /// one, and the registrar takes only a higher one for this Call-ID.
    mutating func skipCSeq() { cseq += 1 }

    /// Whether `response` answers this registration's current request.
    func answers(_ response: SIPMessage) -> Bool {
        guard response.header("call-id") == callID, let cseqLine = response.header("cseq") else { return false }
        let parts = cseqLine.split(separator: " ")
        return parts.count == 2 && UInt32(parts[0]) == cseq && parts[1].uppercased() == "REGISTER"
    }

    /// Takes the challenge of a 401/407; false when it cannot be answered
    /// (no password, not Digest MD5, or the same nonce failed already).
    mutating func take(challengeOf response: SIPMessage, hasPassword: Bool) -> Bool {
        let header = response.statusCode == 407 ? "proxy-authenticate" : "www-authenticate"
        guard hasPassword, let value = response.header(header), var parsed = DigestChallenge(value) else { return false }
        parsed.proxy = response.statusCode == 407
        if let old = challenge, old.nonce == parsed.nonce, !parsed.stale { return false }
        challenge = parsed
        nonceCount = 0
        return true
    }

    /// The expiry the registrar granted our binding, and the Flow-Timer
    /// if any. A 200 to REGISTER lists every binding of the AOR (other
    /// devices', stale ones): only ours counts, found by `+sip.instance`
    /// and `reg-id` (RFC 5626 §6), else by our Contact URI, in every
    /// Contact header and every entry of each. Its `expires` parameter,
    /// else the Expires header; a reply that lists bindings but none of
    /// ours is an error.
    func granted(by response: SIPMessage) throws(LinkError) -> (expires: Duration, flowTimer: Duration?) {
        let bindings = response.all("contact").flatMap { SIPContact.entries(of: $0) }
        let flow = response.header("flow-timer").flatMap { Int64($0) }.flatMap { $0 > 0 ? Duration.seconds($0) : nil }
        var seconds: Int64?
        if let ours = bindings.first(where: isOurs) {
            seconds = ours.parameter("expires").flatMap { Int64($0) }
        } else if !bindings.isEmpty {
            let instance = instance.map { ", +sip.instance \($0)" } ?? ""
            throw LinkError("the registrar's \(response.statusCode) lists \(bindings.count) binding\(bindings.count == 1 ? "" : "s") for \(settings.aor ?? ""), none of them ours (contact <\(contactURI)>\(instance))")
        }
        if seconds == nil, let header = response.header("expires") { seconds = Int64(header) }
        return (.seconds(max(1, seconds ?? settings.expires.components.seconds)), flow)
    }

    /// Whether `binding` is this registration's: the same instance and
    /// reg-id when both carry an instance, else the same Contact URI.
    func isOurs(_ binding: SIPContact) -> Bool {
        if let instance, let theirs = binding.parameter("+sip.instance") {
            return theirs.lowercased() == instance.lowercased() && (binding.parameter("reg-id") ?? "1") == "1"
        }
        return binding.uri.lowercased() == contactURI.lowercased()
    }
}

/// One binding of a Contact header: `<uri>;name=value;...` (or a bare URI
/// with its parameters), parameter values unquoted.
struct SIPContact: Sendable {
    var uri: String
    var parameters: [(name: String, value: String)]

    func parameter(_ name: String) -> String? { parameters.first { $0.name == name }?.value }

    /// The comma-separated entries of one Contact header value (commas in
    /// quoted display names, quoted parameters and `<...>` URIs do not
    /// separate); "*" and empty entries are left out.
    static func entries(of header: String) -> [SIPContact] {
        SIPText.split(header, at: ",").compactMap { SIPContact(entry: $0.trimmingSpaces) }
    }

    init?(entry: String) {
        var rest = Substring(entry)
        if let open = SIPText.firstOutsideQuotes(rest, "<") {
            guard let close = rest[open...].firstIndex(of: ">") else { return nil }
            uri = String(rest[rest.index(after: open)..<close])
            rest = rest[rest.index(after: close)...]
        } else {
            let end = rest.firstIndex(of: ";") ?? rest.endIndex
            uri = rest[..<end].trimmingSpaces
            rest = rest[end...]
        }
        guard !uri.isEmpty, uri != "*" else { return nil }
        parameters = SIPText.split(rest, at: ";").compactMap { part -> (String, String)? in
            let field = SIPText.field(part)
            return field.name.isEmpty ? nil : field
        }
    }
}

/// Splitting of SIP header values that respects quoted strings and
/// `<...>` URIs (whose commas and semicolons are not separators).
enum SIPText {
    static func split(_ text: some StringProtocol, at separator: Character) -> [Substring] {
        let text = Substring(text)
        var parts: [Substring] = []
        var start = text.startIndex, quoted = false, angle = false, escaped = false
        for i in text.indices {
            let c = text[i]
            if escaped { escaped = false; continue }
            switch c {
            case "\\" where quoted: escaped = true
            case "\"" where !angle: quoted.toggle()
            case "<" where !quoted: angle = true
            case ">" where !quoted: angle = false
            case separator where !quoted && !angle:
                parts.append(text[start..<i])
                start = text.index(after: i)
            default: break
            }
        }
        parts.append(text[start...])
        return parts
    }

    /// The first `character` outside a quoted string.
    static func firstOutsideQuotes(_ text: Substring, _ character: Character) -> Substring.Index? {
        var quoted = false
        for i in text.indices {
            if text[i] == "\"" { quoted.toggle() } else if text[i] == character, !quoted { return i }
        }
        return nil
    }

    /// `name=value` (or a bare `name`): the name lower-cased, the value
    /// trimmed and unquoted.
    static func field(_ part: Substring) -> (name: String, value: String) {
        guard let eq = part.firstIndex(of: "=") else { return (part.trimmingSpaces.lowercased(), "") }
        var value = Substring(part[part.index(after: eq)...].trimmingSpaces)
        if value.count >= 2, value.first == "\"", value.last == "\"" { value = value.dropFirst().dropLast() }
        return (part[..<eq].trimmingSpaces.lowercased(), String(value))
    }
}

/// When to refresh a registration the registrar granted for `expires`: at
/// half of it for short ones, else a minute before it ends; never sooner
/// than ``renewalFloor`` after the last one.
func renewalDelay(for expires: Duration) -> Duration {
    max(renewalFloor, max(expires / 2, expires - .seconds(60)))
}

/// The shortest time between two REGISTERs of one registration.
let renewalFloor: Duration = .seconds(1)

/// A Digest challenge (RFC 2617 / RFC 8760, MD5 only).
struct DigestChallenge: Sendable {
    var realm: String
    var nonce: String
    var opaque: String?
    var qopAuth: Bool
    var stale: Bool
    var proxy = false

    init?(_ header: String) {
        guard header.lowercased().hasPrefix("digest ") else { return nil }
        var fields: [String: String] = [:]
        for part in SIPText.split(header.dropFirst(7), at: ",") {
            let field = SIPText.field(part)
            if !field.name.isEmpty { fields[field.name] = field.value }
        }
        if let algorithm = fields["algorithm"], algorithm.uppercased() != "MD5" { return nil }
        guard let realm = fields["realm"], let nonce = fields["nonce"] else { return nil }
        self.realm = realm
        self.nonce = nonce
        opaque = fields["opaque"]
        qopAuth = (fields["qop"] ?? "").split(separator: ",").contains { $0.trimmingSpaces.lowercased() == "auth" }
        stale = fields["stale"]?.lowercased() == "true"
    }

    func authorization(username: String, password: String, method: String, uri: String, nonceCount: UInt32) -> String {
        let ha1 = md5Hex("\(username):\(realm):\(password)")
        let ha2 = md5Hex("\(method):\(uri)")
        var fields = ["username=\"\(username)\"", "realm=\"\(realm)\"", "nonce=\"\(nonce)\"", "uri=\"\(uri)\"", "algorithm=MD5"]
        if qopAuth {
            let nc = String(nonceCount, radix: 16)
            let ncText = String(repeating: "0", count: max(0, 8 - nc.count)) + nc
            let cnonce = randomHex(8)
            fields.append("response=\"\(md5Hex("\(ha1):\(nonce):\(ncText):\(cnonce):auth:\(ha2)"))\"")
            fields += ["qop=auth", "nc=\(ncText)", "cnonce=\"\(cnonce)\""]
        } else {
            fields.append("response=\"\(md5Hex("\(ha1):\(nonce):\(ha2)"))\"")
        }
        if let opaque { fields.append("opaque=\"\(opaque)\"") }
        return "\(proxy ? "Proxy-Authorization" : "Authorization"): Digest \(fields.joined(separator: ", "))"
    }
}

func md5Hex(_ text: String) -> String {
    var out = [CChar](repeating: 0, count: 33)
    let bytes = Array(text.utf8)
    bytes.withUnsafeBytes { vigil_md5_hex($0.baseAddress, UInt($0.count), &out) }
    return String(decoding: out.prefix(32).map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

func randomHex(_ bytes: Int) -> String {
    var s = ""
    for _ in 0..<bytes {
        let b = UInt8.random(in: 0...255)
        s += (b < 16 ? "0" : "") + String(b, radix: 16)
    }
    return s
}
