/*
 * pylock's C core on macOS, processes: identity from sysctl(KERN_PROC),
 * exit notification from a kqueue with EVFILT_PROC/NOTE_EXIT, and the
 * fallback's identity checks.  What macOS shares with Linux is in
 * proc_posix.c and sigchld_posix.c.
 *
 * A process handle is a kqueue owning one EVFILT_PROC registration.  The
 * kernel delivers NOTE_EXIT once (EVFILT_PROC is edge-triggered), so the
 * first call that sees it records the exit inside the same kqueue as a
 * triggered, level-style EVFILT_USER event.  Every later poll, wait or
 * event-loop readiness check then sees the exit again, and the state lives
 * in the kernel object, not in memory the handle cannot carry.
 */
#if defined(__APPLE__)

#define _DARWIN_C_SOURCE 1

#include "pl_proc_internal.h"
#include "pl_wait_internal.h"
#include "pylock.h"
#include "pylock_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/event.h>
#include <sys/sysctl.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The EVFILT_USER ident that marks "this process has exited".  Its udata
 * carries what is known about the exit status. */
#define EXIT_MARK_IDENT 1
#define MARK_EXITED 0x10000u
#define MARK_STATUS_KNOWN 0x20000u

/* ---- identity ----------------------------------------------------- */

static int kinfo_of(int64_t pid, struct kinfo_proc *kp)
{
    int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, (int)pid};
    size_t len = sizeof *kp;
    memset(kp, 0, sizeof *kp);
    if (sysctl(mib, 4, kp, &len, NULL, 0) != 0)
        return errno;
    /* A pid with no process is not an error to sysctl: it returns nothing. */
    if (len < sizeof *kp || kp->kp_proc.p_pid != (pid_t)pid)
        return ESRCH;
    return 0;
}

/* kern.bootsessionuuid is fixed for the whole boot.  kern.boottime is the
 * fallback for systems without it: the kernel shifts that one when the
 * wall clock is stepped, so it is second best. */
static pthread_once_t boot_id_once = PTHREAD_ONCE_INIT;
static char boot_id_value[40];

static void read_boot_id(void)
{
    char uuid[64];
    size_t len = sizeof uuid;
    struct timeval bt;
    size_t btlen = sizeof bt;
    int mib[2] = {CTL_KERN, KERN_BOOTTIME};
    if (sysctlbyname("kern.bootsessionuuid", uuid, &len, NULL, 0) == 0 && len > 1 &&
        len <= sizeof boot_id_value) {
        memcpy(boot_id_value, uuid, len);
        boot_id_value[len - 1] = '\0';
    } else if (sysctl(mib, 2, &bt, &btlen, NULL, 0) == 0) {
        snprintf(boot_id_value, sizeof boot_id_value, "boottime-%lld.%06d",
                 (long long)bt.tv_sec, (int)bt.tv_usec);
    }
}

static void boot_id(char *out, size_t cap)
{
    pthread_once(&boot_id_once, read_boot_id);
    snprintf(out, cap, "%s", boot_id_value);
}

static void fill_identity(int64_t pid, const struct kinfo_proc *kp, pl_identity *out)
{
    const struct timeval *st = &kp->kp_proc.p_starttime;
    memset(out, 0, sizeof *out);
    out->pid = pid;
    out->start_time = (uint64_t)st->tv_sec * 1000000u + (uint64_t)st->tv_usec;
    out->pidfs_ino = 0;
    boot_id(out->boot_id, sizeof out->boot_id);
}

/* A zombie has exited: it has no identity as a live process (ESRCH). */
int pl_identity_of(int64_t pid, pl_identity *out)
{
    struct kinfo_proc kp;
    int rc;
    if (!pl__valid_pid(pid))
        return EINVAL;
    if ((rc = kinfo_of(pid, &kp)) != 0)
        return rc;
    if (kp.kp_proc.p_stat == SZOMB)
        return ESRCH;
    fill_identity(pid, &kp, out);
    return 0;
}

/* ---- exit notification -------------------------------------------- */

static int set_cloexec(int fd)
{
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)
        return errno;
    return 0;
}

