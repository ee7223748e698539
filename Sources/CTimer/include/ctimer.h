#ifndef VIGIL_CTIMER_H
#define VIGIL_CTIMER_H
// What Glibc's Swift module does not export: timerfd and the Linux-only
// clock ids. Kept tiny on purpose.
#include <sys/timerfd.h>
#include <time.h>
#include <stdint.h>

static const int vigil_CLOCK_BOOTTIME = CLOCK_BOOTTIME;
static const int vigil_CLOCK_BOOTTIME_ALARM = CLOCK_BOOTTIME_ALARM;
static const int vigil_CLOCK_MONOTONIC = CLOCK_MONOTONIC;
static const int vigil_CLOCK_REALTIME = CLOCK_REALTIME;
static const int vigil_TFD_CLOEXEC = TFD_CLOEXEC;
static const int vigil_TFD_NONBLOCK = TFD_NONBLOCK;
static const int vigil_TFD_TIMER_ABSTIME = TFD_TIMER_ABSTIME;

/// Nanoseconds on `clock`, or -1 with errno set.
int64_t vigil_clock_ns(int clock);

/// Creates a timerfd on `clock`; returns the fd or -1 with errno set.
int vigil_timerfd_create(int clock, int flags);

/// Arms `fd` to expire once at absolute time `ns` on its clock (0 disarms).
int vigil_timerfd_arm_abs(int fd, int64_t ns);

/// Arms `fd` to expire first at absolute time `first_ns` on its clock and then
/// every `interval_ns` (a plain periodic timer; the wake benchmark's reference).
int vigil_timerfd_arm_periodic(int fd, int64_t first_ns, int64_t interval_ns);

/// Reads the expiration count of `fd`: the count (>= 1), or -1 with errno set
/// (EAGAIN on a non-blocking fd that has not expired since it was last armed).
int64_t vigil_timerfd_read(int fd);
#endif
