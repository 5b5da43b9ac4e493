/*
 * pylock's C core on Linux and macOS: interruptible kernel waits.
 *
 * A wait is one blocking syscall (flock, ppoll, kevent).  Timeouts and
 * cancellation end it with pylock's wake signal, whose handler does nothing
 * and is installed without SA_RESTART, so the syscall returns EINTR.
 *
 * The wake signal is borrowed from the program, so pylock re-checks it
 * before every wait and before every send:
 *  - the handler must still be pylock's; if the program reset it to
 *    SIG_DFL pylock takes it back, if the program installed its own handler
 *    or SIG_IGN pylock leaves that signal alone for good and claims another
 *    free one (the program's handler is never called by pylock);
 *  - the waiting thread unblocks the wake signal (and only it) for the
 *    length of the wait, so threads that block every signal still wake;
 *  - repeats after a timeout or cancel come from a kernel timer (Linux) or
 *    a pylock thread (macOS) at most once a millisecond while the wait
 *    lasts, so nothing queues up and the canceller never blocks.
 * With no free signal, waits without a timeout still work; timed waits
 * fail at once with ENOTSUP and pl_waiter_cancel says it cannot interrupt.
 */
#if !defined(_WIN32)

#include "pl_wait_internal.h"
#include "pylock.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>
#endif

/* ---- the wake signal ---------------------------------------------- */

static pthread_mutex_t claim_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int wake_sig;      /* 0: none claimed */
static atomic_int lost_sig;      /* the last signal the program took back */

static void on_wake_signal(int sig, siginfo_t *info, void *ctx)
{
    /* Its only job is to make the blocking syscall return EINTR. */
    (void)sig;
    (void)info;
    (void)ctx;
}

static int is_ours(const struct sigaction *sa)
{
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_wake_signal &&
           !(sa->sa_flags & SA_RESTART);
}

static int is_free(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_DFL;
}

PYLOCK_HOT static int still_ours(int sig)
{
    struct sigaction cur;
    return sig > 0 && sigaction(sig, NULL, &cur) == 0 && is_ours(&cur);
}

static int install(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_wake_signal;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: the wait must see EINTR */
    return sigaction(sig, &sa, NULL) == 0;
}

/* Candidates, best first: on Linux the real-time signals from the top
 * (programs and libraries take them from the bottom), on macOS SIGUSR2. */
static int candidate(int i)
{
#if defined(SIGRTMAX)
    int sig = SIGRTMAX - i;
    return sig >= SIGRTMIN ? sig : 0;
#else
    return i == 0 ? SIGUSR2 : 0;
#endif
}

PYLOCK_HOT int pl_wake_signal(void)
{
    int sig = atomic_load(&wake_sig);
    struct sigaction cur;
    if (still_ours(sig))
        return sig; /* the common case: one sigaction query */
    pthread_mutex_lock(&claim_mu);
    sig = atomic_load(&wake_sig);
    if (sig > 0 && sigaction(sig, NULL, &cur) == 0 && !is_ours(&cur)) {
        if (is_free(&cur) && install(sig)) {
            /* The program reset it to the default (a library restoring
             * what it saw): free again, so pylock takes it back. */
        } else {
            atomic_store(&lost_sig, sig); /* the program's now: never touched again */
            sig = 0;
        }
    }
    if (sig == 0) {
        for (int i = 0; (sig = candidate(i)) != 0; i++) {
            if (sig == atomic_load(&lost_sig))
                continue;
            if (sigaction(sig, NULL, &cur) == 0 && is_free(&cur) && install(sig))
                break;
        }
    }
    atomic_store(&wake_sig, sig);
    pthread_mutex_unlock(&claim_mu);
    return sig;
}

int pl_wake_signal_lost(void)
{
    return atomic_load(&lost_sig);
}

/* ---- waiters ------------------------------------------------------ */

struct pl_waiter {
    pthread_mutex_t mu; /* orders the canceller against the wait's end */
    atomic_int cancelled;
    int active;         /* the waiting thread is between begin and end */
    int sig;            /* the wake signal this wait can be woken by, or 0 */
    int reblock;        /* the thread had sig blocked: block it again */
    pthread_t thread;
    struct timespec deadline; /* CLOCK_MONOTONIC */
    int has_deadline;
    int has_timer;
#if defined(__linux__)
    pid_t tid;
    timer_t timer;
#elif defined(__APPLE__)
    pthread_cond_t cond; /* wakes the interrupter when the wait ends */
    pthread_t interrupter;
#endif
};

PYLOCK_HOT static void now_monotonic(struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
}

PYLOCK_HOT static int deadline_passed(const pl_waiter *w)
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

#if defined(__linux__)
/* Fires sig at the waiting thread after first_ns, then every millisecond
 * until the wait ends and the timer is deleted: a signal that lands just
 * before the thread enters the syscall is repeated, and a timer never has
 * more than one signal pending, so nothing accumulates.  Called with mu
 * held. */
static int arm_timer(pl_waiter *w, int64_t first_ns)
{
    struct itimerspec its;
    if (!w->has_timer) {
        struct sigevent sev;
        memset(&sev, 0, sizeof sev);
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = w->sig;
#ifdef sigev_notify_thread_id
        sev.sigev_notify_thread_id = w->tid;
#else
        sev._sigev_un._tid = w->tid;
#endif
        if (timer_create(CLOCK_MONOTONIC, &sev, &w->timer) != 0)
            return errno;
        w->has_timer = 1;
    }
    memset(&its, 0, sizeof its);
    /* Relative: the kernel counts on its own clock, so a process whose
     * CLOCK_MONOTONIC is interposed (faketime) still times out on time. */
    its.it_value.tv_sec = (time_t)(first_ns / 1000000000LL);
    its.it_value.tv_nsec = (long)(first_ns % 1000000000LL);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1; /* zero would disarm the timer */
    its.it_interval.tv_nsec = 1000 * 1000;
    return timer_settime(w->timer, 0, &its, NULL) == 0 ? 0 : errno;
}

