/*
 * pylock's C core on Windows: lock files with CreateFileW + LockFileEx, and
 * the interruptible waits shared with win_proc.c.
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

/* Shared with win_proc.c. */
int pl_win_errno(DWORD err);
HANDLE pl_win_cancel_event(pl_waiter *w);
int pl_win_wait(HANDLE obj, HANDLE cancel, int64_t timeout_ns);

int pl_win_errno(DWORD err)
{
    switch (err) {
    case ERROR_SUCCESS:
        return 0;
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
    case ERROR_BAD_NETPATH:
    case ERROR_BAD_NET_NAME:
    case ERROR_BAD_PATHNAME:
    case ERROR_NO_MORE_FILES:
        return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_NETWORK_ACCESS_DENIED:
    case ERROR_CANT_ACCESS_FILE:
    case ERROR_CANNOT_MAKE:
        return EACCES;
    case ERROR_PRIVILEGE_NOT_HELD:
        return EPERM;
    case ERROR_WRITE_PROTECT:
        return EROFS;
    case ERROR_FILENAME_EXCED_RANGE:
    case ERROR_BUFFER_OVERFLOW:
        return ENAMETOOLONG;
    case ERROR_INVALID_NAME:
    case ERROR_INVALID_PARAMETER:
    case ERROR_NEGATIVE_SEEK:
    case ERROR_INVALID_FLAGS:
        return EINVAL;
    case ERROR_DIRECTORY:
        return ENOTDIR;
    case ERROR_LOCK_VIOLATION:
        return PL_EWOULDBLOCK;
    case ERROR_SHARING_VIOLATION:
    case ERROR_BUSY:
        return EBUSY;
    case ERROR_DELETE_PENDING:
        return EAGAIN;
    case ERROR_TOO_MANY_OPEN_FILES:
        return EMFILE;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_NO_SYSTEM_RESOURCES:
    case ERROR_COMMITMENT_LIMIT:
        return ENOMEM;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
        return ENOSPC;
    case ERROR_DISK_QUOTA_EXCEEDED:
        return PL_EDQUOT;
    case ERROR_INVALID_HANDLE:
        return EBADF;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS:
        return EEXIST;
    case ERROR_DIR_NOT_EMPTY:
        return ENOTEMPTY;
    case ERROR_NOT_SAME_DEVICE:
        return EXDEV;
    case ERROR_CANT_RESOLVE_FILENAME:
    case ERROR_STOPPED_ON_SYMLINK:
        return PL_ELOOP;
    case ERROR_NOT_LOCKED:
    case ERROR_LOCK_FAILED:
        return ENOLCK;
    case ERROR_CALL_NOT_IMPLEMENTED:
        return ENOSYS;
    case ERROR_NOT_SUPPORTED:
    case ERROR_INVALID_FUNCTION:
        return ENOTSUP;
    case ERROR_OPERATION_ABORTED:
        return ECANCELED;
    case ERROR_TIMEOUT:
    case ERROR_SEM_TIMEOUT:
    case WAIT_TIMEOUT:
        return PL_ETIMEDOUT;
    case ERROR_BROKEN_PIPE:
    case ERROR_NO_DATA:
        return EPIPE;
    case ERROR_NOACCESS:
        return EFAULT;
    case ERROR_NO_UNICODE_TRANSLATION:
        return EILSEQ;
    default:
        return EIO;
    }
}

static HANDLE as_handle(pl_handle h)
{
    return (HANDLE)(intptr_t)h;
}

/* ---- paths ------------------------------------------------------------ */

/* Python hands over os.fsencode(path): UTF-8, with lone surrogates (legal
 * in Windows file names) encoded as three bytes ("surrogatepass").
 * MultiByteToWideChar refuses those, so they are decoded here. */
static int wtf8_decode(const char *s, wchar_t *out, size_t *n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    while (*p) {
        uint32_t c;
        int more;
        if (p[0] < 0x80) {
            c = p[0];
            more = 0;
        } else if ((p[0] & 0xE0) == 0xC0) {
            c = p[0] & 0x1F;
            more = 1;
        } else if ((p[0] & 0xF0) == 0xE0) {
            c = p[0] & 0x0F;
            more = 2;
        } else if ((p[0] & 0xF8) == 0xF0) {
            c = p[0] & 0x07;
            more = 3;
        } else {
            return EILSEQ;
        }
        for (int i = 1; i <= more; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return EILSEQ;
            c = (c << 6) | (p[i] & 0x3F);
        }
        if ((more == 1 && c < 0x80) || (more == 2 && c < 0x800) ||
            (more == 3 && (c < 0x10000 || c > 0x10FFFF)))
            return EILSEQ; /* overlong or out of range */
        if (c >= 0x10000) {
            if (out) {
                out[k] = (wchar_t)(0xD800 + ((c - 0x10000) >> 10));
                out[k + 1] = (wchar_t)(0xDC00 + ((c - 0x10000) & 0x3FF));
            }
            k += 2;
        } else {
            if (out)
                out[k] = (wchar_t)c;
            k += 1;
        }
        p += more + 1;
    }
    if (out)
        out[k] = 0;
    *n = k;
    return 0;
}

