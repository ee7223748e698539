#define _GNU_SOURCE
#include "cfdwatch.h"

#include <pthread.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static uint32_t to_epoll(uint32_t events) {
    return ((events & VIGIL_FDWATCH_IN) ? EPOLLIN : 0) | ((events & VIGIL_FDWATCH_OUT) ? EPOLLOUT : 0);
}

int vigil_fdwatch_create(void) {
    return epoll_create1(EPOLL_CLOEXEC);
}

int vigil_fdwatch_add(int set, int fd, uint64_t token, uint32_t events) {
    struct epoll_event event = { .events = to_epoll(events), .data.u64 = token };
    return epoll_ctl(set, EPOLL_CTL_ADD, fd, &event);
}

int vigil_fdwatch_modify(int set, int fd, uint64_t token, uint32_t events) {
    struct epoll_event event = { .events = to_epoll(events), .data.u64 = token };
    return epoll_ctl(set, EPOLL_CTL_MOD, fd, &event);
}

int vigil_fdwatch_remove(int set, int fd) {
    return epoll_ctl(set, EPOLL_CTL_DEL, fd, NULL);
}

int vigil_fdwatch_wait(int set, uint64_t *tokens, uint32_t *events, int max, int timeout_ms) {
    struct epoll_event ready[64];
    if (max > 64) max = 64;
    int n = epoll_wait(set, ready, max, timeout_ms);
    for (int i = 0; i < n; i++) {
        tokens[i] = ready[i].data.u64;
        events[i] = ((ready[i].events & EPOLLIN) ? VIGIL_FDWATCH_IN : 0)
                  | ((ready[i].events & EPOLLOUT) ? VIGIL_FDWATCH_OUT : 0)
                  | ((ready[i].events & EPOLLHUP) ? VIGIL_FDWATCH_HUP : 0)
                  | ((ready[i].events & EPOLLERR) ? VIGIL_FDWATCH_ERR : 0);
    }
    return n;
}

int vigil_fdwatch_eventfd(void) {
    return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

void vigil_fdwatch_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;  // EAGAIN only when the counter is near overflow: still readable
}

void vigil_fdwatch_eventfd_drain(int fd) {
    uint64_t count;
    ssize_t n = read(fd, &count, sizeof count);
    (void)n;  // EAGAIN: already drained
}

void vigil_fdwatch_name_thread(const char *name) {
    pthread_setname_np(pthread_self(), name);
}
