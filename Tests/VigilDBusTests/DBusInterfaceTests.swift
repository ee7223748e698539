import Testing
@testable import VigilDBus

/// An interface marked valid (built from a declaration its caller checked
/// once) is not checked again on export, until it is changed.
@Suite struct MarkedValidInterfaceTests {
    @Test func aChangeClearsTheMark() throws {
        let bad = DBusInterface("org.vigil.Test1", methods: [
            DBusMethod("Ping", in: [DBusArgument("x", "(")]) { _ in [] },
        ])
        #expect(throws: DBusError.self) { try bad.validate() }
        var marked = bad.markedValid()
        try marked.validate()
        marked.name = "org.vigil.Test2"
        #expect(throws: DBusError.self) { try marked.validate() }
        var renamed = bad.markedValid()
        renamed.methods.append(DBusMethod("Pong") { _ in [] })
        #expect(throws: DBusError.self) { try renamed.validate() }
    }
}