/* Applies one change and returns its own result, not a pending event. */
static int kq_change(int kq, struct kevent *change)
{
    struct kevent receipt;
    int n;
    change->flags |= EV_RECEIPT;
    do {
        n = kevent(kq, change, 1, &receipt, 1, NULL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno;
    if (n == 1 && (receipt.flags & EV_ERROR) && receipt.data != 0)
        return (int)receipt.data;
    return 0;
}

static int mark_exited(int kq, uintptr_t mark)
{
    struct kevent ev;
    /* No EV_CLEAR: the user event stays triggered after each retrieval. */
    EV_SET(&ev, EXIT_MARK_IDENT, EVFILT_USER, EV_ADD | EV_ENABLE, NOTE_TRIGGER, 0,
           (void *)mark);
    return kq_change(kq, &ev);
}

/* Collects what the kqueue holds within timeout (NULL: block).  *exited is
 * set once the exit is known; *mark gets the recorded mark. */
static int collect(int kq, const struct timespec *timeout, int *exited, uintptr_t *mark)
{
    struct kevent evs[2];
    uintptr_t found = 0;
    int n = kevent(kq, NULL, 0, evs, 2, timeout);
    if (n < 0)
        return errno;
    for (int i = 0; i < n; i++) {
        if (evs[i].filter == EVFILT_USER && evs[i].ident == EXIT_MARK_IDENT) {
            found = (uintptr_t)evs[i].udata;
        } else if (evs[i].filter == EVFILT_PROC && (evs[i].fflags & NOTE_EXIT)) {
            uintptr_t m = MARK_EXITED;
            int rc;
            if (evs[i].fflags & NOTE_EXITSTATUS)
                m |= MARK_STATUS_KNOWN | ((uintptr_t)evs[i].data & 0xffffu);
            if ((rc = mark_exited(kq, m)) != 0)
                return rc;
            if (found == 0)
                found = m;
        }
    }
    *exited = found != 0;
    if (mark != NULL)
        *mark = found;
    return 0;
}

static int poll_mark(int kq, int *exited, uintptr_t *mark)
{
    const struct timespec zero = {0, 0};
    int rc;
    do {
        rc = collect(kq, &zero, exited, mark);
    } while (rc == EINTR);
    return rc;
}

int pl_proc_open(int64_t pid, pl_handle *out)
{
    struct kevent ev;
    struct kinfo_proc kp;
    int kq, rc;
    if (!pl__valid_pid(pid))
        return EINVAL;
    kq = kqueue();
    if (kq < 0)
        return errno;
    /* A kqueue is not inherited by fork(), but it is by exec(). */
    if ((rc = set_cloexec(kq)) != 0)
        goto fail;
    /* The exit status comes with the event for our children and for
     * processes we may signal; other processes refuse it with EACCES
     * (older kernels: children only), and then exit alone is enough. */
    EV_SET(&ev, (uintptr_t)pid, EVFILT_PROC, EV_ADD | EV_ENABLE, NOTE_EXIT | NOTE_EXITSTATUS,
           0, NULL);
    rc = kq_change(kq, &ev);
    if (rc != 0 && rc != ESRCH) {
        EV_SET(&ev, (uintptr_t)pid, EVFILT_PROC, EV_ADD | EV_ENABLE, NOTE_EXIT, 0, NULL);
        rc = kq_change(kq, &ev);
    }
    if (rc == ESRCH) {
        /* The kernel refuses EVFILT_PROC on a zombie.  A zombie has exited
         * but is still there (its parent may read its status): like a pidfd
         * on Linux, the handle then opens already marked as exited. */
        if (kinfo_of(pid, &kp) != 0 || kp.kp_proc.p_stat != SZOMB)
            goto fail;
        if ((rc = mark_exited(kq, MARK_EXITED)) != 0)
            goto fail;
    } else if (rc != 0) {
        goto fail;
    } else if (kinfo_of(pid, &kp) == 0 && kp.kp_proc.p_stat == SZOMB) {
        /* Should a kernel ever accept the registration on a zombie, its
         * NOTE_EXIT is in the past and would never come: record it now. */
        int exited;
        if ((rc = poll_mark(kq, &exited, NULL)) != 0)
            goto fail;
        if (!exited && (rc = mark_exited(kq, MARK_EXITED)) != 0)
            goto fail;
    }
    *out = kq;
    return 0;
fail:
    close(kq);
    return rc;
}

int pl_proc_close(pl_handle h)
{
    return close((int)h) == 0 || errno == EINTR ? 0 : errno;
}

int pl_proc_identity(pl_handle h, int64_t pid, pl_identity *out)
{
    struct kinfo_proc kp;
    int rc, exited;
    if (!pl__valid_pid(pid))
        return EINVAL;
    if ((rc = kinfo_of(pid, &kp)) != 0)
        return rc;
    /* Once the pinned process has exited, a live process under its pid is
     * a newcomer: only its zombie still stands for it. */
    if ((rc = poll_mark((int)h, &exited, NULL)) != 0)
        return rc;
    if (exited && kp.kp_proc.p_stat != SZOMB)
        return ESRCH;
    fill_identity(pid, &kp, out);
    return 0;
}

int pl_proc_poll(pl_handle h, int *exited)
{
    return poll_mark((int)h, exited, NULL);
}

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int pl_proc_wait(pl_handle h, int64_t timeout_ns, pl_waiter *w)
{
    int64_t deadline = timeout_ns >= 0 ? monotonic_ns() + timeout_ns : -1;
    int rc, exited = 0;
    /* kevent takes the timeout itself; the waiter only carries
     * cancellation, so no deadline thread is needed. */
    if (w != NULL && (rc = pl__wait_begin(w, -1)) != 0)
        return rc;
    for (;;) {
        struct timespec ts, *tp = NULL;
        if (deadline >= 0) {
            int64_t left = deadline - monotonic_ns();
            if (left < 0)
                left = 0;
            ts.tv_sec = (time_t)(left / 1000000000LL);
            ts.tv_nsec = (long)(left % 1000000000LL);
            tp = &ts;
        }
        rc = collect((int)h, tp, &exited, NULL);
        /* Anything but the exit (nothing else is registered) or the end
         * of the time means wait on. */
        if (rc != 0 || exited || (deadline >= 0 && monotonic_ns() >= deadline))
            break;
    }
    if (w != NULL)
        rc = pl__wait_end(w, rc == 0 ? 0 : -1, rc);
    if (rc != 0)
        return rc;
    return exited ? 0 : ETIMEDOUT;
}

static int decode_status(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return status;
}

int pl_proc_returncode(pl_handle h, int64_t pid, int *returncode)
{
    uintptr_t mark = 0;
    int rc, exited;
    if (!pl__valid_pid(pid))
        return EINVAL;
    if ((rc = poll_mark((int)h, &exited, &mark)) != 0)
        return rc;
    if (!exited)
        return EAGAIN;
    if (mark & MARK_STATUS_KNOWN) {
        *returncode = decode_status((int)(mark & 0xffffu));
        return 0;
    }
    /* Our own child, not yet reaped: read its status without reaping. */
    rc = pl__child_status(P_PID, (id_t)pid, &exited, returncode);
    if (rc == 0 && exited)
        return 0;
    return rc == 0 || rc == ECHILD ? ENODATA : rc;
}

int pl_proc_event_fd(pl_handle h, int64_t *fd)
{
    *fd = h;
    return 0;
}

/* A kqueue registration watches a process; it cannot signal one. */
int pl_proc_signal(pl_handle h, int signum)
{
    (void)h;
    (void)signum;
    return ENOSYS;
}

/* ---- fallback ----------------------------------------------------- */

/* macOS cannot read other threads' signal masks: judge by this thread's,
 * and when it blocks SIGCHLD say nobody may hear it (the caller then
 * checks more often rather than missing exits). */
int pl__sigchld_blocked_everywhere(void)
{
    sigset_t cur;
    return pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, SIGCHLD);
}

/* No cheap machine-wide fingerprint: the caller checks every process. */
int pl_procs_fingerprint(uint64_t *tasks, int64_t *last_pid)
{
    (void)tasks;
    (void)last_pid;
    return ENOSYS;
}

int pl_procs_gone(const int64_t *pids, const uint64_t *start_times, int64_t n,
                  int64_t exact_after, int64_t exact_upto, uint8_t *gone)
{
    (void)exact_after; /* one sysctl answers both questions */
    (void)exact_upto;
    for (int64_t i = 0; i < n; i++) {
        struct kinfo_proc kp;
        gone[i] = 0;
        if (!pl__valid_pid(pids[i])) {
            gone[i] = 1;
            continue;
        }
        int rc = kinfo_of(pids[i], &kp);
        if (rc == ESRCH) {
            gone[i] = 1;
        } else if (rc != 0) {
            return rc;
        } else {
            const struct timeval *st = &kp.kp_proc.p_starttime;
            uint64_t start = (uint64_t)st->tv_sec * 1000000u + (uint64_t)st->tv_usec;
            if (kp.kp_proc.p_stat == SZOMB || (start_times[i] != 0 && start != start_times[i]))
                gone[i] = 1;
        }
    }
    return 0;
}

#endif /* __APPLE__ */
