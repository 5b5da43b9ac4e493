/*
 * pylock's C core on Windows: interruptible waits (event handles; no signals),
 * for lock requests and, through pl_win_wait, for process handles.
 */
#include "pl_win_internal.h"

#ifdef _WIN32

/* ---- interruptible waits ---------------------------------------------- */

struct pl_waiter {
    HANDLE cancel; /* manual-reset: once cancelled, stays cancelled */
    HANDLE io;     /* the OVERLAPPED event of the pending lock request */
};

pl_waiter *pl_waiter_new(void)
{
    pl_waiter *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->cancel = CreateEventW(NULL, TRUE, FALSE, NULL);
    w->io = CreateEventW(NULL, TRUE, FALSE, NULL);
    if (w->cancel == NULL || w->io == NULL) {
        pl_waiter_free(w);
        return NULL;
    }
    return w;
}

void pl_waiter_free(pl_waiter *w)
{
    if (w == NULL)
        return;
    if (w->cancel != NULL)
        CloseHandle(w->cancel);
    if (w->io != NULL)
        CloseHandle(w->io);
    free(w);
}

int pl_wake_signal(void)
{
    return -1; /* waits end on events, not signals */
}

int pl_wake_signal_lost(void)
{
    return 0;
}

int pl_waiter_cancel(pl_waiter *w)
{
    SetEvent(w->cancel);
    return 0;
}

HANDLE pl_win_cancel_event(pl_waiter *w)
{
    return w == NULL ? NULL : w->cancel;
}

static int is_set(HANDLE ev)
{
    return ev != NULL && WaitForSingleObject(ev, 0) == WAIT_OBJECT_0;
}

static int64_t now_ns(void)
{
    LARGE_INTEGER c, f;
    QueryPerformanceCounter(&c);
    QueryPerformanceFrequency(&f);
    return (c.QuadPart / f.QuadPart) * 1000000000LL +
           (c.QuadPart % f.QuadPart) * 1000000000LL / f.QuadPart;
}

/* Wait until obj is signalled (0), cancel is set (ECANCELED) or
 * timeout_ns (< 0: none) has passed by the performance counter
 * (ETIMEDOUT).  Windows may end a timed wait up to a clock tick early, so
 * the deadline is checked against the counter, and a timeout of 0 still
 * looks at obj once.  When both are signalled obj wins. */
int pl_win_wait(HANDLE obj, HANDLE cancel, int64_t timeout_ns)
{
    HANDLE hs[2] = {obj, cancel};
    DWORD count = cancel != NULL ? 2 : 1;
    int64_t deadline = timeout_ns >= 0 ? now_ns() + timeout_ns : 0;

    for (;;) {
        DWORD ms = INFINITE, r;
        if (timeout_ns >= 0) {
            int64_t left = deadline - now_ns();
            if (left <= 0)
                ms = 0;
            else if (left / 1000000 >= (int64_t)INFINITE - 1)
                ms = INFINITE - 1;
            else
                ms = (DWORD)((left + 999999) / 1000000);
        }
        r = WaitForMultipleObjects(count, hs, FALSE, ms);
        if (r == WAIT_OBJECT_0)
            return 0;
        if (r == WAIT_OBJECT_0 + 1)
            return ECANCELED;
        if (r == WAIT_TIMEOUT) {
            if (ms == 0)
                return PL_ETIMEDOUT;
            continue;
        }
        return pl_win_errno(GetLastError());
    }
}

int pl_lock_wait(pl_handle h, int shared, int64_t timeout_ns, pl_waiter *w)
{
    HANDLE fh = as_handle(h);
    HANDLE cancel = pl_win_cancel_event(w);
    HANDLE ev = w != NULL ? w->io : CreateEventW(NULL, TRUE, FALSE, NULL);
    OVERLAPPED ov;
    DWORD n, err;
    int rc;

    if (ev == NULL)
        return pl_win_errno(GetLastError());
    if (is_set(cancel)) {
        rc = ECANCELED;
        goto out;
    }
    if (timeout_ns == 0) {
        rc = pl_try_lock(h, shared);
        if (rc == PL_EWOULDBLOCK)
            rc = PL_ETIMEDOUT;
        goto out;
    }
    ResetEvent(ev);
    at_offset(&ov, PL_WIN_LOCK_OFFSET, ev);
    ov.Internal = PL_IO_UNTOUCHED;
    if (LockFileEx(fh, lock_flags(shared), 0, 1, 0, &ov)) {
        rc = 0;
    } else if ((err = GetLastError()) != ERROR_IO_PENDING) {
        rc = pl_win_errno(err);
        goto out;
    } else if (*(volatile ULONG_PTR *)&ov.Internal == PL_IO_UNTOUCHED) {
        /* Windows marks a queued request STATUS_PENDING in the OVERLAPPED
         * before returning ERROR_IO_PENDING.  Untouched means nothing was
         * queued (Wine 8 answers overlapped lock waits this way and never
         * grants them): waiting for the event would never end. */
        CancelIoEx(fh, &ov);
        rc = ENOTSUP;
        goto out;
    } else {
        rc = pl_win_wait(ev, cancel, timeout_ns);
        if (rc != 0) {
            /* Withdraw the request.  The grant may have raced with the
             * cancel: then the request completed successfully and the
             * lock is ours, so give it back. */
            CancelIoEx(fh, &ov);
            if (GetOverlappedResult(fh, &ov, &n, TRUE))
                pl_unlock((pl_handle)(intptr_t)fh);
            goto out;
        }
        if (!GetOverlappedResult(fh, &ov, &n, FALSE)) {
            rc = pl_win_errno(GetLastError());
            goto out;
        }
    }
    /* As on POSIX, a cancel that lands together with the grant wins: the
     * caller has given up and must not end up holding the lock. */
    if (is_set(cancel)) {
        pl_unlock((pl_handle)(intptr_t)fh);
        rc = ECANCELED;
    }
out:
    if (w == NULL)
        CloseHandle(ev);
    return rc;
}

#endif /* _WIN32 */
