#include "ctimer.h"
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>

int64_t vigil_clock_ns(int clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int vigil_timerfd_create(int clock, int flags) {
    return timerfd_create(clock, flags);
}

int vigil_timerfd_arm_abs(int fd, int64_t ns) {
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    if (ns > 0) {
        spec.it_value.tv_sec = ns / 1000000000LL;
        spec.it_value.tv_nsec = ns % 1000000000LL;
    }
    return timerfd_settime(fd, ns > 0 ? TFD_TIMER_ABSTIME : 0, &spec, NULL);
}

int vigil_timerfd_arm_periodic(int fd, int64_t first_ns, int64_t interval_ns) {
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    spec.it_value.tv_sec = first_ns / 1000000000LL;
    spec.it_value.tv_nsec = first_ns % 1000000000LL;
    spec.it_interval.tv_sec = interval_ns / 1000000000LL;
    spec.it_interval.tv_nsec = interval_ns % 1000000000LL;
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

int64_t vigil_timerfd_read(int fd) {
    uint64_t count = 0;
    ssize_t n;
    do {
        n = read(fd, &count, sizeof count);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof count) {
        if (n >= 0) errno = EIO;
        return -1;
    }
    return (int64_t)count;
}

int vigil_timerfd_arm_cancel_on_set(int fd, int64_t ns) {
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    spec.it_value.tv_sec = ns / 1000000000LL;
    spec.it_value.tv_nsec = ns % 1000000000LL;
    return timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &spec, NULL);
}

#include <sys/random.h>

long vigil_getrandom_nonblock(void *buffer, size_t length) {
    return (long)getrandom(buffer, length, GRND_NONBLOCK);
}

static int vigil_fill_sigset(sigset_t *set, const int *signals, int count) {
    sigemptyset(set);
    for (int i = 0; i < count; i++) {
        if (sigaddset(set, signals[i]) != 0) return -1;
    }
    return 0;
}

int vigil_block_signals(const int *signals, int count) {
    sigset_t set;
    if (vigil_fill_sigset(&set, signals, count) != 0) return errno;
    return pthread_sigmask(SIG_BLOCK, &set, NULL);
}

int vigil_signalfd(const int *signals, int count) {
    sigset_t set;
    if (vigil_fill_sigset(&set, signals, count) != 0) return -1;
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

int vigil_signalfd_read(int fd) {
    struct signalfd_siginfo info;
    ssize_t n;
    do {
        n = read(fd, &info, sizeof info);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -1;
    // The kernel returns whole records only.
    if (n != (ssize_t)sizeof info) {
        errno = EIO;
        return -1;
    }
    return (int)info.ssi_signo;
}
