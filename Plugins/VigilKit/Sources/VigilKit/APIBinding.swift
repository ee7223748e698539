/// How a strategy binds its part of the API contract (``APIInterface``,
/// declared in VigilAPI) to the SDK's bus types: its methods as it
/// registers them, and its child objects' properties as it exports them.
extension APIInterface {
    /// The interface's methods as a strategy registers them
    /// (``StrategyBus/register(interface:methods:)``): one handler per
    /// declared method, in declaration order; `mutating` names the methods
    /// only root and vigild's uid may call.
    public func busMethods(mutating: Set<String>, _ handlers: [String: BusMethod.Handler]) throws(APIBindingError) -> [BusMethod] {
        try checkBinding(methods: handlers.keys, properties: properties.map(\.name))
        return methods.compactMap { method in
            handlers[method.name].map {
                BusMethod(method.name, in: method.inArguments, out: method.outArguments, mutating: mutating.contains(method.name), handler: $0)
            }
        }
    }

    /// Checks that methods a strategy registers under this interface's name
    /// are the declared ones, with the declared arguments, in order.
    public func check(_ registered: [BusMethod]) throws(APIBindingError) {
        let declared = methods.map { [$0.name] + ($0.inArguments + $0.outArguments).map { "\($0.name) \($0.signature)" } }
        let got = registered.map { [$0.name] + ($0.inArguments + $0.outArguments).map { "\($0.name) \($0.signature)" } }
        guard got == declared else {
            throw APIBindingError("\(name) is declared by the \(VigilAPI.busName) contract: its methods must be \(methods.map(\.name)) with the declared arguments")
        }
    }

    /// Checks that an object exported with this interface's name has the
    /// declared properties, in order.
    public func check(_ exported: [BusProperty]) throws(APIBindingError) {
        guard exported == busProperties else {
            throw APIBindingError("\(name) is declared by the \(VigilAPI.busName) contract: its properties must be \(properties.map(\.name)) as declared")
        }
    }

    /// The interface's properties as a strategy's child object exports
    /// them (``StrategyBus/exportObject(relativePath:interface:properties:values:)``).
    public var busProperties: [BusProperty] {
        properties.map { BusProperty($0.name, $0.signature, emitsChange: $0.emitsChange) }
    }
}
