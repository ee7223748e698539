import VigilKit

/// The names and object paths of the `org.vigil.Vigil1` API, declared in
/// the SDK's contract (VigilKit's APIContract.swift).
public typealias HostBusNames = VigilAPI
