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

/* The functions of the uncontended path and of a hand-over: grouped by the
 * compiler (.text.hot), so that a waiter woken after a long sleep, whose
 * caches are cold, walks fewer code pages between the grant and its return. */
#if defined(__GNUC__)
#define PYLOCK_HOT __attribute__((hot))
#else
#define PYLOCK_HOT
#endif

#define PL_E_SYMLINK 10001 /* the lock path is a symbolic link (or reparse point) */
#define PL_E_NOTREG 10002  /* the lock path is a FIFO, socket or device */
#define PL_E_UNLINKED 10003 /* the locked file left its path: released, reopen */
#define PL_E_BUSY 10004     /* the Lock object is another attempt's (pl_own) */
#define PL_OPEN_CREATE 1    /* create the file when it is missing */
#define PL_OPEN_READONLY 2  /* open for reading only (lock still possible) */
#define PL_UNIX_BIND 1      /* pl_unix_at: bind the socket to the name */
#define PL_UNIX_CONNECT 2   /* pl_unix_at: connect the socket to the name */

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
 * PL_E_NOTREG or the usual errno values; on Windows also EAGAIN for a file
 * that was deleted but is still open somewhere ("delete pending"). */
int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created);
/* A directory to open lock files in by name (pl_open_at), so that whoever
 * may rename the directory or its parents cannot move later opens
 * elsewhere: close-on-exec, never following a symbolic link (a junction or
 * other name surrogate on Windows) as the directory itself.  Returns
 * PL_E_SYMLINK, ENOTDIR or the usual errno values; close it with pl_close. */
int pl_open_dir(const char *path, pl_handle *out);
/* pl_open of the file name (one component: no separator, not "." or "..",
 * else EINVAL) in dir from pl_open_dir, found there and nowhere else. */
