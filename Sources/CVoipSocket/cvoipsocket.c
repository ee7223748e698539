#define _GNU_SOURCE  /* sched_setaffinity, CPU_SET */
#include "cvoipsocket.h"
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

const int vigil_TCP_KEEPIDLE = TCP_KEEPIDLE;
const int vigil_TCP_KEEPINTVL = TCP_KEEPINTVL;
const int vigil_TCP_KEEPCNT = TCP_KEEPCNT;
const int vigil_TCP_USER_TIMEOUT = TCP_USER_TIMEOUT;

int vigil_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int vigil_epoll_add(int epfd, int fd, uint64_t token) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = token;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int vigil_epoll_add_level_in(int epfd, int fd, uint64_t token) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = token;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int vigil_epoll_del(int epfd, int fd) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, &ev);
}

int vigil_epoll_wait(int epfd, vigil_socket_event *out, int max, int timeout_ms) {
    struct epoll_event events[256];
    if (max > 256) max = 256;
    int n;
    do { n = epoll_wait(epfd, events, max, timeout_ms); } while (n < 0 && errno == EINTR);
    for (int i = 0; i < n; i++) {
        out[i].token = events[i].data.u64;
        out[i].events = events[i].events;
    }
    return n;
}

int vigil_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

int vigil_tcp_socket(int family) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (fd < 0) return -1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int vigil_connect(int fd, const struct sockaddr *address, socklen_t length) {
    int rc;
    do { rc = connect(fd, address, length); } while (rc < 0 && errno == EINTR);
    return rc == 0 ? 0 : errno;
}

long vigil_send(int fd, const void *bytes, unsigned long count) {
    ssize_t n;
    do { n = send(fd, bytes, count, MSG_NOSIGNAL); } while (n < 0 && errno == EINTR);
    return (long)n;
}

long vigil_recv(int fd, void *buffer, unsigned long size) {
    ssize_t n;
    do { n = recv(fd, buffer, size, 0); } while (n < 0 && errno == EINTR);
    return (long)n;
}

int vigil_socket_error(int fd) {
    int error = 0;
    socklen_t length = sizeof error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
    return error;
}

int vigil_set_tcp_keepalive(int fd, int idle_seconds, int interval_seconds, int count) {
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_seconds, sizeof idle_seconds) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_seconds, sizeof interval_seconds) != 0) return errno;
    if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) != 0) return errno;
    return 0;
}

int vigil_set_user_timeout(int fd, unsigned int milliseconds) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &milliseconds, sizeof milliseconds) != 0) return errno;
    return 0;
}

int vigil_get_int_option(int fd, int level, int name) {
    int value = 0;
    socklen_t length = sizeof value;
    if (getsockopt(fd, level, name, &value, &length) != 0) return -1;
    return value;
}

int vigil_format_address(const struct sockaddr *address, char *buffer, int size) {
    char host[INET6_ADDRSTRLEN];
    if (address->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)address;
        if (!inet_ntop(AF_INET, &in->sin_addr, host, sizeof host)) return -1;
        snprintf(buffer, (size_t)size, "%s:%u", host, (unsigned)ntohs(in->sin_port));
        return 0;
    }
    if (address->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)address;
        if (!inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host)) return -1;
        snprintf(buffer, (size_t)size, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
        return 0;
    }
    return -1;
}

int vigil_socket_address(int fd, int peer, char *buffer, int size) {
    struct sockaddr_storage storage;
    socklen_t length = sizeof storage;
    int rc = peer ? getpeername(fd, (struct sockaddr *)&storage, &length)
                  : getsockname(fd, (struct sockaddr *)&storage, &length);
    if (rc != 0) return -1;
    return vigil_format_address((const struct sockaddr *)&storage, buffer, size);
}

#include <malloc.h>
long vigil_heap_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return (long)(info.uordblks + info.hblkhd);
}

#include <sched.h>
int vigil_set_affinity(int tid, uint64_t mask) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int core = 0; core < 64; core++)
        if (mask & ((uint64_t)1 << core)) CPU_SET(core, &set);
    return sched_setaffinity(tid, sizeof set, &set);
}

uint64_t vigil_affinity(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    uint64_t mask = 0;
    for (int core = 0; core < 64; core++)
        if (CPU_ISSET(core, &set)) mask |= (uint64_t)1 << core;
    return mask;
}
