#define _GNU_SOURCE
#include "cconditions.h"
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/connector.h>
#include <linux/cn_proc.h>

int vigil_netlink_open(int protocol, unsigned groups) {
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, protocol);
    if (fd < 0) return -1;
    struct sockaddr_nl addr;
    memset(&addr, 0, sizeof addr);
    addr.nl_family = AF_NETLINK;
    addr.nl_groups = groups;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int vigil_setns_net(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = setns(fd, CLONE_NEWNET);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

void vigil_name_thread(const char *name) {
    char truncated[16];
    strncpy(truncated, name, sizeof truncated - 1);
    truncated[sizeof truncated - 1] = 0;
    pthread_setname_np(pthread_self(), truncated);
}

int vigil_proc_connector_open(void) {
    int fd = vigil_netlink_open(NETLINK_CONNECTOR, CN_IDX_PROC);
    if (fd < 0) return -1;
    struct {
        struct nlmsghdr header;
        struct {
            struct cn_msg message;
            enum proc_cn_mcast_op op;
        } __attribute__((packed)) body;
    } __attribute__((aligned(NLMSG_ALIGNTO))) request;
    memset(&request, 0, sizeof request);
    request.header.nlmsg_len = sizeof request;
    request.header.nlmsg_type = NLMSG_DONE;
    request.body.message.id.idx = CN_IDX_PROC;
    request.body.message.id.val = CN_VAL_PROC;
    request.body.message.len = sizeof(enum proc_cn_mcast_op);
    request.body.op = PROC_CN_MCAST_LISTEN;
    if (send(fd, &request, sizeof request, 0) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int vigil_proc_event(const void *buffer, size_t length, pid_t *pid) {
    const struct nlmsghdr *header = buffer;
    if (length < NLMSG_LENGTH(sizeof(struct cn_msg) + sizeof(struct proc_event))) return 0;
    if (!NLMSG_OK(header, length)) return 0;
    const struct cn_msg *message = NLMSG_DATA(header);
    if (message->id.idx != CN_IDX_PROC || message->id.val != CN_VAL_PROC) return 0;
    const struct proc_event *event = (const struct proc_event *)message->data;
    switch (event->what) {
    case PROC_EVENT_EXEC:
        *pid = event->event_data.exec.process_pid;
        return 1;
    case PROC_EVENT_COMM:
        *pid = event->event_data.comm.process_pid;
        return 1;
    case PROC_EVENT_EXIT:
        *pid = event->event_data.exit.process_pid;
        return 2;
    default:
        return 0;
    }
}
