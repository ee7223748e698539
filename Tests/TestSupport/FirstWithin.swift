/// What `body` returns, or nil if `timeout` passes first; `body`'s task is
/// then cancelled. `timeout` only bounds a broken run.
public func first<T: Sendable>(within timeout: Duration, _ body: @escaping @Sendable () async -> T?) async -> T? {
    await withTaskGroup(of: T?.self) { group in
        group.addTask { await body() }
        group.addTask {
            try? await Task.sleep(for: timeout)
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}
