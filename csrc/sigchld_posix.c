/*
 * pylock's C core, Linux and macOS: the SIGCHLD self-pipe, the fallback's
 * wakeup where pidfds are missing.  A handler writes a byte to a
 * non-blocking pipe and chains to whatever handler was there before, so it
 * works whatever the signal masks are and takes nothing from the program.
 * (Linux prefers a signalfd when SIGCHLD is blocked in every thread; that
 * choice lives in proc_linux.c.)
 */
#if !defined(_WIN32)

#include "pylock_proc.h"
#include "pl_wait_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t pipe_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static struct sigaction prev;
static int pipe_rfd = -1;
static volatile sig_atomic_t pipe_wfd = -1;

static void on_sigchld(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    int wfd = pipe_wfd;
    if (wfd >= 0) {
        char byte = 0;
        ssize_t r = write(wfd, &byte, 1); /* a full pipe already wakes */
        (void)r;
    }
    if (prev.sa_flags & SA_SIGINFO) {
        if (prev.sa_sigaction != NULL)
            prev.sa_sigaction(sig, info, ctx);
    } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN &&
               prev.sa_handler != NULL) {
        prev.sa_handler(sig);
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
    pthread_mutex_init(&pipe_mu, NULL);
}

static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static int install(void)
{
    struct sigaction sa, cur;
    if (sigaction(SIGCHLD, NULL, &cur) != 0)
        return errno;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigchld)
        return 0;
    /* Ignored SIGCHLD or SA_NOCLDWAIT: the kernel reaps children itself
     * and waitid has nothing to read.  A handler would change that for the
     * whole program, so refuse instead. */
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
        return ECHILD;
    if (cur.sa_flags & SA_NOCLDWAIT)
        return ECHILD;
    prev = cur;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigchld;
    sa.sa_mask = cur.sa_mask;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | (cur.sa_flags & SA_ONSTACK);
    /* Keep stop/continue notifications for a previous handler that asked
     * for them; pylock itself only cares about exits. */
    if ((cur.sa_flags & SA_NOCLDSTOP) ||
        (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_DFL))
        sa.sa_flags |= SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) != 0)
        return errno;
    return 0;
}

int pl__sigchld_pipe(int64_t *fd)
{
    int rc;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pipe_mu);
    if (pipe_rfd < 0) {
        int p[2];
        if ((rc = new_pipe(p)) == 0) {
            pipe_wfd = p[1];
            if ((rc = install()) != 0) {
                pipe_wfd = -1;
                close(p[0]);
                close(p[1]);
            } else {
                pipe_rfd = p[0];
            }
        }
    } else {
        /* Someone may have replaced the handler since (signal.signal):
         * chain in front of the new one. */
        rc = install();
    }
    if (rc == 0)
        *fd = pipe_rfd;
    pthread_mutex_unlock(&pipe_mu);
    return rc;
}

int pl_sigchld_drain(int64_t fd)
{
    /* A multiple of Linux's struct signalfd_siginfo (128 bytes), which a
     * signalfd read needs at least; a pipe takes any size. */
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
