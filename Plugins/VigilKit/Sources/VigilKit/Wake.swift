/// A request for one wake somewhere in a window. The host's scheduler fires
/// requests whose windows overlap together (coalescing), so a window wider
/// than zero saves wakeups.
public struct WakeRequest: Sendable, Hashable {
    /// Never fire before this.
    public var earliest: VigilInstant
    /// Never fire after this (apart from the timer's own latency).
    public var latest: VigilInstant
    /// Prefer times that are multiples of `align` since the Unix epoch, so that
    /// separate processes using the same slot length wake together.
    public var align: Duration?
    /// Ask for a timer that wakes a suspended system (`CLOCK_BOOTTIME_ALARM`).
    /// Honoured only where ``WakeClockInfo/canWakeSystem`` is true.
    public var wakeSystem: Bool
    /// For logs: who asked.
    public var label: String
    /// The strategy instance this wake is for, when it is asked outside
    /// that instance's own run (a detached task of a schedule several
    /// instances share): the host counts the wakeup as that instance's
    /// (its `Wakeups`). Nil: the instance whose run asks, which the host
    /// knows by itself.
    public var forStrategy: String?

    public init(earliest: VigilInstant, latest: VigilInstant, align: Duration? = nil, wakeSystem: Bool = false, label: String,
                forStrategy: String? = nil) {
        self.earliest = earliest
        self.latest = max(earliest, latest)
        self.align = align
        self.wakeSystem = wakeSystem
        self.label = label
        self.forStrategy = forStrategy
    }
}

/// What happened when a wake fired.
public struct WakeFiring: Sendable, Hashable {
    /// When the scheduler meant to fire this batch.
    public var target: VigilInstant
    /// When it actually fired.
    public var firedAt: VigilInstant
    /// How many requests fired in this batch (1 = not coalesced).
    public var batchSize: Int
    /// Whether the firing came from the system-waking alarm clock.
    public var onAlarmClock: Bool

    public init(target: VigilInstant, firedAt: VigilInstant, batchSize: Int, onAlarmClock: Bool) {
        self.target = target
        self.firedAt = firedAt
        self.batchSize = batchSize
        self.onAlarmClock = onAlarmClock
    }

    /// Time between the planned and the actual firing.
    public var lateness: Duration { firedAt - target }
}

/// Which clock the host's wake timers run on, and why.
public struct WakeClockInfo: Sendable, Hashable {
    /// "CLOCK_BOOTTIME_ALARM" or "CLOCK_BOOTTIME" (or "test" in tests).
    public var clock: String
    /// True when a timer can wake a suspended system here.
    public var canWakeSystem: Bool
    /// Why, for people: "no RTC (/sys/class/rtc is empty)", "EPERM: needs CAP_WAKE_ALARM".
    public var reason: String

    public init(clock: String, canWakeSystem: Bool, reason: String) {
        self.clock = clock
        self.canWakeSystem = canWakeSystem
        self.reason = reason
    }
}

/// The host's single wake scheduler.
public protocol WakeScheduling: Sendable {
    /// Suspends until the request fires. Throws `CancellationError` if the
    /// waiting task is cancelled (the request is withdrawn).
    func wake(_ request: WakeRequest) async throws -> WakeFiring
    var clockInfo: WakeClockInfo { get }
}

/// The thing the host's wake scheduler waits on: a one-shot timer that can
/// be re-armed to a new absolute deadline on the host's `CLOCK_BOOTTIME`
/// timeline. In the SDK so that the test kit's clock-driven timer
/// (VigilKitTesting's `ClockDrivenWakeTimer`) and the host's timerfd timer
/// meet at one contract.
///
/// Contract:
/// - `arm(at:)` replaces any earlier arming; `arm(at: nil)` disarms.
/// - After the armed deadline passes, the handler is called (once per
///   expiry). A handler call may still arrive for an arming that has just been
///   replaced; the scheduler tolerates such stale calls by looking at its
///   clock, so timers need not guarantee their absence.
public protocol WakeTimer: Sendable {
    /// The clock this timer runs on, for reports ("CLOCK_BOOTTIME", "test", ...).
    var clockName: String { get }
    /// Installs the function called when the timer expires. The scheduler
    /// installs it once, before arming.
    func setExpiryHandler(_ handler: @escaping @Sendable () async -> Void)
    /// Arms the timer to expire once at `deadline`, or disarms it (`nil`).
    func arm(at deadline: VigilInstant?)
    /// Stops the timer for good and releases what it holds.
    func invalidate()
}
