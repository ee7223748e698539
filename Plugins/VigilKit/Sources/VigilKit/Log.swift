// swift-log is the logging API of the host and of every plugin. It is
// re-exported from here so that a plugin (or the host) that imports VigilKit
// gets `Logger` from the one copy of Logging linked into libVigilKit.so; a
// second copy linked into another image would have its own type metadata and
// its own LoggingSystem globals.
//
// There is no logging API of Vigil's own: a strategy logs through the
// `Logger` its context hands it (`context.log`), which carries the
// `strategy` and `run` metadata; vigild bootstraps swift-log's
// LoggingSystem with the one handler that writes the lines
// (docs/architecture.md, "Logging").
@_exported import Logging

extension Logger {
    /// This logger with `lease=<id>` on every line: for the lines about one
    /// lease.
    public func with(lease id: LeaseID) -> Logger {
        var copy = self
        copy[metadataKey: "lease"] = "\(id)"
        return copy
    }
}
