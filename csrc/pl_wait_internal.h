/*
 * Interruptible kernel waits, shared by the POSIX lock and process code.
 *
 * A wait is a blocking syscall (flock, poll, kevent) bracketed by
 * pl__wait_begin and pl__wait_end.  Timeouts and cancellation interrupt it
 * with pylock's wake signal (a real-time signal whose handler does nothing
 * and is installed without SA_RESTART), so the syscall returns EINTR and
 * pl__wait_end says why.  Nothing wakes while the wait is pending.
 */
#ifndef PYLOCK_WAIT_INTERNAL_H
#define PYLOCK_WAIT_INTERNAL_H

#include "pylock.h"

/* Arms the timeout (timeout_ns < 0: none) and the cancel target for the
 * calling thread.  Returns 0, ECANCELED if already cancelled, or an errno. */
int pl__wait_begin(pl_waiter *w, int64_t timeout_ns);

/* Disarms.  rc and saved_errno are the blocking syscall's result; returns
 * 0 when it succeeded, else ECANCELED, ETIMEDOUT, EINTR (someone else's
 * signal: the caller should retry with the time left) or saved_errno. */
int pl__wait_end(pl_waiter *w, int rc, int saved_errno);

/* Nonzero once pl_waiter_cancel has been called on w. */
int pl__wait_cancelled(pl_waiter *w);

#endif
