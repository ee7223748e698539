/// Unique bus names that left the bus recently, so a request that races
/// its caller's departure (the Begin or Inhibit still being answered when
/// NameOwnerChanged arrives) is ended at once. Unique names are never
/// reused on a bus, so remembering the last `capacity` is enough.
struct VanishedNames {
    private var names: Set<String> = []
    private var order: [String] = []
    let capacity: Int

    init(capacity: Int = 4096) { self.capacity = capacity }

    mutating func insert(_ name: String) {
        guard names.insert(name).inserted else { return }
        order.append(name)
        if order.count > capacity { names.remove(order.removeFirst()) }
    }

    func contains(_ name: String) -> Bool { names.contains(name) }
}
