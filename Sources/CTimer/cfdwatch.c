#include "cfdwatch.h"

#include <stddef.h>
#include <sys/epoll.h>

int vigil_fdwatch_create(void) {
    return epoll_create1(EPOLL_CLOEXEC);
}

int vigil_fdwatch_add(int set, int fd, uint64_t token) {
    struct epoll_event event = { .events = EPOLLIN, .data.u64 = token };
    return epoll_ctl(set, EPOLL_CTL_ADD, fd, &event);
}

int vigil_fdwatch_remove(int set, int fd) {
    return epoll_ctl(set, EPOLL_CTL_DEL, fd, NULL);
}

int vigil_fdwatch_wait(int set, uint64_t *tokens, uint32_t *events, int max) {
    struct epoll_event ready[64];
    if (max > 64) max = 64;
    int n = epoll_wait(set, ready, max, -1);
    for (int i = 0; i < n; i++) {
        tokens[i] = ready[i].data.u64;
        events[i] = ((ready[i].events & EPOLLIN) ? VIGIL_FDWATCH_IN : 0)
                  | ((ready[i].events & EPOLLHUP) ? VIGIL_FDWATCH_HUP : 0)
                  | ((ready[i].events & EPOLLERR) ? VIGIL_FDWATCH_ERR : 0);
    }
    return n;
}
