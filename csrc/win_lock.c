/*
 * pylock's C core on Windows: lock files with CreateFileW + LockFileEx, and
 * the holder record.  The lock byte and error conventions are described in
 * pl_win_internal.h.
 */
#include "pl_lock_internal.h"
#include "pl_win_internal.h"

#ifdef _WIN32

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

/* Where a lock file is: a path (CreateFileW), or a name in a directory
 * handle from pl_open_dir (NtCreateFile relative to it: the name is looked
 * up in that directory, whatever has been renamed or linked since). */
typedef struct {
    const wchar_t *wpath;
    HANDLE dir;
    const wchar_t *wname;
    size_t wname_len;
} target;

#ifndef FILE_OPEN
#define FILE_OPEN 0x00000001
#endif
#ifndef FILE_OPEN_IF
#define FILE_OPEN_IF 0x00000003
#endif
#ifndef FILE_NON_DIRECTORY_FILE
#define FILE_NON_DIRECTORY_FILE 0x00000040
#endif
#ifndef FILE_OPEN_REPARSE_POINT
#define FILE_OPEN_REPARSE_POINT 0x00200000
#endif
#ifndef FILE_CREATED
#define FILE_CREATED 0x00000002
#endif
#ifndef OBJ_CASE_INSENSITIVE
#define OBJ_CASE_INSENSITIVE 0x00000040L
#endif

typedef struct {
    USHORT Length, MaximumLength;
    PWSTR Buffer;
} pl_unicode_string;

typedef struct {
    ULONG Length;
    HANDLE RootDirectory;
    pl_unicode_string *ObjectName;
    ULONG Attributes;
    PVOID SecurityDescriptor, SecurityQualityOfService;
} pl_object_attributes;

typedef struct {
    union {
        LONG Status;
        PVOID Pointer;
    } u;
    ULONG_PTR Information;
} pl_io_status_block;

typedef LONG(NTAPI *nt_create_file_fn)(PHANDLE, ACCESS_MASK, pl_object_attributes *,
                                        pl_io_status_block *, PLARGE_INTEGER, ULONG, ULONG,
                                        ULONG, ULONG, PVOID, ULONG);
typedef ULONG(NTAPI *nt_status_to_error_fn)(LONG);

static FARPROC ntdll_proc(const char *name)
{
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    return ntdll ? GetProcAddress(ntdll, name) : NULL;
}

static int nt_errno(LONG status)
{
    nt_status_to_error_fn to_error =
        (nt_status_to_error_fn)(void (*)(void))ntdll_proc("RtlNtStatusToDosError");
    if ((ULONG)status == 0xC0000056UL) /* STATUS_DELETE_PENDING */
        return EAGAIN;
    if ((ULONG)status == 0xC00000BAUL) /* STATUS_FILE_IS_A_DIRECTORY */
        return EISDIR;
    return to_error ? pl_win_errno(to_error(status)) : EIO;
}

/* NtCreateFile of t->wname in t->dir, as CreateFileW would open a path with
 * these arguments (asynchronous: the handle is used with OVERLAPPED). */
static HANDLE open_in_dir(const target *t, DWORD access, DWORD share, int create, DWORD attrs,
                          int reparse, int *made, int *rc)
{
    nt_create_file_fn create_file =
        (nt_create_file_fn)(void (*)(void))ntdll_proc("NtCreateFile");
    pl_unicode_string name;
    pl_object_attributes oa;
    pl_io_status_block io;
    HANDLE h = INVALID_HANDLE_VALUE;
    LONG status;

    if (create_file == NULL) {
        *rc = ENOSYS;
        return INVALID_HANDLE_VALUE;
    }
    name.Buffer = (PWSTR)t->wname;
    name.Length = name.MaximumLength = (USHORT)(t->wname_len * sizeof(wchar_t));
    memset(&oa, 0, sizeof oa);
    oa.Length = sizeof oa;
    oa.RootDirectory = t->dir;
    oa.ObjectName = &name;
    oa.Attributes = OBJ_CASE_INSENSITIVE; /* as CreateFileW */
    memset(&io, 0, sizeof io);
    status = create_file(&h, access | SYNCHRONIZE | FILE_READ_ATTRIBUTES, &oa, &io, NULL, attrs,
                         share, create ? FILE_OPEN_IF : FILE_OPEN,
                         FILE_NON_DIRECTORY_FILE | (reparse ? FILE_OPEN_REPARSE_POINT : 0), NULL,
                         0);
    if (status < 0) {
        *rc = nt_errno(status);
        return INVALID_HANDLE_VALUE;
    }
    *made = io.Information == FILE_CREATED;
    return h;
}

