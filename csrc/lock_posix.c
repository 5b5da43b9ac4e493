/*
 * pylock's C core on Linux and macOS: lock files with flock(2), and the
 * interruptible waits that make blocking, timed and cancellable
 * acquisition happen in the kernel.
 */
#if !defined(_WIN32)

#include "pl_wait_internal.h"
#include "pylock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#elif defined(__APPLE__)
#include <sys/mount.h>
#include <sys/param.h>
#endif

/* ---- lock files --------------------------------------------------- */

static int classify(const struct stat *st)
{
    if (S_ISREG(st->st_mode))
        return 0;
    if (S_ISDIR(st->st_mode))
        return EISDIR;
    if (S_ISLNK(st->st_mode))
        return PL_E_SYMLINK;
    return PL_E_NOTREG;
}

int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created)
{
    struct stat st;
    int access = (flags & PL_OPEN_READONLY) ? O_RDONLY : O_RDWR;
    /* O_NONBLOCK: a FIFO swapped in after the lstat below must not block
     * the open; flock and pread/pwrite on regular files ignore it. */
    int oflags = access | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
    int fd, rc;

    *created = 0;
    /* Refuse FIFOs, devices and directories before opening them: opening
     * some devices has side effects. The fstat after the open closes the
     * race with a swap. */
    if (lstat(path, &st) == 0) {
        if ((rc = classify(&st)) != 0)
            return rc;
    } else if (errno != ENOENT) {
        return errno;
    }
    for (;;) {
        fd = open(path, oflags);
        if (fd >= 0)
            break;
        if (errno == ENOENT && (flags & PL_OPEN_CREATE)) {
            mode_t mode = create_mode < 0 ? 0644 : (mode_t)create_mode;
            fd = open(path, oflags | O_CREAT | O_EXCL, mode);
            if (fd >= 0) {
                *created = 1;
                /* An explicit mode is the caller's decision: the umask
                 * must not narrow it (a lock shared between users). */
                if (create_mode >= 0 && fchmod(fd, mode) != 0) {
                    rc = errno;
                    close(fd);
                    return rc;
                }
                break;
            }
            if (errno == EEXIST)
                continue; /* another process created it first */
        }
        rc = errno;
        if (rc == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return PL_E_SYMLINK;
        if (rc == ENXIO || rc == ENODEV)
            return PL_E_NOTREG;
        return rc;
    }
    if (fstat(fd, &st) != 0 || (rc = classify(&st)) != 0) {
        rc = rc ? rc : errno;
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int pl_close(pl_handle h)
{
    /* Linux and macOS both release the descriptor even when close fails
     * with EINTR; retrying could close someone else's new descriptor. */
    return close((int)h) == 0 || errno == EINTR ? 0 : errno;
}

#if defined(__linux__) && defined(STATX_INO)
/* statx asking only for what pylock needs.  Not asking for timestamps
 * matters: since Linux 6.13 a stat that reports ctime makes the next write
 * take a fine-grained timestamp and dirty the inode, which doubled the cost
 * of writing the record on every acquisition. */
static int statx_at(int dirfd, const char *path, int flags, pl_file_info *out)
{
    struct statx sx;
    if (statx(dirfd, path, flags, STATX_INO | STATX_NLINK | STATX_SIZE, &sx) != 0)
        return errno;
    out->dev = (uint64_t)makedev(sx.stx_dev_major, sx.stx_dev_minor);
    out->ino = (uint64_t)sx.stx_ino;
    out->nlink = (uint64_t)sx.stx_nlink;
    out->size = (uint64_t)sx.stx_size;
    return 0;
}
#define HAVE_STATX 1
#endif

static void from_stat(const struct stat *st, pl_file_info *out)
{
    out->dev = (uint64_t)st->st_dev;
    out->ino = (uint64_t)st->st_ino;
    out->nlink = (uint64_t)st->st_nlink;
    out->size = (uint64_t)st->st_size;
}

int pl_file_stat(pl_handle h, pl_file_info *out)
{
    struct stat st;
#ifdef HAVE_STATX
    int rc = statx_at((int)h, "", AT_EMPTY_PATH, out);
    if (rc != ENOSYS && rc != EPERM) /* EPERM: old seccomp policies */
        return rc;
#endif
    if (fstat((int)h, &st) != 0)
        return errno;
    from_stat(&st, out);
    return 0;
}

int pl__same_file_at(const char *path, const pl_file_info *st)
{
    pl_file_info now;
    struct stat ps;
    memset(&now, 0, sizeof now);
#ifdef HAVE_STATX
    int rc = statx_at(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, &now);
    if (rc != ENOSYS && rc != EPERM)
        return rc == 0 && now.dev == st->dev && now.ino == st->ino;
#endif
    if (lstat(path, &ps) != 0)
        return 0;
    from_stat(&ps, &now);
    return now.dev == st->dev && now.ino == st->ino;
}

int pl_fs_stat(pl_handle h, pl_fs_info *out)
{
    memset(out, 0, sizeof *out);
#if defined(__linux__)
    struct statfs sf;
    if (fstatfs((int)h, &sf) != 0)
        return errno;
    out->magic = (uint64_t)(unsigned long)sf.f_type;
    out->remote = -1; /* Python decides from the magic number */
#elif defined(__APPLE__)
    struct statfs sf;
    if (fstatfs((int)h, &sf) != 0)
        return errno;
    out->remote = (sf.f_flags & MNT_LOCAL) ? 0 : 1;
    strncpy(out->name, sf.f_fstypename, sizeof out->name - 1);
#else
    out->remote = -1;
#endif
    return 0;
}

static int flock_op(int shared)
{
    return shared ? LOCK_SH : LOCK_EX;
}

int pl_try_lock(pl_handle h, int shared)
{
    for (;;) {
        if (flock((int)h, flock_op(shared) | LOCK_NB) == 0)
            return 0;
        if (errno != EINTR)
            return errno == EAGAIN ? EWOULDBLOCK : errno;
    }
}

int pl_unlock(pl_handle h)
{
    for (;;) {
        if (flock((int)h, LOCK_UN) == 0)
            return 0;
        if (errno != EINTR)
            return errno;
    }
}

int pl_write_record(pl_handle h, const char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite((int)h, buf + done, len - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return ENOSPC;
        done += (size_t)n;
    }
    return 0;
}

int pl_read_record(pl_handle h, char *buf, size_t cap, size_t *len)
{
    size_t done = 0;
    while (done < cap) {
        ssize_t n = pread((int)h, buf + done, cap - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    *len = done;
    return 0;
}

/* ---- interruptible waits ------------------------------------------ */

struct pl_waiter {
    pthread_mutex_t mu;  /* orders cancel's signals against the wait's end */
    atomic_int cancelled;
    int active;          /* the owning thread is between begin and end */
    pthread_t thread;
    struct timespec deadline; /* CLOCK_MONOTONIC */
    int has_deadline;
#if defined(__linux__)
    timer_t timer;
    int has_timer;
#elif defined(__APPLE__)
    pthread_cond_t cond; /* wakes the deadline thread when the wait ends */
    pthread_t timer_thread;
    int has_timer;
#endif
};

static int wake_signal;
static pthread_once_t wake_once = PTHREAD_ONCE_INIT;

static void on_wake_signal(int sig)
{
    (void)sig; /* its only job is to make the blocking syscall return EINTR */
}

/* pylock's wake signal: on Linux the highest real-time signal nobody has
 * claimed, on macOS (no real-time signals) SIGUSR2 unless it is taken. */
static void install_wake_signal(void)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_wake_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: the wait must see EINTR */
#if defined(SIGRTMAX)
    for (int sig = SIGRTMAX; sig >= SIGRTMIN; sig--) {
#else
    for (int sig = SIGUSR2; sig == SIGUSR2; sig = 0) {
#endif
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
            !(old.sa_flags & SA_SIGINFO) && sigaction(sig, &sa, NULL) == 0) {
            wake_signal = sig;
            return;
        }
    }
}

static void now_monotonic(struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
}

static int deadline_passed(const pl_waiter *w)
{
    struct timespec now;
    if (!w->has_deadline)
        return 0;
    now_monotonic(&now);
    return now.tv_sec > w->deadline.tv_sec ||
           (now.tv_sec == w->deadline.tv_sec && now.tv_nsec >= w->deadline.tv_nsec);
}

pl_waiter *pl_waiter_new(void)
{
    pl_waiter *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
#if defined(__APPLE__)
    pthread_cond_init(&w->cond, NULL);
#endif
    atomic_init(&w->cancelled, 0);
    return w;
}

void pl_waiter_free(pl_waiter *w)
{
    if (w == NULL)
        return;
    pthread_mutex_destroy(&w->mu);
#if defined(__APPLE__)
    pthread_cond_destroy(&w->cond);
#endif
    free(w);
}

int pl__wait_cancelled(pl_waiter *w)
{
    return atomic_load(&w->cancelled);
}

/* Sends the wake signal to the waiting thread until it has left its wait.
 * Repeating closes the window where the signal lands just before the
 * thread enters the syscall; it only runs at a timeout or a cancel. */
static void interrupt_waiter(pl_waiter *w)
{
    const struct timespec pause = {0, 50 * 1000};
    pthread_mutex_lock(&w->mu);
    while (w->active) {
        pthread_kill(w->thread, wake_signal);
        pthread_mutex_unlock(&w->mu);
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

void pl_waiter_cancel(pl_waiter *w)
{
    pthread_once(&wake_once, install_wake_signal);
    atomic_store(&w->cancelled, 1);
    if (wake_signal != 0)
        interrupt_waiter(w);
}

#if defined(__APPLE__)
/* macOS has no per-thread timers: a short-lived thread sleeps until the
 * deadline (or the end of the wait) and then interrupts the waiter. */
static void *deadline_thread(void *arg)
{
    pl_waiter *w = arg;
    struct timespec now, rel;
    pthread_mutex_lock(&w->mu);
    while (w->active && !deadline_passed(w)) {
        now_monotonic(&now);
        rel.tv_sec = w->deadline.tv_sec - now.tv_sec;
        rel.tv_nsec = w->deadline.tv_nsec - now.tv_nsec;
        if (rel.tv_nsec < 0) {
            rel.tv_sec -= 1;
            rel.tv_nsec += 1000000000L;
        }
        pthread_cond_timedwait_relative_np(&w->cond, &w->mu, &rel);
    }
    pthread_mutex_unlock(&w->mu);
    interrupt_waiter(w);
    return NULL;
}
#endif

int pl__wait_begin(pl_waiter *w, int64_t timeout_ns)
{
    pthread_once(&wake_once, install_wake_signal);
    if (wake_signal == 0 && (timeout_ns >= 0))
        return ENOTSUP; /* every candidate signal is taken by the application */
    pthread_mutex_lock(&w->mu);
    w->thread = pthread_self();
    w->active = 1;
    w->has_deadline = timeout_ns >= 0;
    w->has_timer = 0;
    pthread_mutex_unlock(&w->mu);
    if (atomic_load(&w->cancelled)) {
        pl__wait_end(w, -1, EINTR);
        return ECANCELED;
    }
    if (!w->has_deadline)
        return 0;
    now_monotonic(&w->deadline);
    w->deadline.tv_sec += (time_t)(timeout_ns / 1000000000LL);
    w->deadline.tv_nsec += (long)(timeout_ns % 1000000000LL);
    if (w->deadline.tv_nsec >= 1000000000L) {
        w->deadline.tv_sec += 1;
        w->deadline.tv_nsec -= 1000000000L;
    }
#if defined(__linux__)
    {
        struct sigevent sev;
        struct itimerspec its;
        memset(&sev, 0, sizeof sev);
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = wake_signal;
#ifdef sigev_notify_thread_id
        sev.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
#else
        sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
#endif
        if (timer_create(CLOCK_MONOTONIC, &sev, &w->timer) != 0) {
            int err = errno;
            pl__wait_end(w, -1, EINTR);
            return err;
        }
        memset(&its, 0, sizeof its);
        /* Relative: the kernel counts the interval on its own clock, so a
         * process whose CLOCK_MONOTONIC is interposed (faketime) or offset
         * still times out on time. */
        its.it_value.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        its.it_value.tv_nsec = (long)(timeout_ns % 1000000000LL);
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
            its.it_value.tv_nsec = 1; /* zero would disarm the timer */
        /* After the deadline, fire again every millisecond: a first
         * signal that lands just before the syscall must not be lost. */
        its.it_interval.tv_nsec = 1000 * 1000;
        if (timer_settime(w->timer, 0, &its, NULL) != 0) {
            int err = errno;
            timer_delete(w->timer);
            pl__wait_end(w, -1, EINTR);
            return err;
        }
        w->has_timer = 1;
    }
#elif defined(__APPLE__)
    {
        int err = pthread_create(&w->timer_thread, NULL, deadline_thread, w);
        if (err != 0) {
            pl__wait_end(w, -1, EINTR);
            return err;
        }
        w->has_timer = 1;
    }
#endif
    return 0;
}

int pl__wait_end(pl_waiter *w, int rc, int saved_errno)
{
    int timed_out = deadline_passed(w);
    pthread_mutex_lock(&w->mu);
    w->active = 0;
#if defined(__APPLE__)
    pthread_cond_signal(&w->cond);
#endif
    pthread_mutex_unlock(&w->mu);
    if (w->has_timer) {
#if defined(__linux__)
        timer_delete(w->timer);
#elif defined(__APPLE__)
        pthread_join(w->timer_thread, NULL);
#endif
        w->has_timer = 0;
    }
    if (rc == 0)
        return 0;
    if (saved_errno != EINTR)
        return saved_errno;
    if (atomic_load(&w->cancelled))
        return ECANCELED;
    return timed_out ? ETIMEDOUT : EINTR;
}

int pl_lock_wait(pl_handle h, int shared, int64_t timeout_ns, pl_waiter *w)
{
    int rc, err;
    if ((rc = pl__wait_begin(w, timeout_ns)) != 0)
        return rc;
    rc = flock((int)h, flock_op(shared));
    err = rc == 0 ? 0 : errno;
    rc = pl__wait_end(w, rc, err);
    /* A cancel that raced with the grant wins: the caller has given up and
     * must never end up holding the lock. */
    if (rc == 0 && atomic_load(&w->cancelled)) {
        pl_unlock(h);
        return ECANCELED;
    }
    return rc;
}

#endif /* !_WIN32 */
