import Testing
import VigilKit

/// The API's rows: the signature comes from the fields, a row survives its
/// own encoding, and a reply of another shape is refused naming the field.
@Suite struct APIRowTests {
    static let lease = LeaseRow(path: "/org/vigil/Vigil1/Lease/7", id: 7, strategy: "mail-sync", kind: "periodic-wake",
                                holds: "sleep", reason: "syncing\u{1B}[2J", acquiredAt: 1, deadline: 2, renewals: 3, state: "active")

    @Test func signaturesComeFromTheFields() {
        #expect(LeaseRow.signature == "(" + LeaseRow.fields.map(\.signature).joined() + ")")
        #expect(Self.lease.busValue.signature == LeaseRow.signature)
        #expect(StrategyRow().busValue.signature == StrategyRow.signature)
        #expect(RunRow().busValue.signature == RunRow.signature)
        #expect(DownloadRow().busValue.signature == DownloadRow.signature)
        #expect(LeaseRow.array([]).signature == LeaseRow.arraySignature)
    }

    @Test func rowsRoundTrip() throws {
        #expect(try LeaseRow.rows(LeaseRow.array([Self.lease, LeaseRow()])) == [Self.lease, LeaseRow()])
        var download = DownloadRow()
        download.url = "http://example.org/a"
        download.rate = 1.5
        download.attempts = 2
        #expect(try DownloadRow(properties: download.properties) == download)
        #expect(Set(download.properties.keys) == Set(VigilAPI.download.properties.map(\.name)))
    }

    /// The lease object's row is the Lease interface's properties, each with
    /// its declared type, but Status (read on its own).
    @Test func theLeaseObjectRowIsTheLeaseInterface() throws {
        let declared = Dictionary(uniqueKeysWithValues: VigilAPI.lease.properties.map { ($0.name, $0.signature) })
        let fields = Dictionary(uniqueKeysWithValues: LeaseObjectRow.fields.map { ($0.name, $0.signature) })
        #expect(fields == declared.filter { $0.key != "Status" })
        var row = LeaseObjectRow()
        row.lease = Self.lease
        row.lease.path = ""
        var properties = row.properties
        #expect(properties["Reason"] == .string(Self.lease.reason) && properties["AcquiredAt"] == .uint64(1))
        properties["Status"] = .dict(keySignature: "s", valueSignature: "v", [])
        #expect(try LeaseObjectRow(properties: properties) == row)
    }

    @Test func anotherShapeIsRefusedNamingTheField() {
        guard case .structure(var fields) = Self.lease.busValue else { Issue.record("not a struct"); return }
        fields[8] = .uint64(3)
        #expect(throws: APIDecodingError("LeaseRow.renewals should be u, got t")) { try LeaseRow(busValue: .structure(fields)) }
        #expect(throws: APIDecodingError.self) { try LeaseRow(busValue: .structure(Array(fields.dropLast()))) }
        #expect(throws: APIDecodingError.self) { try LeaseRow.rows(StrategyRow.array([StrategyRow()])) }
        #expect(throws: APIDecodingError("DownloadRow lacks Sha256")) {
            try DownloadRow(properties: DownloadRow().properties.filter { $0.key != "Sha256" })
        }
    }

    /// Each member's signature is computed from its Swift types; these are
    /// the signatures docs/dbus-api.md and the XML show.
    @Test func signaturesComeFromTheDeclaredTypes() {
        typealias Host = VigilAPI.Host
        func signature(_ method: APIMethod) -> String { method.inSignature + "->" + method.outSignature }
        #expect(signature(Host.listLeases.declaration) == "->a(otssssttus)")
        #expect(signature(Host.survival.declaration) == "t->" + RunRow.arraySignature)
        #expect(signature(Host.beginBackgroundTask.declaration) == "sst->oh")
        #expect(signature(Host.reload.declaration) == "->bas")
        #expect(Host.reload.declaration.outArguments.map(\.name) == ["applied", "messages"])
        #expect(signature(Host.denyApp.declaration) == "st->u")
        #expect(signature(Host.releaseLease.declaration) == "t->")
        #expect(signature(VigilAPI.DownloadSession.enqueue.declaration) == "ssa{sv}->o")
        #expect(signature(VigilAPI.ClientLease.end.declaration) == "->")
        #expect(Host.sleepBrokeLease.declaration.signature == "ossts")
        #expect(VigilAPI.ClientLease.expiring.declaration.signature == "t")
        #expect(Host.beginBackgroundTask.interface == VigilAPI.hostInterface)
    }

    /// A call's arguments cross as the declared types; another shape is
    /// refused naming both signatures.
    @Test func argumentsDecodeAsDeclared() throws {
        let enqueue = VigilAPI.DownloadSession.enqueue
        let body = enqueue.encode("http://example.org/a", "a", ["size": .uint64(3)])
        #expect(body.map(\.signature).joined() == "ssa{sv}")
        let (url, dest, options) = try enqueue.decode(body)
        #expect(url == "http://example.org/a" && dest == "a" && options == ["size": .uint64(3)])
        #expect(throws: BusValueMismatch("expected arguments \"ssa{sv}\", got \"ss\"")) { try enqueue.decode(Array(body.prefix(2))) }
        let reply = BusTuple(ObjectPath("/x"), true)
        #expect(try BusTuple<ObjectPath, Bool>(arguments: reply.arguments).values == (ObjectPath("/x"), true))
        #expect(throws: BusValueMismatch.self) { try BusTuple<ObjectPath, UInt32>(arguments: reply.arguments) }
    }

    /// A strategy's bound method decodes the call for its typed handler and
    /// encodes the handler's reply; a call of another shape never reaches it.
    @Test func aBoundMethodCallsItsTypedHandler() async throws {
        let method = VigilAPI.DownloadSession.enqueue.bind(mutating: true) { caller, url, dest, options in
            BusTuple(ObjectPath("/\(caller.uid)/\(url.count)/\(dest)/\(options.count)"))
        }
        #expect(method.declaration == VigilAPI.downloadSession.methods[0] && method.mutating)
        let caller = BusCaller(sender: ":1.1", uid: 7)
        let reply = try await method.handler([.string("abc"), .string("d"), .dictionary([:])], caller)
        #expect(reply == [.objectPath("/7/3/d/0")])
        await #expect(throws: BusMethodError.invalidArgs("expected arguments \"ssa{sv}\", got \"s\"")) {
            try await method.handler([.string("abc")], caller)
        }
    }

    @Test func downloadPathsRoundTrip() {
        let strategy = VigilAPI.strategyPath("dl")
        #expect(VigilAPI.downloadID(path: strategy + "/" + VigilAPI.downloadRelativePath(42), strategyPath: strategy) == 42)
        #expect(VigilAPI.downloadID(path: VigilAPI.strategyPath("other") + "/" + VigilAPI.downloadRelativePath(42), strategyPath: strategy) == nil)
        #expect(VigilAPI.downloadID(path: strategy + "/" + VigilAPI.downloadRelativePath(42) + "x", strategyPath: strategy) == nil)
        let location = VigilAPI.download(at: VigilAPI.strategyPath("mail-sync") + "/" + VigilAPI.downloadRelativePath(7))
        #expect(location?.strategy == "mail-sync" && location?.id == 7)
        #expect(VigilAPI.download(at: VigilAPI.strategyPath("mail-sync")) == nil)
        #expect(VigilAPI.download(at: VigilAPI.leasePath(LeaseID(7))) == nil)
    }

    /// A lease object's path gives back its id; nothing else does, so a
    /// getter shared by every lease object reads the right lease or none.
    @Test func leasePathsRoundTrip() {
        for id: UInt64 in [0, 1, 7, 42, 1_000_000, .max] {
            #expect(VigilAPI.leaseID(path: VigilAPI.leasePath(LeaseID(id))) == LeaseID(id))
        }
        let prefix = VigilAPI.rootPath + "/Lease/"
        for path in [prefix, prefix + "07", prefix + "+7", prefix + "-0", prefix + "-7", prefix + "7x", prefix + "7/Download/1", prefix + "18446744073709551616",
                     VigilAPI.rootPath + "/Lease7", VigilAPI.strategyPath("7"), "/Lease/7", ""] {
            #expect(VigilAPI.leaseID(path: path) == nil, "\(path)")
        }
    }
}

