/*
 * pylock's C core, processes on Linux: pidfd pinning and /proc identity.
 * What the fallback without pidfd_open needs is in fallback_linux.c; what
 * Linux shares with macOS in proc_posix.c and sigchld_posix.c.
 */
#ifdef __linux__

#include "pylock_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pl_linux_internal.h"
#include "pl_proc_internal.h"
#include "pl_wait_internal.h"

/* Debian 12 (glibc 2.36, linux 6.1 headers) lacks several of these. */
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#define PL_PIDFS_MAGIC 0x50494446UL
#define PL_PIDFD_INFO_EXIT (1ULL << 3)

/* PIDFD_INFO_SIZE_VER0 layout; the ioctl is extensible, the kernel copies
 * what fits in the size encoded in the request number. */
struct pl_pidfd_info {
    uint64_t mask;
    uint64_t cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    int32_t exit_code; /* a wait status, valid with PIDFD_INFO_EXIT (6.15+) */
};
#define PL_PIDFD_GET_INFO _IOWR(0xFF, 11, struct pl_pidfd_info)

/* ------------------------------------------------------------------ */
/* small file helpers                                                   */

int pl__read_small(const char *path, char *buf, size_t cap, size_t *len)
{
    int fd;
    size_t n = 0;

    do {
        fd = open(path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return errno;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            return e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return 0;
}

static int64_t pid_max(void)
{
    char buf[32];
    size_t len;

    if (pl__read_small("/proc/sys/kernel/pid_max", buf, sizeof buf, &len) != 0)
        return INT_MAX; /* /proc not mounted: the kernel range check decides */
    return strtoll(buf, NULL, 10);
}

static pthread_once_t boot_once = PTHREAD_ONCE_INIT;
static char boot_id[40];

static void read_boot_id(void)
{
    char buf[64];
    size_t len;

    if (pl__read_small("/proc/sys/kernel/random/boot_id", buf, sizeof buf, &len) != 0)
        return; /* left empty: identities then compare by start time alone */
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        buf[--len] = '\0';
    if (len >= sizeof boot_id)
        len = sizeof boot_id - 1;
    memcpy(boot_id, buf, len);
    boot_id[len] = '\0';
}

static void fill_boot_id(pl_identity *out)
{
    pthread_once(&boot_once, read_boot_id);
    memcpy(out->boot_id, boot_id, sizeof out->boot_id);
}

/* /proc/<pid>/stat: state (field 3) and starttime (field 22).  comm (field 2)
 * may hold spaces and parentheses, so fields are counted after the LAST ')'. */
int pl__read_stat(int64_t pid, uint64_t *starttime, char *state)
{
    char path[64], buf[1024];
    size_t len;
    int rc;

    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    rc = pl__read_small(path, buf, sizeof buf, &len);
    if (rc == ENOENT || rc == ESRCH)
        return ESRCH;
    if (rc != 0)
        return rc;
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ')
        return EIO;
    p += 2;
    *state = *p;
    /* p is at field 3; starttime is 19 fields further on. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return EIO;
        p++;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || errno != 0)
        return EIO;
    *starttime = (uint64_t)v;
    return 0;
}

/* /proc/<tid> exists for every thread; only a thread-group leader is a
 * process.  Used where pidfd_open (which refuses non-leaders) is missing. */
static int is_thread_group_leader(int64_t pid)
{
    char path[64], buf[2048];
    size_t len;

    snprintf(path, sizeof path, "/proc/%lld/status", (long long)pid);
    if (pl__read_small(path, buf, sizeof buf, &len) != 0)
        return 1; /* cannot tell: the stat read already proved it exists */
    char *p = strstr(buf, "\nTgid:");
    if (p == NULL)
        return 1;
    return strtoll(p + 6, NULL, 10) == pid;
}

/* ------------------------------------------------------------------ */
/* pidfd                                                                */

static int sys_pidfd_open(int64_t pid)
{
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0u);
}

static int is_pidfs(int fd)
{
    struct statfs sfs;

    if (fstatfs(fd, &sfs) != 0)
        return 0;
    return (unsigned long)sfs.f_type == PL_PIDFS_MAGIC;
}

/* Has the process behind a pidfd been reaped?  1, 0, or -1 (cannot tell). */
static int pidfd_reaped(int fd)
{
    if (syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0u) == 0)
        return 0;
    if (errno == ESRCH)
        return 1;
    if (errno == EPERM)
        return 0; /* exists, only signalling is refused */

    /* No pidfd_send_signal (blocked separately): fdinfo shows "Pid: -1"
     * once the process is reaped. */
    char path[64], buf[512];
    size_t len;
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    if (pl__read_small(path, buf, sizeof buf, &len) != 0)
        return -1;
    char *p = strstr(buf, "\nPid:");
    if (p == NULL)
        return -1;
    return strtoll(p + 5, NULL, 10) < 0 ? 1 : 0;
}

int pl_proc_open(int64_t pid, pl_handle *out)
{
    int fd;

    if (!pl__valid_pid(pid))
        return EINVAL;
    fd = sys_pidfd_open(pid);
    if (fd >= 0) {
        *out = fd;
        return 0;
    }
    int e = errno;
    /* A process in the middle of exiting can give EINVAL, a thread that is
     * not a group leader ENOENT: for a pid in range both mean "no live
     * process to pin". */
    if (e == EINVAL || e == ENOENT)
        return pid <= pid_max() ? ESRCH : EINVAL;
    return e;
}

int pl_proc_close(pl_handle h)
{
    if (close((int)h) != 0 && errno != EINTR)
        return errno;
    return 0;
}

/* Identity of the process behind a pidfd; *state is /proc's field 3. */
static int pinned_identity(int fd, int64_t pid, pl_identity *out, char *state)
{
    int rc;

    memset(out, 0, sizeof *out);
    out->pid = pid;
    if (is_pidfs(fd)) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return errno;
        out->pidfs_ino = (uint64_t)st.st_ino;
    }
    rc = pl__read_stat(pid, &out->start_time, state);
    if (rc != 0)
        return rc;
    /* The pidfd holds the pid while the process exists (a zombie too), so
     * if it is still unreaped after the read, the read was of that
     * process and not of a newcomer that got its pid. */
    if (pidfd_reaped(fd) == 1)
        return ESRCH;
    fill_boot_id(out);
    return 0;
}

