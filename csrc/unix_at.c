/*
 * pylock's C core, every platform: a unix socket bound or connected by its
 * name in a directory descriptor (pl_unix_at).
 *
 * bind() and connect() take a path, and a path is looked up again at each
 * call: whoever may rename the socket's directory or a parent could move
 * the bind elsewhere between pylock's check of the directory and the bind.
 * A thread's working directory is per thread on Linux once it unshares its
 * filesystem context (CLONE_FS), so a short-lived thread of pylock's sets
 * its working directory to the checked descriptor and passes the bare name:
 * the lookup starts from that very directory.  Its umask is its own too,
 * so a bind creates the socket file with the caller's mode from its first
 * instant and nothing is ever changed by name afterwards (a chmod after
 * the bind would follow whatever another user put at the name meanwhile).
 */
#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#endif

#include "pl_lock_internal.h"
#include "pylock.h"

#include <errno.h>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct unix_at {
    int dir, sock, op, mode;
    struct sockaddr_un addr;
    socklen_t len;
    int rc;
};

static void *unix_at_thread(void *arg)
{
    struct unix_at *job = arg;
    int r;
    /* The copy this thread gets is its own: the program's working
     * directory and umask stay as they are for every other thread. */
    if (unshare(CLONE_FS) != 0) {
        job->rc = ENOSYS; /* a seccomp policy (containers): the caller falls back */
        return NULL;
    }
    if (fchdir(job->dir) != 0) {
        job->rc = errno;
        return NULL;
    }
    if (job->op == PL_UNIX_BIND) {
        if (job->mode >= 0)
            umask((mode_t)(~job->mode & 0777));
        r = bind(job->sock, (struct sockaddr *)&job->addr, job->len);
    } else {
        do
            r = connect(job->sock, (struct sockaddr *)&job->addr, job->len);
        while (r != 0 && errno == EINTR);
    }
    job->rc = r == 0 ? 0 : errno;
    return NULL;
}

int pl_unix_at(pl_handle dir, const char *name, int64_t sock, int op, int mode)
{
    struct unix_at job;
    sigset_t all, old;
    pthread_t thread;
    size_t n;
    int err;

    if (dir < 0 || sock < 0)
        return EBADF;
    if (!pl__is_name(name) || (op != PL_UNIX_BIND && op != PL_UNIX_CONNECT) ||
        mode < -1 || mode > 0777)
        return EINVAL;
    memset(&job, 0, sizeof job);
    n = strlen(name);
    if (n >= sizeof job.addr.sun_path)
        return ENAMETOOLONG;
    job.addr.sun_family = AF_UNIX;
    memcpy(job.addr.sun_path, name, n + 1);
    job.len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    job.dir = (int)dir;
    job.sock = (int)sock;
    job.op = op;
    job.mode = mode;
    /* The thread starts with every signal blocked (it inherits this mask),
     * so none of the program's signals is ever delivered to it. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&thread, NULL, unix_at_thread, &job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0)
        return err;
    pthread_join(thread, NULL);
    return job.rc;
}

#else

int pl_unix_at(pl_handle dir, const char *name, int64_t sock, int op, int mode)
{
    (void)dir;
    (void)name;
    (void)sock;
    (void)op;
    (void)mode;
    return ENOSYS; /* no per-thread working directory here: the caller falls back */
}

#endif
