/*
 * pylock's C core on Linux and macOS: lock files with flock(2).  The
 * interruptible waits live in wait_posix.c.
 */
#if !defined(_WIN32)

#include "pl_wait_internal.h"
#include "pl_lock_internal.h"
#include "pylock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#elif defined(__APPLE__)
#include <sys/mount.h>
#include <sys/param.h>
#endif

/* ---- the descriptors a forked child must not keep -------------------
 *
 * Every lock file pylock opens is recorded here, and the registry's mutex
 * is held across open+record and forget+close.  pthread_atfork takes the
 * same mutex before fork(), so a fork from any thread sees each descriptor
 * either open and recorded or closed and forgotten: the child closes
 * exactly pylock's descriptors (it must not keep a parent's lock alive, nor
 * unlock it: the open file description is shared), never a number the
 * parent has meanwhile reused for something of its own.
 */

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t open_atfork_once = PTHREAD_ONCE_INIT;
static int *open_fds;
static size_t open_len, open_cap;

static void open_prepare(void)
{
    pthread_mutex_lock(&open_mu);
}

static void open_parent(void)
{
    pthread_mutex_unlock(&open_mu);
}

static void open_child(void)
{
    /* Only close(): the child of a threaded parent may call nothing that
     * is not async-signal-safe here.  The array is kept for reuse. */
    for (size_t i = 0; i < open_len; i++)
        close(open_fds[i]);
    open_len = 0;
    pthread_mutex_unlock(&open_mu);
}

static void open_atfork(void)
{
    pthread_atfork(open_prepare, open_parent, open_child);
}

/* Called with open_mu held.  ENOMEM leaves nothing recorded. */
static int remember_fd(int fd)
{
    if (open_len == open_cap) {
        size_t cap = open_cap ? open_cap * 2 : 16;
        int *grown = realloc(open_fds, cap * sizeof *grown);
        if (grown == NULL)
            return ENOMEM;
        open_fds = grown;
        open_cap = cap;
    }
    open_fds[open_len++] = fd;
    return 0;
}

/* Called with open_mu held. */
static void forget_fd(int fd)
{
    for (size_t i = 0; i < open_len; i++) {
        if (open_fds[i] == fd) {
            open_fds[i] = open_fds[--open_len];
            return;
        }
    }
}

/* ---- lock files --------------------------------------------------- */

static int classify(const struct stat *st)
{
    if (S_ISREG(st->st_mode))
        return 0;
    if (S_ISDIR(st->st_mode))
        return EISDIR;
    if (S_ISLNK(st->st_mode))
        return PL_E_SYMLINK;
    return PL_E_NOTREG;
}

static int open_unrecorded(int dirfd, const char *path, int flags, int create_mode,
                           pl_handle *out, int *created);

static int open_recorded(int dirfd, const char *path, int flags, int create_mode,
                         pl_handle *out, int *created)
{
    int rc;
    pthread_once(&open_atfork_once, open_atfork);
    pthread_mutex_lock(&open_mu);
    rc = open_unrecorded(dirfd, path, flags, create_mode, out, created);
    if (rc == 0 && (rc = remember_fd((int)*out)) != 0)
        close((int)*out);
    pthread_mutex_unlock(&open_mu);
    return rc;
}

int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created)
{
    return open_recorded(AT_FDCWD, path, flags, create_mode, out, created);
}