int pl_open_at(pl_handle dir, const char *name, int flags, int create_mode, pl_handle *out,
               int *created);
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
 * left).  Only 0 leaves the lock held.  ENOTSUP where the platform cannot
 * wait for a lock in the kernel at all (Wine's LockFileEx). */
int pl_lock_wait(pl_handle h, int shared, int64_t timeout_ns, pl_waiter *w);
/* From any thread, any time, without blocking: the wait on w returns
 * ECANCELED as soon as it can, without taking the lock (a wait that already
 * returned 0 holds it).  Returns 0, or ENOTSUP when the wait cannot be
 * interrupted because the program has taken pylock's wake signal: it then
 * ends only with the grant (given back, ECANCELED) or another error. */
int pl_waiter_cancel(pl_waiter *w);
/* The signal pylock's timed and cancellable waits use, checked (and
 * claimed again if the program took it) now: its number, 0 when the
 * program has taken every candidate, -1 where waits need none (Windows). */
int pl_wake_signal(void);
/* The last wake signal the program took from pylock (a handler of its own
 * or SIG_IGN installed over pylock's), 0 if none. */
int pl_wake_signal_lost(void);

/* The holder record lives at offset 0 of the lock file, outside the locked
 * range, so it stays readable while the lock is held (Windows locks are
 * mandatory).  Writing replaces the first len bytes; reading returns at
 * most cap bytes. */
int pl_write_record(pl_handle h, const char *buf, size_t len);
int pl_read_record(pl_handle h, char *buf, size_t cap, size_t *len);

/* The completed holds of one lock path while pylock.metrics is on, shared
 * by the path's pl_lockfile structs (added to atomically). */
typedef struct {
    uint64_t held_ns;   /* their total length */
    uint64_t slots[65]; /* how many lasted d ns, by d's bit length: the b
                           with 2**(b-1) <= d < 2**b */
} pl_hold_stats;

/* One lock file as a Lock object uses it: filled once from Python, then
 * passed as a single pointer on every acquisition. */
typedef struct {
    pl_handle handle;
    int shared;
    const char *path;     /* the lock's path: after locking, it must still name
                             the locked file (not checked on Windows, where an
                             open lock file cannot be renamed away silently) */
    const char *name;     /* NULL, or the file's name in the directory dir
                             (pl_open_at): then that name is checked, not path */
    pl_handle dir;        /* with name: the directory from pl_open_dir */
    const char *head;     /* the record's fixed part, ending '"acquired_at":' */
    size_t head_len;      /* 0: write no record (shared or record-less locks) */
    uint32_t head_crc;    /* crc32(head), as zlib computes it */
    pl_file_info st;      /* the file's identity, from pl_file_stat after
                             opening it (refreshed by pl_claim on Windows) */
    int record_error;     /* set by pl_claim: errno of a failed record write */
    int no_record_reason; /* why no record can be written (a read-only
                             descriptor): reported like a failed write, but only
                             for a file a record would have gone into */
    int foreign;          /* set by pl_claim: 1 when the file holds bytes that
                             are not a pylock record, so nothing was written */
    uint64_t record_size; /* the file's size after this lock file's last
                             record write (0: none yet); kept by pl_claim, reset
                             by whoever opens a new descriptor */
    uintptr_t owner;      /* the attempt that owns this lock file (pl_own);
                             touched only through pl_own and pl_disown */
    pl_hold_stats *holds; /* NULL: holds are not timed (metrics off) */
    int64_t held_since;   /* with holds: the monotonic clock in ns when
                             pl_claim took the lock; 0 outside a timed hold */
} pl_lockfile;

/* One attempt at a time owns a lock file, from before it opens or locks it
 * until it has given it back: its token is a nonzero even number (the
 * address of an object the attempt keeps alive, so that no other attempt can
 * have it meanwhile).  Owning and giving back are single calls so that the
 * caller can always tell, whatever interrupts it, whether it owns the file.
 * pl_own: 0 when the file is (or already was) token's; PL_E_BUSY when another
 * attempt owns it, and with waiting set that attempt is told someone waits,
 * so that its pl_disown returns 1; EINVAL for a bad token.  An owner that got
 * the file after waiting is told the same, as others may still wait. */
int pl_own(pl_lockfile *lf, uintptr_t token, int waiting);
/* If token owns the file: unlock it first when unlock is set (pl_release:
 * harmless when nothing is held), then free it.  Returns 1 when waiters are to be woken,
 * 0 when none wait, -1 when token does not own it (nothing is done). */
int pl_disown(pl_lockfile *lf, uintptr_t token, int unlock);

/* Once the lock is held: check that path still names the file in st
 * (else unlock and return PL_E_UNLINKED, so the caller reopens the path and
 * never holds an unlinked or renamed-away inode while others lock the file
 * now at the path), and, only if the file is empty or already holds a
 * pylock record (decided under the lock: the size from that same check, and
 * the first bytes read only when the size is not the one this lock file's
 * last record left), write
 * the holder record "pylock-record v1 <len> <crc32>\n" + head + the
 * current UTC time in seconds + "}".  A failed record write leaves the
 * lock held: then the result is the negated errno (also in record_error),
 * so the common case costs Python no second look. */
int pl_claim(pl_lockfile *lf);
/* pl_own (without waiting), pl_try_lock, then pl_claim: the whole
 * uncontended acquisition, one call (0, -errno of a failed record write with
 * the lock held, or an error).  PL_E_BUSY: another attempt owns the file;
 * EBADF: token owns it now, but it is not open (lf->handle < 0).  Every
 * other result leaves the file token's, to give back with pl_disown. */
int pl_acquire(pl_lockfile *lf, uintptr_t token);
/* pl_lock_wait on lf's descriptor, then, once granted, pl_claim in the same
 * call (a blocked acquirer's work after its wake-up is what its hand-over
 * costs): returns the wait's code; only when that is 0, *claim_rc gets
 * pl_claim's. */
int pl_lock_wait_claim(pl_lockfile *lf, int64_t timeout_ns, pl_waiter *w, int *claim_rc);
/* pl_unlock, after filing the hold in lf->holds if pl_claim timed it. */
int pl_release(pl_lockfile *lf);
/* Lock-release hints (Linux inotify; ENOSYS elsewhere): a descriptor that
 * becomes readable when a watched lock file may have been released (a
 * holder closed it or died, or a pylock holder unlocked it: pl_unlock
 * announces every unlock with a one-byte read of the file).  Only a hint:
 * the waiter tries the lock.  Close it with pl_close. */
int pl_hints_open(pl_handle *out);
/* Watch the file h is open on (not its path); *wd gets the watch's number,
 * the same for every descriptor of one file.  ENOSPC: the user's watches
 * are used up (fs.inotify.max_user_watches). */
int pl_hints_watch(pl_handle hints, pl_handle h, int *wd);
int pl_hints_unwatch(pl_handle hints, int wd);
/* The hints pending now, without blocking: up to cap watch numbers into
 * wds (negated for a watch the kernel removed: its file was deleted or
 * unmounted), *n of them; *overflow = 1 when the kernel dropped hints
 * (every watched file may have been released). */
int pl_hints_read(pl_handle hints, int *wds, size_t cap, size_t *n, int *overflow);
/* A unix socket's bind or connect (op PL_UNIX_BIND or PL_UNIX_CONNECT) to
 * the name (one component, as for pl_open_at) in dir from pl_open_dir,
 * looked up there and nowhere else: in a thread of pylock's whose working
 * directory is dir.  A bind creates the socket file with exactly mode
 * (0 to 0777; -1: as the umask says), from its first instant, so nothing
 * is ever changed by name afterwards.  The result is bind's or connect's
 * errno (EAGAIN: a listener whose backlog is full); ENOSYS where threads
 * cannot have a working directory of their own (not Linux, or unshare
 * refused by a seccomp policy) or there are no unix sockets (Windows). */
int pl_unix_at(pl_handle dir, const char *name, int64_t sock, int op, int mode);
/* CDEF-END */

#endif
