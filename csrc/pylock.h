/*
 * pylock's C core: the whole API, the same on every platform.
 *
 * The core does syscalls and hides platform differences; every decision
 * (retries, errors, records, asyncio) is made in Python.  Each function
 * returns 0 on success or a positive errno value (Windows errors are mapped
 * to errno values by the core), or one of the PL_E_* codes below.
 *
 * The block between the CDEF markers is fed verbatim to cffi's cdef, so it
 * holds plain declarations only: no #ifdef, no macros with expressions.
 */
#ifndef PYLOCK_H
#define PYLOCK_H

#include <stddef.h>
#include <stdint.h>

#define PL_E_SYMLINK 10001 /* the lock path is a symbolic link (or reparse point) */
#define PL_E_NOTREG 10002  /* the lock path is a FIFO, socket or device */
#define PL_OPEN_CREATE 1    /* create the file when it is missing */
#define PL_OPEN_READONLY 2  /* open for reading only (lock still possible) */

/* CDEF-BEGIN */
/* A lock file: a descriptor on POSIX, a HANDLE on Windows. */
typedef int64_t pl_handle;

typedef struct {
    uint64_t dev;
    uint64_t ino;
    uint64_t nlink;
    uint64_t size;
} pl_file_info;

typedef struct {
    uint64_t magic;   /* statfs f_type on Linux; 0 where the platform has none */
    int remote;       /* 1 network, 0 local, -1 unknown (decide from magic) */
    char name[32];    /* file system type name where the platform has one */
} pl_fs_info;

/* An interruptible wait: one per pl_lock_wait / pl_proc_wait call. */
typedef struct pl_waiter pl_waiter;

/* Open a lock file (path in UTF-8 on Windows) for reading and writing, or
 * reading only with PL_OPEN_READONLY; close-on-exec, never following a
 * symlink.  With PL_OPEN_CREATE a missing file is created with exactly
 * create_mode, or 0644 less the umask when create_mode < 0; *created is set
 * to 1 when this call made the file.  Returns EISDIR, PL_E_SYMLINK,
 * PL_E_NOTREG or the usual errno values. */
int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created);
int pl_close(pl_handle h);
int pl_file_stat(pl_handle h, pl_file_info *out);
int pl_fs_stat(pl_handle h, pl_fs_info *out);

/* Take the lock without waiting: 0, or EWOULDBLOCK when someone holds it. */
int pl_try_lock(pl_handle h, int shared);
int pl_unlock(pl_handle h);

pl_waiter *pl_waiter_new(void);
void pl_waiter_free(pl_waiter *w);
/* Wait in the kernel for the lock.  Returns 0 (granted), ETIMEDOUT
 * (timeout_ns >= 0 passed), ECANCELED (pl_waiter_cancel) or EINTR (a signal
 * that is not pylock's own: run the handlers, call again with the time
 * left).  Only 0 leaves the lock held. */
int pl_lock_wait(pl_handle h, int shared, int64_t timeout_ns, pl_waiter *w);
/* From any thread, any time: the wait on w returns ECANCELED as soon as it
 * can, without taking the lock.  A wait that already returned 0 holds it. */
void pl_waiter_cancel(pl_waiter *w);

/* The holder record lives at offset 0 of the lock file, outside the locked
 * range, so it stays readable while the lock is held (Windows locks are
 * mandatory).  Writing replaces the first len bytes; reading returns at
 * most cap bytes. */
int pl_write_record(pl_handle h, const char *buf, size_t len);
int pl_read_record(pl_handle h, char *buf, size_t cap, size_t *len);
/* CDEF-END */

#endif
