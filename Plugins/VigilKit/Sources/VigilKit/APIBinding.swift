/// How a strategy's bus registrations are checked against their
/// declaration (``APIInterface``): its methods as it registers them, and
/// its child objects' properties as it exports them.
extension APIInterface {
    /// Checks that the methods a strategy registers under this interface
    /// are its declared ones, in order.
    public func check(_ registered: [BusMethod]) throws(APIBindingError) {
        guard registered.map(\.declaration) == methods else {
            throw APIBindingError("\(name) declares the methods \(methods.map(\.name)); registered: \(registered.map(\.name))")
        }
    }

    /// Checks that an object exported with this interface's name has the
    /// declared properties, in order.
    public func check(_ exported: [BusProperty]) throws(APIBindingError) {
        guard exported == properties else {
            throw APIBindingError("\(name) is declared by the \(VigilAPI.busName) contract: its properties must be \(properties.map(\.name)) as declared")
        }
    }
}
