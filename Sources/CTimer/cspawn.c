#define _GNU_SOURCE
#include "cspawn.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// Moves a descriptor that sits on 0, 1 or 2 out of the way (a daemon started
// with those closed gets them back from pipe()), so the dup2 actions below
// cannot overwrite one another. Returns the new fd (close-on-exec) or -1.
static int lift_above_stdio(int fd, int *lifted) {
    *lifted = -1;
    if (fd > 2) return fd;
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (moved >= 0) *lifted = moved;
    return moved;
}

int vigil_spawn(const char *path, char *const argv[], char *const envp[],
                int stdin_fd, int output_fd, const char *cwd, pid_t *pid) {
    int lifted_in = -1, lifted_out;
    // stdin_fd < 0: the child opens /dev/null itself, so no descriptor of
    // the parent's stands between the call and the spawn.
    int in = stdin_fd;
    if (stdin_fd >= 0 && (in = lift_above_stdio(stdin_fd, &lifted_in)) < 0) return errno;
    int out = lift_above_stdio(output_fd, &lifted_out);
    if (out < 0) {
        int err = errno;
        if (lifted_in >= 0) close(lifted_in);
        return err;
    }

    int err = 0;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t actions;
    if ((err = posix_spawnattr_init(&attr)) != 0) goto lifted;
    if ((err = posix_spawn_file_actions_init(&actions)) != 0) goto attr;

    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    short flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if ((err = posix_spawnattr_setflags(&attr, flags)) != 0) goto actions;
    if ((err = posix_spawnattr_setpgroup(&attr, 0)) != 0) goto actions;
    if ((err = posix_spawnattr_setsigmask(&attr, &none)) != 0) goto actions;
    if ((err = posix_spawnattr_setsigdefault(&attr, &all)) != 0) goto actions;

    if (in >= 0) {
        if ((err = posix_spawn_file_actions_adddup2(&actions, in, 0)) != 0) goto actions;
    } else if ((err = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)) != 0) {
        goto actions;
    }
    if ((err = posix_spawn_file_actions_adddup2(&actions, out, 1)) != 0) goto actions;
    if ((err = posix_spawn_file_actions_adddup2(&actions, out, 2)) != 0) goto actions;
    if ((err = posix_spawn_file_actions_addclosefrom_np(&actions, 3)) != 0) goto actions;
    if (cwd != NULL && (err = posix_spawn_file_actions_addchdir_np(&actions, cwd)) != 0) goto actions;

    err = posix_spawn(pid, path, &actions, &attr, argv, envp);

actions:
    posix_spawn_file_actions_destroy(&actions);
attr:
    posix_spawnattr_destroy(&attr);
lifted:
    if (lifted_in >= 0) close(lifted_in);
    if (lifted_out >= 0) close(lifted_out);
    return err;
}

int vigil_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}

int vigil_pidfd_open(pid_t pid) {
    return (int)syscall(SYS_pidfd_open, pid, 0);
}