static int has_prefix(const wchar_t *s, const wchar_t *prefix)
{
    return wcsncmp(s, prefix, wcslen(prefix)) == 0;
}

/* prefix + rest into out, which has room for both. */
static void join_path(wchar_t *out, const wchar_t *prefix, const wchar_t *rest)
{
    size_t p = wcslen(prefix), r = wcslen(rest);
    memcpy(out, prefix, p * sizeof(wchar_t));
    memcpy(out + p, rest, (r + 1) * sizeof(wchar_t));
}

/* The path as CreateFileW wants it, in a malloc'd buffer.  Paths too long
 * for the classic MAX_PATH limit become absolute "\\?\" paths, so they work
 * whether or not long paths are enabled for the process. */
static int wide_path(const char *path, wchar_t **out)
{
    wchar_t *w, *full, *res;
    size_t n;
    DWORD len;
    int wn, rc;

    wn = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    if (wn > 0) {
        w = malloc((size_t)wn * sizeof(wchar_t));
        if (w == NULL)
            return ENOMEM;
        if (MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, w, wn) != wn) {
            rc = pl_win_errno(GetLastError());
            free(w);
            return rc;
        }
        n = (size_t)wn - 1;
    } else {
        if ((rc = wtf8_decode(path, NULL, &n)) != 0)
            return rc;
        w = malloc((n + 1) * sizeof(wchar_t));
        if (w == NULL)
            return ENOMEM;
        wtf8_decode(path, w, &n);
    }
    if (n == 0) {
        free(w);
        return ENOENT;
    }
    if (n < MAX_PATH - 12 || has_prefix(w, L"\\\\?\\") || has_prefix(w, L"\\\\.\\")) {
        *out = w;
        return 0;
    }
    len = GetFullPathNameW(w, 0, NULL, NULL);
    if (len == 0) {
        rc = pl_win_errno(GetLastError());
        free(w);
        return rc;
    }
    full = malloc((size_t)len * sizeof(wchar_t));
    res = malloc(((size_t)len + 8) * sizeof(wchar_t));
    if (full == NULL || res == NULL) {
        free(w);
        free(full);
        free(res);
        return ENOMEM;
    }
    if (GetFullPathNameW(w, len, full, NULL) == 0) {
        rc = pl_win_errno(GetLastError());
        free(w);
        free(full);
        free(res);
        return rc;
    }
    free(w);
    if (has_prefix(full, L"\\\\?\\") || has_prefix(full, L"\\\\.\\"))
        join_path(res, L"", full);
    else if (has_prefix(full, L"\\\\"))
        join_path(res, L"\\\\?\\UNC\\", full + 2);
    else
        join_path(res, L"\\\\?\\", full);
    free(full);
    *out = res;
    return 0;
}

/* ---- lock files ------------------------------------------------------- */

/* CreateFileW reports "access denied" for a directory, a file being
 * deleted, and a real permission problem alike; tell them apart. */
static int open_error(const wchar_t *wpath, DWORD err)
{
    if (err == ERROR_ACCESS_DENIED) {
        typedef LONG(WINAPI * last_status_fn)(void);
        HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
        last_status_fn last_status =
            ntdll ? (last_status_fn)(void (*)(void))GetProcAddress(ntdll, "RtlGetLastNtStatus")
                  : NULL;
        DWORD attrs;
        /* STATUS_DELETE_PENDING: the name disappears when its last handle
         * closes; opening it again then makes a new file. */
        if (last_status != NULL && (ULONG)last_status() == 0xC0000056UL)
            return EAGAIN;
        attrs = GetFileAttributesW(wpath);
        if (attrs != INVALID_FILE_ATTRIBUTES) {
            if (attrs & FILE_ATTRIBUTE_REPARSE_POINT)
                return PL_E_SYMLINK;
            if (attrs & FILE_ATTRIBUTE_DIRECTORY)
                return EISDIR;
        }
    }
    return pl_win_errno(err);
}

