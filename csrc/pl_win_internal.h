/*
 * Between pylock's Windows sources (win_errors.c, win_paths.c, win_lock.c,
 * win_wait.c, win_proc.c); not part of the API in pylock.h.
 *
 * The lock is ONE byte at PL_WIN_LOCK_OFFSET.  Windows byte-range locks are
 * mandatory, so locking the record at offset 0 would hide the holder's name
 * from everyone who wants to know why they are waiting; the lock byte lies
 * far beyond any record and beyond the end of the file (which LockFileEx
 * allows).  The offset is part of pylock's on-disk protocol: every pylock
 * version on every Windows machine must lock the same byte.  It stays below
 * 2^63 so that file systems and servers that keep lock ranges in a signed
 * 64-bit offset (Samba, Wine's server) can represent it.
 *
 * Error codes are the numbers Python's errno module uses on Windows, which
 * are not always the C runtime's: errno.EWOULDBLOCK, ETIMEDOUT, ELOOP and
 * EDQUOT are the Winsock values there (10035, 10060, 10062, 10069), while
 * ECANCELED, ENODATA, ENOTSUP, EAGAIN are the C runtime's.
 */
#ifndef PYLOCK_WIN_INTERNAL_H
#define PYLOCK_WIN_INTERNAL_H

#include "pylock.h"

#ifdef _WIN32

#if !defined(_WIN32_WINNT) || _WIN32_WINNT < 0x0602
#undef _WIN32_WINNT
#define _WIN32_WINNT 0x0602 /* Windows 8: FILE_ID_INFO; Python 3.9 needs 8.1 */
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PL_WIN_LOCK_OFFSET 0x7FFFFFFFFFFFFFF0ULL

/* Put in OVERLAPPED.Internal before a lock request; see pl_lock_wait. */
#define PL_IO_UNTOUCHED ((ULONG_PTR)0x0BADF00DU)

#define PL_EWOULDBLOCK WSAEWOULDBLOCK
#define PL_ETIMEDOUT WSAETIMEDOUT
#define PL_ELOOP WSAELOOP
#define PL_EDQUOT WSAEDQUOT

/* Not in every SDK's winerror.h (mingw-w64 lacks them). */
#ifndef ERROR_DISK_QUOTA_EXCEEDED
#define ERROR_DISK_QUOTA_EXCEEDED 1295L
#endif
#ifndef ERROR_STOPPED_ON_SYMLINK
#define ERROR_STOPPED_ON_SYMLINK 681L
#endif

/* win_errors.c: a Windows error as the errno value Python's errno module
 * uses on Windows. */
int pl_win_errno(DWORD err);

/* win_paths.c: path (UTF-8 with lone surrogates) as a \\?\ wide path, or
 * an errno value; the caller frees *out. */
int pl_win_wide_path(const char *path, wchar_t **out);
/* The same text as wide characters only (a name, no prefix); *len of them. */
int pl_win_wide(const char *path, wchar_t **out, size_t *len);

/* win_wait.c: the cancel event of a waiter (NULL for none), and a wait for
 * obj that ends with it (0), the cancel (ECANCELED) or the timeout. */
HANDLE pl_win_cancel_event(pl_waiter *w);
int pl_win_wait(HANDLE obj, HANDLE cancel, int64_t timeout_ns);

static inline HANDLE as_handle(pl_handle h)
{
    return (HANDLE)(intptr_t)h;
}

static inline int run_io(HANDLE h, OVERLAPPED *ov, BOOL ok, DWORD *n)
{
    if (!ok && GetLastError() != ERROR_IO_PENDING)
        return (int)GetLastError();
    if (!GetOverlappedResult(h, ov, n, TRUE))
        return (int)GetLastError();
    return 0;
}

static inline void at_offset(OVERLAPPED *ov, uint64_t off, HANDLE event)
{
    memset(ov, 0, sizeof *ov);
    ov->Offset = (DWORD)(off & 0xFFFFFFFFu);
    ov->OffsetHigh = (DWORD)(off >> 32);
    ov->hEvent = event;
}

static inline DWORD lock_flags(int shared)
{
    return shared ? 0 : LOCKFILE_EXCLUSIVE_LOCK;
}

#endif /* _WIN32 */
#endif
