import VigilHost
import VigilKit
import VigilKitTesting

extension WaitableLog where Item == LogLine {
    /// Host loggers whose lines are appended here (never LoggingSystem's).
    var logging: HostLogging {
        HostLogging { [self] label in self.handler(label: label) }
    }
}
