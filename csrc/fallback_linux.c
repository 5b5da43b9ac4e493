/*
 * pylock's C core on Linux without pidfd_open (kernels before 5.3, seccomp
 * policies): the facts the fallback needs.  Whether any thread can take
 * SIGCHLD, a cheap fingerprint of task creation and release, and identity
 * checks of many processes at once for the shared schedule
 * (pylock/_exit_schedule.py).
 */
#ifdef __linux__

#include "pl_linux_internal.h"
#include "pl_proc_internal.h"
#include "pylock_proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int blocked_in_status(const char *path)
{
    char buf[2048];
    size_t len;

    if (pl__read_small(path, buf, sizeof buf, &len) != 0)
        return -1;
    char *p = strstr(buf, "\nSigBlk:");
    if (p == NULL)
        return -1;
    unsigned long long mask = strtoull(p + 8, NULL, 16);
    return (mask >> (SIGCHLD - 1)) & 1ULL ? 1 : 0;
}

/* Any thread that does not block SIGCHLD takes process-directed SIGCHLD,
 * and pylock's handler runs there. */
int pl__sigchld_blocked_everywhere(void)
{
    sigset_t cur;
    char path[64];
    struct dirent *de;
    int all = 1;

    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) != 0 || !sigismember(&cur, SIGCHLD))
        return 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return 1; /* only this thread can be seen, and it blocks SIGCHLD */
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%.20s/status", de->d_name);
        if (blocked_in_status(path) == 0) {
            all = 0;
            break;
        }
    }
    closedir(d);
    return all;
}

/* /proc/loadavg ends with "running/threads last_pid": the number of tasks
 * on the machine (it drops when one is reaped) and the last pid handed out
 * in this pid namespace (it moves when one is created).  One read of a
 * small file, whatever the number of watched processes. */
static int loadavg_fd = -1;
static pthread_mutex_t loadavg_mu = PTHREAD_MUTEX_INITIALIZER;

int pl_procs_fingerprint(uint64_t *tasks, int64_t *last_pid)
{
    char buf[128];
    ssize_t n;

    pthread_mutex_lock(&loadavg_mu);
    if (loadavg_fd < 0) {
        do {
            loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        } while (loadavg_fd < 0 && errno == EINTR);
    }
    if (loadavg_fd < 0) {
        int e = errno;
        pthread_mutex_unlock(&loadavg_mu);
        return e;
    }
    do {
        n = pread(loadavg_fd, buf, sizeof buf - 1, 0);
    } while (n < 0 && errno == EINTR);
    int e = n < 0 ? errno : 0;
    pthread_mutex_unlock(&loadavg_mu);
    if (n < 0)
        return e;
    buf[n] = '\0';
    char *slash = strchr(buf, '/');
    if (slash == NULL)
        return EIO;
    char *end;
    *tasks = strtoull(slash + 1, &end, 10);
    if (end == slash + 1)
        return EIO;
    *last_pid = strtoll(end, NULL, 10);
    return 0;
}

int pl_procs_gone(const int64_t *pids, const uint64_t *start_times, int64_t n,
                  int64_t exact_after, int64_t exact_upto, uint8_t *gone)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t pid = pids[i];
        gone[i] = 0;
        if (!pl__valid_pid(pid)) {
            gone[i] = 1;
            continue;
        }
        int exact = exact_after < exact_upto ? (pid > exact_after && pid <= exact_upto)
                                             : (pid > exact_after || pid <= exact_upto);
        if (exact_after == exact_upto)
            exact = 0;
        if (!exact) {
            /* The cheapest question the kernel answers about any pid, with
             * no permission check: does it exist (a zombie does)? */
            if (getpgid((pid_t)pid) < 0 && errno == ESRCH)
                gone[i] = 1;
            continue;
        }
        uint64_t start = 0;
        char state = 0;
        int rc = pl__read_stat(pid, &start, &state);
        if (rc == ESRCH || (rc == 0 && (pl__is_dead_state(state) ||
                                        (start_times[i] != 0 && start != start_times[i]))))
            gone[i] = 1;
        else if (rc != 0 && rc != EACCES && rc != EPERM)
            return rc;
    }
    return 0;
}

#endif /* __linux__ */
