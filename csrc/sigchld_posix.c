/*
 * pylock's C core, Linux and macOS: the SIGCHLD self-pipe, the fallback's
 * wakeup where pidfds are missing.
 *
 * pylock is a guest in the program's signal handling, so:
 * - Its handler writes a byte to a non-blocking pipe and then calls the
 *   handler that was there before, with that handler's own flags and mask
 *   (SA_RESTART only if it had it), so the program's handler runs as it
 *   did.  Over SIG_DFL it uses SA_RESTART | SA_NOCLDSTOP, as close to "no
 *   handler" as a handler gets.
 * - It never reads a signal out of the kernel's queue (no signalfd, no
 *   sigwaitinfo): a program that blocks SIGCHLD and takes it itself keeps
 *   every one.
 * - It installs itself in front of the program's handler once.  If the
 *   program (or a second copy of pylock, or a loop like uvloop) installs
 *   another handler later, pylock never re-installs in front of it (a
 *   handler that chains back would then loop); it only takes SIG_DFL back.
 *   pl_sigchld_open reports that it is no longer heard, and the caller's
 *   backstop checks cover the exits nobody tells it about.
 * - A chain that comes back to pylock's handler on the same thread (two
 *   handlers that each call the other) stops there instead of recursing
 *   until the stack overflows.
 */
#if !defined(_WIN32)

#include "pl_proc_internal.h"
#include "pylock_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t pipe_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int pipe_rfd = -1;
static volatile sig_atomic_t pipe_wfd = -1;
static int claimed_once;

/* The handler that was there before, read by the handler while
 * pl_sigchld_open may replace it: two slots, switched atomically. */
static struct sigaction prev_slots[2];
static atomic_int prev_index;

/* Threads currently inside on_sigchld, to stop a chain that loops back. */
#define GUARD_SLOTS 64
static atomic_uintptr_t guard[GUARD_SLOTS];

static uintptr_t self_token(void)
{
    /* pthread_self only reads the thread pointer; it is what every libc
     * does, though POSIX does not list it as async-signal-safe. */
    return (uintptr_t)pthread_self();
}

/* A slot index, -1 when this thread is already inside the handler (the
 * chain came back), -2 when every slot is taken. */
static int guard_enter(uintptr_t me)
{
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (atomic_load(&guard[i]) == me)
            return -1;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t empty = 0;
        if (atomic_compare_exchange_strong(&guard[i], &empty, me))
            return i;
    }
    return -2;
}

static void on_sigchld(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    int slot = guard_enter(self_token());
    if (slot == -1) {
        errno = saved;
        return;
    }
    int wfd = pipe_wfd;
    if (wfd >= 0) {
        char byte = 0;
        ssize_t r = write(wfd, &byte, 1); /* a full pipe already wakes */
        (void)r;
    }
    /* With every guard slot taken (64 threads in this handler at once) the
     * chain is not followed: a loop could not be stopped. */
    if (slot >= 0) {
        const struct sigaction *prev = &prev_slots[atomic_load(&prev_index)];
        if (prev->sa_flags & SA_SIGINFO) {
            if (prev->sa_sigaction != NULL)
                prev->sa_sigaction(sig, info, ctx);
        } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN &&
                   prev->sa_handler != NULL) {
            prev->sa_handler(sig);
        }
        atomic_store(&guard[slot], 0);
    }
    errno = saved;
}

/* A non-blocking, close-on-exec pipe (pipe2 is not on every platform). */
static int new_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        return errno;
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) < 0 ||
            fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0) {
            int err = errno;
            close(fds[0]);
            close(fds[1]);
            return err;
        }
    }
    return 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&pipe_mu);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&pipe_mu);
}

/* A forked child must not share the parent's pipe: its SIGCHLDs would
 * wake the parent and its drains would eat the parent's wakeups.  Swap in
 * a fresh pipe under the same descriptor numbers, which the caller keeps. */
static void atfork_child(void)
{
    int fds[2];
    if (pipe_rfd >= 0 && new_pipe(fds) == 0) {
        dup2(fds[0], pipe_rfd);
        dup2(fds[1], (int)pipe_wfd);
        fcntl(pipe_rfd, F_SETFD, FD_CLOEXEC);
        fcntl((int)pipe_wfd, F_SETFD, FD_CLOEXEC);
        close(fds[0]);
        close(fds[1]);
    }
    for (int i = 0; i < GUARD_SLOTS; i++)
        atomic_store(&guard[i], 0); /* only the forking thread lives on */
    pthread_mutex_init(&pipe_mu, NULL);
}

static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static int is_ours(const struct sigaction *sa)
{
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_sigchld;
}

static int is_default(const struct sigaction *sa)
{
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_DFL;
}

/* Installs pylock's handler where that is a guest's right; *heard says
 * whether it is the handler in place now.  Called with pipe_mu held. */
static int claim(int *heard)
{
    struct sigaction sa, cur;
    *heard = 0;
    if (sigaction(SIGCHLD, NULL, &cur) != 0)
        return errno;
    if (is_ours(&cur)) {
        *heard = 1;
        return 0;
    }
    /* Ignored SIGCHLD or SA_NOCLDWAIT: the kernel reaps children itself
     * and waitid has nothing to read.  A handler would change that for the
     * whole program, so refuse instead. */
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
        return ECHILD;
    if (cur.sa_flags & SA_NOCLDWAIT)
        return ECHILD;
    /* Displaced by a handler installed after pylock's: that handler may
     * chain back to pylock's, so going in front of it could make a loop. */
    if (claimed_once && !is_default(&cur))
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigchld;
    if (is_default(&cur)) {
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NOCLDSTOP;
    } else {
        /* The program's handler keeps its own semantics: whether syscalls
         * restart, its alternate stack, its mask, stop notifications,
         * nesting and one-shot reset. */
        sa.sa_mask = cur.sa_mask;
        sa.sa_flags = SA_SIGINFO | (cur.sa_flags & (SA_RESTART | SA_ONSTACK | SA_NOCLDSTOP |
                                                    SA_NODEFER | SA_RESETHAND));
    }
    int next = 1 - atomic_load(&prev_index);
    prev_slots[next] = cur;
    atomic_store(&prev_index, next);
    if (sigaction(SIGCHLD, &sa, NULL) != 0)
        return errno;
    claimed_once = 1;
    *heard = 1;
    return 0;
}

int pl_sigchld_open(int64_t *fd, int *heard)
{
    int rc = 0;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pipe_mu);
    if (pipe_rfd < 0) {
        int p[2];
        if ((rc = new_pipe(p)) == 0) {
            pipe_rfd = p[0];
            pipe_wfd = p[1];
        }
    }
    if (rc == 0)
        rc = claim(heard);
    if (rc == 0) {
        *fd = pipe_rfd;
        /* Installed, but no thread can take the signal: nothing wakes. */
        if (*heard && pl__sigchld_blocked_everywhere())
            *heard = 0;
    }
    pthread_mutex_unlock(&pipe_mu);
    return rc;
}

int pl_sigchld_drain(int64_t fd)
{
    char buf[512];
    for (;;) {
        ssize_t n = read((int)fd, buf, sizeof buf);
        if (n > 0)
            continue;
        if (n == 0)
            return 0;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
    }
}

#endif /* !_WIN32 */