PYLOCK_HOT static void disarm(pl_waiter *w)
{
    if (w->has_timer) {
        timer_delete(w->timer);
        w->has_timer = 0;
    }
}
#elif defined(__APPLE__)
/* macOS has no per-thread timers: a short-lived pylock thread sleeps until
 * the deadline, a cancel or the end of the wait, then interrupts the waiter
 * once a millisecond, re-checking the signal each time, until it leaves.
 * SIGUSR2 is not queued, so repeats never accumulate. */
static void *interrupter(void *arg)
{
    pl_waiter *w = arg;
    struct timespec now, rel;
    pthread_mutex_lock(&w->mu);
    while (w->active && !atomic_load(&w->cancelled) && !deadline_passed(w)) {
        if (w->has_deadline) {
            now_monotonic(&now);
            rel.tv_sec = w->deadline.tv_sec - now.tv_sec;
            rel.tv_nsec = w->deadline.tv_nsec - now.tv_nsec;
            if (rel.tv_nsec < 0) {
                rel.tv_sec -= 1;
                rel.tv_nsec += 1000000000L;
            }
            pthread_cond_timedwait_relative_np(&w->cond, &w->mu, &rel);
        } else {
            pthread_cond_wait(&w->cond, &w->mu);
        }
    }
    while (w->active && still_ours(w->sig)) {
        rel.tv_sec = 0;
        rel.tv_nsec = 1000 * 1000;
        pthread_kill(w->thread, w->sig);
        pthread_cond_timedwait_relative_np(&w->cond, &w->mu, &rel);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int arm_timer(pl_waiter *w, int64_t first_ns)
{
    (void)first_ns; /* the deadline is in w */
    if (w->has_timer) {
        pthread_cond_signal(&w->cond);
        return 0;
    }
    int err = pthread_create(&w->interrupter, NULL, interrupter, w);
    if (err == 0)
        w->has_timer = 1;
    return err;
}

PYLOCK_HOT static void disarm(pl_waiter *w)
{
    if (w->has_timer) {
        pthread_t t = w->interrupter;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->mu);
        pthread_join(t, NULL);
        pthread_mutex_lock(&w->mu);
        w->has_timer = 0;
    }
}
#endif

PYLOCK_HOT int pl__wait_begin(pl_waiter *w, int64_t timeout_ns)
{
    int sig = pl_wake_signal();
    int err = 0;
    if (sig == 0 && timeout_ns >= 0)
        return ENOTSUP; /* the program has taken every candidate signal */
    pthread_mutex_lock(&w->mu);
    if (atomic_load(&w->cancelled)) {
        pthread_mutex_unlock(&w->mu);
        return ECANCELED;
    }
    w->thread = pthread_self();
#if defined(__linux__)
    w->tid = (pid_t)syscall(SYS_gettid);
#endif
    w->sig = sig;
    w->reblock = 0;
    w->has_timer = 0;
    w->has_deadline = timeout_ns >= 0;
    if (sig != 0) {
        sigset_t one, old;
        sigemptyset(&one);
        sigaddset(&one, sig);
        if (pthread_sigmask(SIG_UNBLOCK, &one, &old) == 0)
            w->reblock = sigismember(&old, sig) == 1;
    }
    w->active = 1;
    if (w->has_deadline) {
        now_monotonic(&w->deadline);
        w->deadline.tv_sec += (time_t)(timeout_ns / 1000000000LL);
        w->deadline.tv_nsec += (long)(timeout_ns % 1000000000LL);
        if (w->deadline.tv_nsec >= 1000000000L) {
            w->deadline.tv_sec += 1;
            w->deadline.tv_nsec -= 1000000000L;
        }
        err = arm_timer(w, timeout_ns);
    }
    pthread_mutex_unlock(&w->mu);
    if (err != 0) {
        pl__wait_end(w, -1, EINTR);
        return err;
    }
    return 0;
}

PYLOCK_HOT int pl__wait_end(pl_waiter *w, int rc, int saved_errno)
{
    int timed_out = deadline_passed(w);
    pthread_mutex_lock(&w->mu);
    w->active = 0;
    disarm(w);
    if (w->reblock) {
        /* Only after the timer is gone: no repeat can arrive any more. */
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, w->sig);
        pthread_sigmask(SIG_BLOCK, &one, NULL);
        w->reblock = 0;
    }
    pthread_mutex_unlock(&w->mu);
    if (rc == 0)
        return 0;
    if (saved_errno != EINTR)
        return saved_errno;
    if (atomic_load(&w->cancelled))
        return ECANCELED;
    return timed_out ? ETIMEDOUT : EINTR;
}

int pl_waiter_cancel(pl_waiter *w)
{
    int rc = 0;
    atomic_store(&w->cancelled, 1);
    pthread_mutex_lock(&w->mu);
    if (w->active) {
        /* Never send a signal that is no longer pylock's: the program's
         * handler must not run, and SIG_DFL would end the process. */
        if (!still_ours(w->sig))
            rc = ENOTSUP;
        else if (arm_timer(w, 0) != 0)
            rc = pthread_kill(w->thread, w->sig) == 0 ? 0 : ENOTSUP;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

PYLOCK_HOT int pl_lock_wait(pl_handle h, int shared, int64_t timeout_ns, pl_waiter *w)
{
    int rc, err;
    if ((rc = pl__wait_begin(w, timeout_ns)) != 0)
        return rc;
    rc = flock((int)h, shared ? LOCK_SH : LOCK_EX);
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