/// The Host's properties, replies and signals as rows: each row is the
/// contract's declaration, field for field, so a client decoding with them
/// reads what vigild sends.
@Suite struct APIMessageTests {
    static func shape<Row: APIRow>(_ row: Row.Type) -> [String] { Row.fields.map { "\($0.name) \($0.signature)" } }
    static func shape(_ arguments: [BusArgument]) -> [String] { arguments.map { "\($0.name) \($0.signature)" } }

    @Test func hostRowIsEveryHostProperty() {
        #expect(Self.shape(HostRow.self) == VigilAPI.host.properties.map { "\($0.name) \($0.signature)" })
    }

    @Test func repliesAndSignalsAreTheDeclaredArguments() {
        #expect(Self.shape(ReloadReply.self) == Self.shape(VigilAPI.Host.reload.declaration.outArguments))
        let signals: [(String, [String])] = [
            ("LeaseAcquired", Self.shape(LeaseAcquiredSignal.self)), ("LeaseRenewed", Self.shape(LeaseRenewedSignal.self)),
            ("LeaseExpiring", Self.shape(LeaseExpiringSignal.self)), ("LeaseExpired", Self.shape(LeaseExpiredSignal.self)),
            ("LeaseReleased", Self.shape(LeaseReleasedSignal.self)), ("StrategyStateChanged", Self.shape(StrategyStateChangedSignal.self)),
            ("SleepBrokeLease", Self.shape(SleepBrokeLeaseSignal.self)),
        ]
        for (member, shape) in signals {
            #expect(shape == Self.shape(VigilAPI.host.signals.first { $0.name == member }?.arguments ?? []), "\(member)")
        }
        #expect(HostSignal.members + HostSignal.notDecoded == VigilAPI.host.signals.map(\.name))
    }

    @Test func signalsDecodeByMemberAndRefuseAnotherShape() throws {
        var acquired = LeaseAcquiredSignal()
        acquired.lease = "/org/vigil/Vigil1/Lease/3"
        acquired.strategy = "client"
        acquired.holds = "sleep"
        #expect(try HostSignal(member: "LeaseAcquired", body: acquired.arguments) == .leaseAcquired(acquired))
        #expect(try HostSignal(member: "SomethingElse", body: []) == nil)
        #expect(throws: APIDecodingError.self) { try HostSignal(member: "LeaseReleased", body: acquired.arguments) }
        let reply = try ReloadReply(arguments: [.bool(true), .array(elementSignature: "s", [.string("strategy \"a\" added")])])
        #expect(reply.applied && reply.messages == ["strategy \"a\" added"])
        // GetAll's values come in variants.
        var host = HostRow()
        host.version = "1.2"
        host.leases = ["/org/vigil/Vigil1/Lease/1"]
        #expect(try HostRow(properties: host.properties.mapValues { .variant($0) }) == host)
    }
}