/* What the opened object is: 0 for a plain file, 1 for a reparse point that
 * is not a link (a cloud-files placeholder, a deduplicated file), which
 * must be opened again through its filter to be read, or an error. */
static int classify(HANDLE h, BY_HANDLE_FILE_INFORMATION *info)
{
    FILE_ATTRIBUTE_TAG_INFO tag;

    if (GetFileType(h) != FILE_TYPE_DISK)
        return PL_E_NOTREG; /* NUL, CON, pipes, devices */
    if (!GetFileInformationByHandle(h, info))
        return pl_win_errno(GetLastError());
    if (info->dwFileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) {
        if (!GetFileInformationByHandleEx(h, FileAttributeTagInfo, &tag, sizeof tag))
            return pl_win_errno(GetLastError());
        /* Name surrogates: symbolic links, junctions and their kin. */
        if (IsReparseTagNameSurrogate(tag.ReparseTag))
            return PL_E_SYMLINK;
        return (info->dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) ? EISDIR : 1;
    }
    if (info->dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)
        return EISDIR;
    return 0;
}

static int same_file(const BY_HANDLE_FILE_INFORMATION *a, const BY_HANDLE_FILE_INFORMATION *b)
{
    return a->dwVolumeSerialNumber == b->dwVolumeSerialNumber &&
           a->nFileIndexHigh == b->nFileIndexHigh && a->nFileIndexLow == b->nFileIndexLow;
}

/* create_mode: Windows has no permission bits, and the new file inherits
 * its directory's ACL.  The one bit that maps is the owner's write
 * permission: without it the file is created FILE_ATTRIBUTE_READONLY, so
 * later openers for writing get EACCES, as on POSIX. */
int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created)
{
    DWORD access = (flags & PL_OPEN_READONLY) ? GENERIC_READ : GENERIC_READ | GENERIC_WRITE;
    DWORD share = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
    DWORD attrs = FILE_ATTRIBUTE_NORMAL;
    DWORD disp = (flags & PL_OPEN_CREATE) ? OPEN_ALWAYS : OPEN_EXISTING;
    /* OVERLAPPED: a lock wait is then an I/O request that can be timed and
     * cancelled.  No SECURITY_ATTRIBUTES: the handle is not inheritable,
     * so a child process never keeps the lock alive. */
    DWORD fflags = FILE_FLAG_OVERLAPPED;
    BY_HANDLE_FILE_INFORMATION info, again;
    wchar_t *wpath = NULL;
    HANDLE h, h2;
    int rc, made;

    *created = 0;
    if ((rc = wide_path(path, &wpath)) != 0)
        return rc;
    if (create_mode >= 0 && !(create_mode & 0200))
        attrs = FILE_ATTRIBUTE_READONLY;
    for (int attempt = 0;; attempt++) {
        h = CreateFileW(wpath, access, share, NULL, disp,
                        attrs | fflags | FILE_FLAG_OPEN_REPARSE_POINT, NULL);
        if (h == INVALID_HANDLE_VALUE) {
            rc = open_error(wpath, GetLastError());
            break;
        }
        made = (flags & PL_OPEN_CREATE) && GetLastError() != ERROR_ALREADY_EXISTS;
        rc = classify(h, &info);
        if (rc != 1) {
            if (rc == 0) {
                *out = (pl_handle)(intptr_t)h;
                *created = made;
            } else {
                CloseHandle(h);
            }
            break;
        }
        /* A placeholder-style reparse point: open it normally, and make
         * sure the path still names the same file (not a link swapped in
         * between the two opens). */
        h2 = CreateFileW(wpath, access, share, NULL, OPEN_EXISTING, fflags, NULL);
        CloseHandle(h);
        if (h2 == INVALID_HANDLE_VALUE) {
            rc = open_error(wpath, GetLastError());
            break;
        }
        if (GetFileType(h2) == FILE_TYPE_DISK && GetFileInformationByHandle(h2, &again) &&
            same_file(&info, &again) && !(again.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)) {
            *out = (pl_handle)(intptr_t)h2;
            *created = made;
            rc = 0;
            break;
        }
        CloseHandle(h2);
        if (attempt == 8) {
            rc = EAGAIN; /* the path keeps changing under us */
            break;
        }
    }
    free(wpath);
    return rc;
}

static int run_io(HANDLE h, OVERLAPPED *ov, BOOL ok, DWORD *n)
{
    if (!ok && GetLastError() != ERROR_IO_PENDING)
        return (int)GetLastError();
    if (!GetOverlappedResult(h, ov, n, TRUE))
        return (int)GetLastError();
    return 0;
}

