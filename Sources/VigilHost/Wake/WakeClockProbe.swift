import CTimer
import Foundation
import VigilKit

/// Finds out whether this host can have a timer wake it from suspend, and
/// says why or why not.
///
/// Two things must hold: the process may create a `CLOCK_BOOTTIME_ALARM`
/// timer (needs `CAP_WAKE_ALARM`, else `EPERM`; `EINVAL` where the kernel has
/// no alarm timers), and an RTC with a wake alarm exists (`/sys/class/rtc/rtcN/wakealarm`)
/// to program the wakeup into. Creating the timer works without an RTC, but
/// then nothing can wake the suspended machine.
public struct WakeClockProbe: Sendable, Hashable {
    /// Outcome of `timerfd_create(CLOCK_BOOTTIME_ALARM)`: nil on success, else the error.
    public var alarmCreationError: WakeTimerError?
    /// RTC devices found (e.g. ["rtc0"]).
    public var rtcDevices: [String]
    /// RTC devices that can program a wake alarm (have a `wakealarm` file).
    public var rtcDevicesWithWakeAlarm: [String]
    /// Where RTCs were looked for.
    public var rtcDirectory: String

    public init(alarmCreationError: WakeTimerError?, rtcDevices: [String], rtcDevicesWithWakeAlarm: [String], rtcDirectory: String) {
        self.alarmCreationError = alarmCreationError
        self.rtcDevices = rtcDevices
        self.rtcDevicesWithWakeAlarm = rtcDevicesWithWakeAlarm
        self.rtcDirectory = rtcDirectory
    }

    /// True when an alarm timerfd can be created (the scheduler then uses it
    /// for `wakeSystem` requests, whether or not it can wake the machine).
    public var alarmTimerUsable: Bool { alarmCreationError == nil }

    /// True when an alarm timer would actually wake a suspended system.
    public var canWakeSystem: Bool { alarmTimerUsable && !rtcDevicesWithWakeAlarm.isEmpty }

    /// What the host reports (D-Bus `WakeClock`, logs).
    public var clockInfo: WakeClockInfo {
        let ordinary = "ordinary requests use CLOCK_BOOTTIME (they never wake a suspended system)"
        guard let error = alarmCreationError else {
            let rtcPart: String
            if let rtc = rtcDevicesWithWakeAlarm.first {
                rtcPart = "; RTC \(rtc) has a wake alarm, so they wake a suspended system"
            } else if rtcDevices.isEmpty {
                rtcPart = ", but there is no RTC (\(rtcDirectory) is empty or missing), so no timer can wake a suspended system here"
            } else {
                rtcPart = ", but no RTC has a wake alarm (\(rtcDevices.joined(separator: ", ")) without wakealarm), so no timer can wake a suspended system here"
            }
            return WakeClockInfo(
                clock: "CLOCK_BOOTTIME_ALARM",
                canWakeSystem: canWakeSystem,
                reason: "CLOCK_BOOTTIME_ALARM permitted (CAP_WAKE_ALARM), used for wakeSystem requests\(rtcPart); \(ordinary)"
            )
        }
        let why: String
        switch error.code {
        case EPERM: why = "not permitted (EPERM: needs CAP_WAKE_ALARM)"
        case EINVAL: why = "not supported (EINVAL: kernel without alarm timers)"
        default: why = "unavailable (\(error))"
        }
        return WakeClockInfo(
            clock: "CLOCK_BOOTTIME",
            canWakeSystem: false,
            reason: "CLOCK_BOOTTIME_ALARM \(why); all requests use CLOCK_BOOTTIME and cannot wake a suspended system"
        )
    }

    /// Lists RTC devices under `directory` (default `/sys/class/rtc`).
    public static func rtcDevices(in directory: String = "/sys/class/rtc") -> (all: [String], withWakeAlarm: [String]) {
        let fm = FileManager.default
        let names = ((try? fm.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix("rtc") }.sorted()
        let waking = names.filter { fm.fileExists(atPath: "\(directory)/\($0)/wakealarm") }
        return (names, waking)
    }

    /// Probes the real system: tries to create a `CLOCK_BOOTTIME_ALARM`
    /// timerfd, keeping it (for the scheduler) when that works.
    public static func run(rtcDirectory: String = "/sys/class/rtc") -> (probe: WakeClockProbe, alarmTimer: TimerFDWakeTimer?) {
        let rtc = rtcDevices(in: rtcDirectory)
        do {
            let timer = try TimerFDWakeTimer(clockID: vigil_CLOCK_BOOTTIME_ALARM, clockName: "CLOCK_BOOTTIME_ALARM")
            return (WakeClockProbe(alarmCreationError: nil, rtcDevices: rtc.all, rtcDevicesWithWakeAlarm: rtc.withWakeAlarm, rtcDirectory: rtcDirectory), timer)
        } catch {
            return (WakeClockProbe(alarmCreationError: error, rtcDevices: rtc.all, rtcDevicesWithWakeAlarm: rtc.withWakeAlarm, rtcDirectory: rtcDirectory), nil)
        }
    }
}
