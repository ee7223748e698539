#ifndef VIGIL_CTIMER_H
#define VIGIL_CTIMER_H
// What Glibc's Swift module does not export: timerfd and the Linux-only
// clock ids. Kept tiny on purpose.
#include <sys/timerfd.h>
#include <time.h>
#include <stdint.h>
#include <stddef.h>

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

/// Arms a CLOCK_REALTIME `fd` at absolute `ns` with TFD_TIMER_CANCEL_ON_SET:
/// a read then fails with ECANCELED when the wall clock is set and after each
/// system resume (the kernel treats resume as a clock change).
int vigil_timerfd_arm_cancel_on_set(int fd, int64_t ns);

/// Reads the expiration count of `fd`: the count (>= 1), or -1 with errno set
/// (EAGAIN on a non-blocking fd that has not expired since it was last armed).
int64_t vigil_timerfd_read(int fd);
/// getrandom(2) with GRND_NONBLOCK (not in Glibc's Swift module): the
/// number of bytes written, or -1 with errno set (EAGAIN while the kernel's
/// pool is not initialised, ENOSYS before Linux 3.17). For run ids.
long vigil_getrandom_nonblock(void *buffer, size_t length);

/// Adds `signals` to the calling thread's signal mask (SIG_BLOCK), which
/// threads created later inherit. Call it on the main thread before any
/// other thread exists, so that none of them takes these signals and they
/// wait for `vigil_signalfd`. 0, or an errno value.
int vigil_block_signals(const int *signals, int count);

/// signalfd(2) (not in Glibc's Swift module) for `signals`, non-blocking and
/// close-on-exec: the fd, or -1 with errno set. The signals must be blocked
/// in every thread (`vigil_block_signals`), or a thread may take them first.
int vigil_signalfd(const int *signals, int count);

/// Reads one pending signal from a non-blocking signalfd: its number, or
/// -1 with errno set (EAGAIN when none is pending).
int vigil_signalfd_read(int fd);
#endif
