#include "ctimer.h"
#include <string.h>

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
