/*
 * Lock-release hints: how an event loop learns, without a thread per wait,
 * that a lock file it waits for may have been released.
 *
 * On Linux one inotify descriptor watches the waited files.  A holder that
 * closes its descriptor or dies closes the open file description, and with
 * it the flock: inotify reports IN_CLOSE_*.  A holder that unlocks and keeps
 * the descriptor open makes no event of its own, so pylock's pl_unlock reads
 * one byte of the file after unlocking, which inotify reports as IN_ACCESS.
 * A hint is never more than that: the waiter tries the lock, and only its
 * own flock decides.  Elsewhere (macOS, Windows) there are no hints: ENOSYS,
 * and waits go to a thread blocked in the kernel.
 */
#include "pylock.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#if defined(__linux__)

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <unistd.h>

/* What a waiter is woken by: a read (pylock's unlock announcing itself) or a
 * close of the file by anyone, the last one of a holder's open file
 * description included.  Never IN_MODIFY: the new holder's record write
 * would wake every other waiter for nothing. */
#define HINT_EVENTS (IN_ACCESS | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE)

int pl_hints_open(pl_handle *out)
{
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0)
        return errno;
    *out = fd;
    return 0;
}

int pl_hints_watch(pl_handle hints, pl_handle h, int *wd)
{
    /* Through the descriptor, never the lock's path: the watch is on the
     * very file the waiter has open, whatever has been renamed meanwhile. */
    char name[40];
    snprintf(name, sizeof name, "/proc/self/fd/%d", (int)h);
    int w = inotify_add_watch((int)hints, name, HINT_EVENTS);
    if (w < 0)
        return errno; /* ENOSPC: the user's watches are used up */
    *wd = w;
    return 0;
}

int pl_hints_unwatch(pl_handle hints, int wd)
{
    return inotify_rm_watch((int)hints, wd) == 0 ? 0 : errno;
}

int pl_hints_read(pl_handle hints, int *wds, size_t cap, size_t *n, int *overflow)
{
    /* Aligned as the kernel's struct inotify_event; each event without a
     * name (a watch on a file, not a directory) takes 16 bytes. */
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    size_t count = 0;
    *overflow = 0;
    while (count < cap) {
        size_t room = (cap - count) * sizeof(struct inotify_event);
        ssize_t got = read((int)hints, buf, room < sizeof buf ? room : sizeof buf);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            *n = count;
            return errno;
        }
        if (got == 0)
            break;
        for (ssize_t at = 0; at + (ssize_t)sizeof(struct inotify_event) <= got;) {
            const struct inotify_event *ev = (const struct inotify_event *)(buf + at);
            if (ev->mask & IN_Q_OVERFLOW)
                *overflow = 1;
            else if (ev->mask & IN_IGNORED)
                wds[count++] = -ev->wd; /* the watch is gone: its file was deleted, or unmounted */
            else
                wds[count++] = ev->wd;
            at += (ssize_t)sizeof(struct inotify_event) + ev->len;
            if (count == cap)
                break;
        }
    }
    *n = count;
    return 0;
}

#else /* no hints: every wait takes a thread blocked in the kernel */

int pl_hints_open(pl_handle *out)
{
    (void)out;
    return ENOSYS;
}

int pl_hints_watch(pl_handle hints, pl_handle h, int *wd)
{
    (void)hints, (void)h, (void)wd;
    return ENOSYS;
}

int pl_hints_unwatch(pl_handle hints, int wd)
{
    (void)hints, (void)wd;
    return ENOSYS;
}

int pl_hints_read(pl_handle hints, int *wds, size_t cap, size_t *n, int *overflow)
{
    (void)hints, (void)wds, (void)cap, (void)overflow;
    *n = 0;
    return ENOSYS;
}

#endif