/* One path component: what openat(dir, name) finds in dir itself. */
int pl__is_name(const char *name)
{
    return name[0] != 0 && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

int pl_open_at(pl_handle dir, const char *name, int flags, int create_mode, pl_handle *out,
               int *created)
{
    *created = 0;
    if (!pl__is_name(name) || dir < 0)
        return dir < 0 ? EBADF : EINVAL;
    return open_recorded((int)dir, name, flags, create_mode, out, created);
}

/* Not recorded for forks: a directory holds no lock, and a forked child's
 * Lock objects open their files in it again. */
int pl_open_dir(const char *path, pl_handle *out)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    int rc;
    if (fd < 0) {
        rc = errno;
        /* ELOOP for a symlink on Linux, ENOTDIR on some systems: ask lstat. */
        if ((rc == ELOOP || rc == ENOTDIR) && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return PL_E_SYMLINK;
        return rc;
    }
    *out = fd;
    return 0;
}

static int open_unrecorded(int dirfd, const char *path, int flags, int create_mode,
                           pl_handle *out, int *created)
{
    struct stat st;
    int access = (flags & PL_OPEN_READONLY) ? O_RDONLY : O_RDWR;
    /* O_NONBLOCK: a FIFO swapped in after the lstat below must not block
     * the open; flock and pread/pwrite on regular files ignore it. */
    int oflags = access | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
    int fd, rc;

    *created = 0;
    /* Refuse FIFOs, devices and directories before opening them: opening
     * some devices has side effects. The fstat after the open closes the
     * race with a swap. */
    if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if ((rc = classify(&st)) != 0)
            return rc;
    } else if (errno != ENOENT) {
        return errno;
    }
    for (;;) {
        fd = openat(dirfd, path, oflags);
        if (fd >= 0)
            break;
        if (errno == ENOENT && (flags & PL_OPEN_CREATE)) {
            mode_t mode = create_mode < 0 ? 0644 : (mode_t)create_mode;
            fd = openat(dirfd, path, oflags | O_CREAT | O_EXCL, mode);
            if (fd >= 0) {
                *created = 1;
                /* An explicit mode is the caller's decision: the umask
                 * must not narrow it (a lock shared between users). */
                if (create_mode >= 0 && fchmod(fd, mode) != 0) {
                    rc = errno;
                    close(fd);
                    return rc;
                }
                break;
            }
            if (errno == EEXIST)
                continue; /* another process created it first */
        }
        rc = errno;
        if (rc == ELOOP && fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode))
            return PL_E_SYMLINK;
        if (rc == ENXIO || rc == ENODEV)
            return PL_E_NOTREG;
        return rc;
    }
    if (fstat(fd, &st) != 0 || (rc = classify(&st)) != 0) {
        rc = rc ? rc : errno;
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int pl_close(pl_handle h)
{
    int rc;
    pthread_mutex_lock(&open_mu);
    forget_fd((int)h);
    /* Linux and macOS both release the descriptor even when close fails
     * with EINTR; retrying could close someone else's new descriptor. */
    rc = close((int)h) == 0 || errno == EINTR ? 0 : errno;
    pthread_mutex_unlock(&open_mu);
    return rc;
}

#if defined(__linux__) && defined(STATX_INO)
/* statx asking only for what pylock needs.  Not asking for timestamps
 * matters: since Linux 6.13 a stat that reports ctime makes the next write
 * take a fine-grained timestamp and dirty the inode, which doubled the cost
 * of writing the record on every acquisition. */
PYLOCK_HOT static int statx_at(int dirfd, const char *path, int flags,
                                pl_file_info *out)
{
    struct statx sx;
    if (statx(dirfd, path, flags, STATX_INO | STATX_NLINK | STATX_SIZE, &sx) != 0)
        return errno;
    out->dev = (uint64_t)makedev(sx.stx_dev_major, sx.stx_dev_minor);
    out->ino = (uint64_t)sx.stx_ino;
    out->nlink = (uint64_t)sx.stx_nlink;
    out->size = (uint64_t)sx.stx_size;
    return 0;
}
#define HAVE_STATX 1
#endif

static void from_stat(const struct stat *st, pl_file_info *out)
{
    out->dev = (uint64_t)st->st_dev;
    out->ino = (uint64_t)st->st_ino;
    out->nlink = (uint64_t)st->st_nlink;
    out->size = (uint64_t)st->st_size;
}

int pl_file_stat(pl_handle h, pl_file_info *out)
{
    struct stat st;
#ifdef HAVE_STATX
    int rc = statx_at((int)h, "", AT_EMPTY_PATH, out);
    if (rc != ENOSYS && rc != EPERM) /* EPERM: old seccomp policies */
        return rc;
#endif
    if (fstat((int)h, &st) != 0)
        return errno;
    from_stat(&st, out);
    return 0;
}

PYLOCK_HOT int pl__same_file_at(pl_handle dir, const char *path, const pl_file_info *st,
                                uint64_t *size)
{
    pl_file_info now;
    struct stat ps;
    int dirfd = dir < 0 ? AT_FDCWD : (int)dir;
    memset(&now, 0, sizeof now);
#ifdef HAVE_STATX
    int rc = statx_at(dirfd, path, AT_SYMLINK_NOFOLLOW, &now);
    if (rc != ENOSYS && rc != EPERM) {
        *size = now.size;
        return rc == 0 && now.dev == st->dev && now.ino == st->ino;
    }
#endif
    if (fstatat(dirfd, path, &ps, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    from_stat(&ps, &now);
    *size = now.size;
    return now.dev == st->dev && now.ino == st->ino;
}

int pl_fs_stat(pl_handle h, pl_fs_info *out)
{
    memset(out, 0, sizeof *out);
#if defined(__linux__)
    struct statfs sf;
    if (fstatfs((int)h, &sf) != 0)
        return errno;
    out->magic = (uint64_t)(unsigned long)sf.f_type;
    out->remote = -1; /* Python decides from the magic number */
#elif defined(__APPLE__)
    struct statfs sf;
    if (fstatfs((int)h, &sf) != 0)
        return errno;
    out->remote = (sf.f_flags & MNT_LOCAL) ? 0 : 1;
    strncpy(out->name, sf.f_fstypename, sizeof out->name - 1);
#else
    out->remote = -1;
#endif
    return 0;
}

static int flock_op(int shared)
{
    return shared ? LOCK_SH : LOCK_EX;
}

PYLOCK_HOT int pl_try_lock(pl_handle h, int shared)
{
    for (;;) {
        if (flock((int)h, flock_op(shared) | LOCK_NB) == 0)
            return 0;
        if (errno != EINTR)
            return errno == EAGAIN ? EWOULDBLOCK : errno;
    }
}

PYLOCK_HOT int pl_unlock(pl_handle h)
{
    for (;;) {
        if (flock((int)h, LOCK_UN) == 0)
            break;
        if (errno != EINTR)
            return errno;
    }
#if defined(__linux__)
    /* The release's announcement to waiters watching the file (hints.c):
     * an unlock that keeps the descriptor open makes no inotify event of
     * its own.  A one-byte read is the cheapest call that makes one; it
     * reads nothing from an empty file, whose waiters wait in a thread. */
    char byte;
    ssize_t ignored = pread((int)h, &byte, 1, 0);
    (void)ignored;
#endif
    return 0;
}

PYLOCK_HOT int pl_write_record(pl_handle h, const char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite((int)h, buf + done, len - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return ENOSPC;
        done += (size_t)n;
    }
    return 0;
}

int pl_read_record(pl_handle h, char *buf, size_t cap, size_t *len)
{
    size_t done = 0;
    while (done < cap) {
        ssize_t n = pread((int)h, buf + done, cap - done, (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    *len = done;
    return 0;
}

#endif /* !_WIN32 */