static void at_offset(OVERLAPPED *ov, uint64_t off, HANDLE event)
{
    memset(ov, 0, sizeof *ov);
    ov->Offset = (DWORD)(off & 0xFFFFFFFFu);
    ov->OffsetHigh = (DWORD)(off >> 32);
    ov->hEvent = event;
}

/* Unlock the lock byte; a handle that holds nothing is not an error, as
 * with flock(LOCK_UN). */
static int unlock_byte(HANDLE h)
{
    OVERLAPPED ov;
    DWORD n, err;
    HANDLE ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    if (ev == NULL)
        return pl_win_errno(GetLastError());
    at_offset(&ov, PL_WIN_LOCK_OFFSET, ev);
    err = (DWORD)run_io(h, &ov, UnlockFileEx(h, 0, 1, 0, &ov), &n);
    CloseHandle(ev);
    /* Windows says ERROR_NOT_LOCKED, Wine ERROR_LOCK_VIOLATION. */
    if (err == ERROR_NOT_LOCKED || err == ERROR_LOCK_VIOLATION)
        return 0;
    return pl_win_errno(err);
}

int pl_close(pl_handle h)
{
    /* Closing releases the handle's locks only "when the system has the
     * resources"; unlocking first makes the release immediate. */
    unlock_byte(as_handle(h));
    return CloseHandle(as_handle(h)) ? 0 : pl_win_errno(GetLastError());
}

/* dev and ino are what os.stat reports on Python 3.12 and later: the
 * volume serial and file id of FILE_ID_INFO (64-bit serial; the 128-bit
 * ReFS id, whose high half is zero on NTFS, folded into 64 bits when it is
 * not).  Python 3.9 to 3.11 report the 32-bit serial instead, so compare
 * files through this function on both sides, not against os.stat. */
int pl_file_stat(pl_handle h, pl_file_info *out)
{
    BY_HANDLE_FILE_INFORMATION info;
    FILE_STANDARD_INFO std;
    FILE_ID_INFO id;
    uint64_t hi = 0, lo = 0;

    if (!GetFileInformationByHandle(as_handle(h), &info) ||
        !GetFileInformationByHandleEx(as_handle(h), FileStandardInfo, &std, sizeof std))
        return pl_win_errno(GetLastError());
    if (GetFileInformationByHandleEx(as_handle(h), FileIdInfo, &id, sizeof id)) {
        memcpy(&lo, id.FileId.Identifier, 8);
        memcpy(&hi, id.FileId.Identifier + 8, 8);
        out->dev = id.VolumeSerialNumber;
        out->ino = hi == 0 ? lo : lo ^ (hi * 0x9E3779B97F4A7C15ULL);
    } else {
        /* FAT and older servers have no FILE_ID_INFO. */
        out->dev = info.dwVolumeSerialNumber;
        out->ino = ((uint64_t)info.nFileIndexHigh << 32) | info.nFileIndexLow;
    }
    /* A file marked for deletion is as good as unlinked: the next opener
     * of the path gets a different file, so report no links, as fstat
     * does for an unlinked file. */
    out->nlink = std.DeletePending ? 0 : std.NumberOfLinks;
    out->size = (uint64_t)std.EndOfFile.QuadPart;
    return 0;
}

static int starts_with_ci(const wchar_t *s, const wchar_t *prefix)
{
    return _wcsnicmp(s, prefix, wcslen(prefix)) == 0;
}

/* 1 remote, 0 local, -1 unknown, from the kind of drive holding the file. */
static int remote_of(HANDLE h)
{
    wchar_t small[MAX_PATH + 1], *path = small, *big = NULL;
    wchar_t root[MAX_PATH + 1];
    DWORD len, cap = MAX_PATH + 1, flags[] = {VOLUME_NAME_DOS, VOLUME_NAME_GUID};
    int remote = -1;

    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        len = GetFinalPathNameByHandleW(h, small, cap, flags[i]);
        if (len >= cap) {
            big = malloc(((size_t)len + 1) * sizeof(wchar_t));
            if (big == NULL)
                return -1;
            len = GetFinalPathNameByHandleW(h, big, len + 1, flags[i]);
            path = big;
        }
        if (len > 0)
            break;
        path = small;
    }
    if (len == 0) {
        free(big);
        return -1;
    }
    if (starts_with_ci(path, L"\\\\?\\UNC\\")) {
        remote = 1;
    } else if (GetVolumePathNameW(path, root, MAX_PATH + 1)) {
        switch (GetDriveTypeW(root)) {
        case DRIVE_REMOTE:
            remote = 1;
            break;
        case DRIVE_FIXED:
        case DRIVE_REMOVABLE:
        case DRIVE_CDROM:
        case DRIVE_RAMDISK:
            remote = 0;
            break;
        default:
            remote = -1;
        }
    }
    free(big);
    return remote;
}