static HANDLE open_target(const target *t, DWORD access, DWORD share, int create, DWORD attrs,
                          int reparse, int *made, int *rc)
{
    HANDLE h;
    *made = 0;
    if (t->wpath == NULL)
        return open_in_dir(t, access, share, create, attrs, reparse, made, rc);
    /* OVERLAPPED: a lock wait is then an I/O request that can be timed and
     * cancelled.  No SECURITY_ATTRIBUTES: the handle is not inheritable,
     * so a child process never keeps the lock alive. */
    h = CreateFileW(t->wpath, access, share, NULL, create ? OPEN_ALWAYS : OPEN_EXISTING,
                    attrs | FILE_FLAG_OVERLAPPED | (reparse ? FILE_FLAG_OPEN_REPARSE_POINT : 0),
                    NULL);
    if (h == INVALID_HANDLE_VALUE)
        *rc = open_error(t->wpath, GetLastError());
    else
        *made = create && GetLastError() != ERROR_ALREADY_EXISTS;
    return h;
}

/* create_mode: Windows has no permission bits, and the new file inherits
 * its directory's ACL.  The one bit that maps is the owner's write
 * permission: without it the file is created FILE_ATTRIBUTE_READONLY, so
 * later openers for writing get EACCES, as on POSIX. */
static int open_lock_target(const target *t, int flags, int create_mode, pl_handle *out,
                            int *created)
{
    DWORD access = (flags & PL_OPEN_READONLY) ? GENERIC_READ : GENERIC_READ | GENERIC_WRITE;
    DWORD share = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
    DWORD attrs = FILE_ATTRIBUTE_NORMAL;
    int create = (flags & PL_OPEN_CREATE) != 0;
    BY_HANDLE_FILE_INFORMATION info, again;
    HANDLE h, h2;
    int rc = 0, made, made2;

    *created = 0;
    if (create_mode >= 0 && !(create_mode & 0200))
        attrs = FILE_ATTRIBUTE_READONLY;
    for (int attempt = 0;; attempt++) {
        h = open_target(t, access, share, create, attrs, 1, &made, &rc);
        if (h == INVALID_HANDLE_VALUE)
            break;
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
         * sure the name still leads to the same file (not a link swapped
         * in between the two opens). */
        h2 = open_target(t, access, share, 0, attrs, 0, &made2, &rc);
        CloseHandle(h);
        if (h2 == INVALID_HANDLE_VALUE)
            break;
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
    return rc;
}

int pl_open(const char *path, int flags, int create_mode, pl_handle *out, int *created)
{
    target t;
    wchar_t *wpath = NULL;
    int rc;

    *created = 0;
    if ((rc = pl_win_wide_path(path, &wpath)) != 0)
        return rc;
    memset(&t, 0, sizeof t);
    t.wpath = wpath;
    rc = open_lock_target(&t, flags, create_mode, out, created);
    free(wpath);
    return rc;
}

/* One component: no separator, no drive or stream (":"), not "." or "..". */
int pl__is_name(const char *name)
{
    return name[0] != 0 && strpbrk(name, "\\/:") == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

int pl_open_at(pl_handle dir, const char *name, int flags, int create_mode, pl_handle *out,
               int *created)
{
    target t;
    wchar_t *wname = NULL;
    size_t n;
    int rc;

    *created = 0;
    if (as_handle(dir) == INVALID_HANDLE_VALUE || as_handle(dir) == NULL)
        return EBADF;
    if (!pl__is_name(name))
        return EINVAL;
    if ((rc = pl_win_wide(name, &wname, &n)) != 0)
        return rc;
    if (n > 32767) {
        free(wname);
        return ENAMETOOLONG;
    }
    memset(&t, 0, sizeof t);
    t.dir = as_handle(dir);
    t.wname = wname;
    t.wname_len = n;
    rc = open_lock_target(&t, flags, create_mode, out, created);
    free(wname);
    return rc;
}

int pl_open_dir(const char *path, pl_handle *out)
{
    DWORD share = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
    BY_HANDLE_FILE_INFORMATION info;
    FILE_ATTRIBUTE_TAG_INFO tag;
    wchar_t *wpath = NULL;
    HANDLE h;
    int rc;

    if ((rc = pl_win_wide_path(path, &wpath)) != 0)
        return rc;
    /* BACKUP_SEMANTICS opens a directory; OPEN_REPARSE_POINT opens a
     * junction or a link itself, so that it can be refused. */
    h = CreateFileW(wpath, FILE_LIST_DIRECTORY | FILE_TRAVERSE | FILE_READ_ATTRIBUTES, share,
                    NULL, OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS | FILE_FLAG_OPEN_REPARSE_POINT,
                    NULL);
    if (h == INVALID_HANDLE_VALUE) {
        rc = pl_win_errno(GetLastError());
        free(wpath);
        return rc;
    }
    free(wpath);
    if (!GetFileInformationByHandle(h, &info)) {
        rc = pl_win_errno(GetLastError());
    } else if (info.dwFileAttributes & FILE_ATTRIBUTE_REPARSE_POINT) {
        if (!GetFileInformationByHandleEx(h, FileAttributeTagInfo, &tag, sizeof tag))
            rc = pl_win_errno(GetLastError());
        else if (IsReparseTagNameSurrogate(tag.ReparseTag))
            rc = PL_E_SYMLINK;
    }
    if (rc == 0 && !(info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY))
        rc = ENOTDIR;
    if (rc != 0) {
        CloseHandle(h);
        return rc;
    }
    *out = (pl_handle)(intptr_t)h;
    return 0;
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