int pl_proc_identity(pl_handle h, int64_t pid, pl_identity *out)
{
    char state;

    if (!pl__valid_pid(pid))
        return EINVAL;
    return pinned_identity((int)h, pid, out, &state);
}

int pl__is_dead_state(char state)
{
    return state == 'Z' || state == 'X' || state == 'x';
}

/* A zombie has exited: it has no identity as a live process (ESRCH). */
int pl_identity_of(int64_t pid, pl_identity *out)
{
    pl_handle h = -1;
    char state = 0;
    int rc;

    if (!pl__valid_pid(pid))
        return EINVAL;
    rc = pl_proc_open(pid, &h);
    if (rc == 0) {
        rc = pinned_identity((int)h, pid, out, &state);
        close((int)h);
    } else if (rc == ENOSYS || rc == EPERM || rc == EACCES) {
        /* No pidfd here: the same facts, unpinned. */
        memset(out, 0, sizeof *out);
        out->pid = pid;
        rc = pl__read_stat(pid, &out->start_time, &state);
        if (rc == 0 && !is_thread_group_leader(pid))
            rc = ESRCH;
        if (rc == 0)
            fill_boot_id(out);
    }
    if (rc == 0 && pl__is_dead_state(state))
        rc = ESRCH;
    return rc;
}

/* *exited = 1 once POLLIN: the process has exited (zombie or reaped). */
int pl_proc_poll(pl_handle h, int *exited)
{
    struct pollfd p = {.fd = (int)h, .events = POLLIN};
    int r;

    do {
        r = poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return errno;
    if (p.revents & POLLNVAL)
        return EBADF;
    /* POLLHUP (reaped, 6.9+) comes only after POLLIN (exited). */
    *exited = (p.revents & (POLLIN | POLLHUP)) ? 1 : 0;
    return 0;
}

int pl_proc_wait(pl_handle h, int64_t timeout_ns, pl_waiter *w)
{
    struct pollfd p = {.fd = (int)h, .events = POLLIN};
    struct timespec ts, *tsp = NULL;
    int rc, r, e;

    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000);
        ts.tv_nsec = (long)(timeout_ns % 1000000000);
        tsp = &ts;
    }
    if (w != NULL) {
        /* The waiter arms only the cancellation; the timeout is ppoll's. */
        rc = pl__wait_begin(w, -1);
        if (rc != 0)
            return rc;
    }
    r = ppoll(&p, 1, tsp, NULL);
    e = r < 0 ? errno : 0;
    if (w != NULL) {
        rc = pl__wait_end(w, r < 0 ? -1 : 0, e);
        if (r < 0)
            return rc != 0 ? rc : EINTR;
    } else if (r < 0) {
        return e;
    }
    if (r == 0)
        return ETIMEDOUT;
    if (p.revents & POLLNVAL)
        return EBADF;
    return 0;
}

static int decode_wait_status(int wstatus, int *returncode)
{
    if (WIFEXITED(wstatus)) {
        *returncode = WEXITSTATUS(wstatus);
        return 0;
    }
    if (WIFSIGNALED(wstatus)) {
        *returncode = -WTERMSIG(wstatus);
        return 0;
    }
    return ENODATA;
}

int pl_proc_returncode(pl_handle h, int64_t pid, int *returncode)
{
    int fd = (int)h, exited = 0, rc;

    if (!pl__valid_pid(pid))
        return EINVAL;
    /* Our child, not reaped yet: read without reaping. */
    rc = pl__child_status(P_PIDFD, (id_t)fd, &exited, returncode);
    if (rc == EINVAL) {
        /* Before 5.4 waitid does not take a pidfd.  By pid, then make sure
         * the pidfd's process was still unreaped after the read, so the
         * answer was not about a newcomer with the same pid. */
        rc = pl__child_status(P_PID, (id_t)pid, &exited, returncode);
        if (rc == 0 && pidfd_reaped(fd) == 1)
            rc = ECHILD;
    }
    if (rc == 0)
        return exited ? 0 : EAGAIN;
    if (rc != ECHILD)
        return rc;

    /* Not our child, or already reaped: 6.15+ keeps the exit status of a
     * reaped process in its pidfd. */
    struct pl_pidfd_info info;
    memset(&info, 0, sizeof info);
    info.mask = PL_PIDFD_INFO_EXIT;
    if (ioctl(fd, PL_PIDFD_GET_INFO, &info) != 0)
        return ENODATA;
    if (!(info.mask & PL_PIDFD_INFO_EXIT))
        return ENODATA;
    return decode_wait_status(info.exit_code, returncode);
}

int pl_proc_event_fd(pl_handle h, int64_t *fd)
{
    *fd = h;
    return 0;
}

int pl_proc_signal(pl_handle h, int signum)
{
    if (syscall(SYS_pidfd_send_signal, (int)h, signum, NULL, 0u) == 0)
        return 0;
    return errno;
}

#endif /* __linux__ */