int pl_fs_stat(pl_handle h, pl_fs_info *out)
{
    wchar_t fsname[MAX_PATH + 1];

    memset(out, 0, sizeof *out);
    if (!GetVolumeInformationByHandleW(as_handle(h), NULL, 0, NULL, NULL, NULL, fsname,
                                       MAX_PATH + 1))
        return pl_win_errno(GetLastError());
    if (WideCharToMultiByte(CP_UTF8, 0, fsname, -1, out->name, (int)sizeof out->name, NULL,
                            NULL) == 0)
        out->name[0] = 0; /* longer than 31 bytes: no file system has such a name */
    out->name[sizeof out->name - 1] = 0;
    out->remote = remote_of(as_handle(h));
    /* WinFsp and Dokan mount user-space file systems ("FUSE-sshfs" and the
     * like) as local drives; their locks are only as good as the user-space
     * server, so treat them as network file systems, as pylock does for
     * FUSE on Linux. */
    if (_strnicmp(out->name, "FUSE", 4) == 0 || _strnicmp(out->name, "Dokan", 5) == 0)
        out->remote = 1;
    return 0;
}

static DWORD lock_flags(int shared)
{
    return shared ? 0 : LOCKFILE_EXCLUSIVE_LOCK;
}

int pl_try_lock(pl_handle h, int shared)
{
    OVERLAPPED ov;
    DWORD n;
    int err;
    HANDLE ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    if (ev == NULL)
        return pl_win_errno(GetLastError());
    at_offset(&ov, PL_WIN_LOCK_OFFSET, ev);
    err = run_io(as_handle(h), &ov,
                 LockFileEx(as_handle(h), lock_flags(shared) | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0,
                            &ov),
                 &n);
    CloseHandle(ev);
    return pl_win_errno((DWORD)err);
}

int pl_unlock(pl_handle h)
{
    return unlock_byte(as_handle(h));
}

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
                unlock_byte(fh);
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
        unlock_byte(fh);
        rc = ECANCELED;
    }
out:
    if (w == NULL)
        CloseHandle(ev);
    return rc;
}

/* ---- the holder record ------------------------------------------------ */

int pl_write_record(pl_handle h, const char *buf, size_t len)
{
    HANDLE fh = as_handle(h);
    HANDLE ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    size_t done = 0;
    int rc = 0;

    if (ev == NULL)
        return pl_win_errno(GetLastError());
    while (done < len) {
        OVERLAPPED ov;
        DWORD n = 0, chunk = (DWORD)(len - done > (1u << 30) ? (1u << 30) : len - done);
        at_offset(&ov, done, ev);
        ResetEvent(ev);
        DWORD err = (DWORD)run_io(fh, &ov, WriteFile(fh, buf + done, chunk, NULL, &ov), &n);
        if (err != 0) {
            /* A handle opened with PL_OPEN_READONLY: EBADF, as pwrite. */
            rc = err == ERROR_ACCESS_DENIED ? EBADF : pl_win_errno(err);
            break;
        }
        if (n == 0) {
            rc = ENOSPC;
            break;
        }
        done += n;
    }
    CloseHandle(ev);
    return rc;
}

int pl_read_record(pl_handle h, char *buf, size_t cap, size_t *len)
{
    HANDLE fh = as_handle(h);
    HANDLE ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    size_t done = 0;
    int rc = 0;

    if (ev == NULL)
        return pl_win_errno(GetLastError());
    while (done < cap) {
        OVERLAPPED ov;
        DWORD n = 0, chunk = (DWORD)(cap - done > (1u << 30) ? (1u << 30) : cap - done);
        at_offset(&ov, done, ev);
        ResetEvent(ev);
        DWORD err = (DWORD)run_io(fh, &ov, ReadFile(fh, buf + done, chunk, NULL, &ov), &n);
        if (err == ERROR_HANDLE_EOF || (err == 0 && n == 0))
            break;
        if (err != 0) {
            rc = pl_win_errno(err);
            break;
        }
        done += n;
    }
    CloseHandle(ev);
    *len = done;
    return rc;
}

#endif /* _WIN32 */
