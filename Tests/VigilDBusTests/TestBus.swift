import Foundation
import Glibc
import Testing
@testable import VigilDBus
import VigilTestSupport

/// A private dbus-daemon for one test (Tests/TestSupport).
typealias TestBus = TestDBusDaemon

