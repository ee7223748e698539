#ifndef VIGIL_TEST_PROBE_H
#define VIGIL_TEST_PROBE_H
// Whether a descriptor number still names the file it named once, for tests
// that check a descriptor was closed: an epoll set holds the file without
// keeping it open (the kernel drops it from the set when the file's last
// descriptor closes), and EPOLL_CTL_MOD on the number succeeds only while
// the number names that same file (EBADF once closed, ENOENT if the number
// was reused for another file).
#include <sys/epoll.h>
#include <unistd.h>

/// A new epoll set holding `fd`'s file (waiting for nothing), or -1 with errno set.
static inline int vigil_test_epoll_probe(int fd) {
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    if (epoll < 0) return -1;
    struct epoll_event event = { .events = 0 };
    if (epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) != 0) {
        close(epoll);
        return -1;
    }
    return epoll;
}

/// 1 while `fd` still names the file `epoll` was made for, else 0.
static inline int vigil_test_epoll_probe_holds(int epoll, int fd) {
    struct epoll_event event = { .events = 0 };
    return epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event) == 0;
}
#endif
