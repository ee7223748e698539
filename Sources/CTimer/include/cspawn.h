#ifndef VIGIL_CSPAWN_H
#define VIGIL_CSPAWN_H
// Process spawning for the host's hook runner: what Swift's Glibc module
// cannot express (wait-status macros, the pidfd_open syscall) and the
// posix_spawn attribute set-up, kept in one C function so the child's state
// is decided in one place.
#include <sys/types.h>
#include <sys/wait.h>

/// Spawns `path` (no PATH search) with `argv` and `envp`, both NULL-terminated.
/// The child gets its own process group (pgid = its pid), an empty signal mask,
/// every signal's disposition reset to the default, stdin from `stdin_fd`
/// (or, when it is negative, /dev/null opened by the child),
/// stdout and stderr to `output_fd`, every other descriptor closed, and runs in
/// `cwd` when it is not NULL. Returns 0 and stores the pid, or returns an errno
/// value (exec failures such as ENOENT or EACCES are reported here too).
int vigil_spawn(const char *path, char *const argv[], char *const envp[],
                int stdin_fd, int output_fd, const char *cwd, pid_t *pid);

/// pipe2(fds, O_CLOEXEC), which Swift's Glibc module does not export:
/// 0, or -1 with errno set.
int vigil_pipe_cloexec(int fds[2]);

/// pidfd_open(2): a descriptor that becomes readable when `pid` exits;
/// -1 with errno set (ENOSYS before Linux 5.3).
int vigil_pidfd_open(pid_t pid);

static inline int vigil_wifexited(int status) { return WIFEXITED(status); }
static inline int vigil_wexitstatus(int status) { return WEXITSTATUS(status); }
static inline int vigil_wifsignaled(int status) { return WIFSIGNALED(status); }
static inline int vigil_wtermsig(int status) { return WTERMSIG(status); }
#endif
