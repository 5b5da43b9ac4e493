/*
 * Tests of pylock's Windows C core (win_lock.c, win_proc.c), run on Windows
 * or under Wine.  The program re-runs itself as "test_win.exe child ..." to
 * get second processes: holders that die, lockers that are refused.
 *
 * Error codes are compared with the values Python's errno module has on
 * Windows, which is what the core returns (see win_lock.c).
 */
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "pylock.h"
#include "pylock_proc.h"

#define PY_EWOULDBLOCK 10035 /* errno.EWOULDBLOCK in Python on Windows */
#define PY_ETIMEDOUT 10060   /* errno.ETIMEDOUT */

/* Safety nets so a broken core fails the run instead of hanging it; no
 * test relies on them for ordering. */
#define HANG_MS 30000

/* An attempt's token (pl_own): any nonzero even number. */
#define ATTEMPT ((uintptr_t)16)

static int passed, failed, skipped;
/* Whether LockFileEx can queue a waiting request (Windows) or not (Wine 8,
 * whose NtLockFile says "Async I/O lock wait not implemented"). */
static int g_kernel_lock_wait;
static wchar_t g_exe[MAX_PATH];
static wchar_t g_wdir[MAX_PATH];
static char g_dir[4 * MAX_PATH];

static void check(int ok, const char *what, int line, const char *fmt, ...)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL line %d: %s", line, what);
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        printf(" (");
        vprintf(fmt, ap);
        printf(")");
        va_end(ap);
    }
    printf("\n");
    fflush(stdout);
}

#define CHECK(cond) check((cond) != 0, #cond, __LINE__, NULL)
#define CHECK_EQ(a, b)                                                                         \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        check(a_ == b_, #a " == " #b, __LINE__, "%lld != %lld", a_, b_);                       \
    } while (0)

static void section(const char *name)
{
    printf("-- %s\n", name);
    fflush(stdout);
}

static void skip(const char *why)
{
    skipped++;
    printf("   SKIP: %s\n", why);
    fflush(stdout);
}

static int is_wine(void)
{
    return GetProcAddress(GetModuleHandleW(L"ntdll.dll"), "wine_get_version") != NULL;
}

static double now_ms(void)
{
    LARGE_INTEGER c, f;
    QueryPerformanceCounter(&c);
    QueryPerformanceFrequency(&f);
    return (double)c.QuadPart * 1000.0 / (double)f.QuadPart;
}

static void utf8_of(const wchar_t *w, char *out, int cap)
{
    if (WideCharToMultiByte(CP_UTF8, 0, w, -1, out, cap, NULL, NULL) == 0)
        out[0] = 0;
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s\\%s", g_dir, name);
}

static void wpath_in(wchar_t *out, size_t cap, const wchar_t *name)
{
    swprintf(out, cap, L"%ls\\%ls", g_wdir, name);
}

static HANDLE inheritable_event(void)
{
    SECURITY_ATTRIBUTES sa = {sizeof sa, NULL, TRUE};
    return CreateEventW(&sa, TRUE, FALSE, NULL);
}

/* Start "test_win.exe child <args>", inheriting handles (so events can be
 * passed by value, and so a lock handle that were inheritable would leak). */
static PROCESS_INFORMATION spawn(const wchar_t *fmt, ...)
{
    wchar_t args[2048], cmd[4096];
    STARTUPINFOW si;
    PROCESS_INFORMATION pi;
    va_list ap;

    va_start(ap, fmt);
    vswprintf(args, sizeof args / sizeof args[0], fmt, ap);
    va_end(ap);
    swprintf(cmd, sizeof cmd / sizeof cmd[0], L"\"%ls\" child %ls", g_exe, args);
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    memset(&pi, 0, sizeof pi);
    if (!CreateProcessW(g_exe, cmd, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi)) {
        printf("CreateProcessW failed: %lu\n", GetLastError());
        exit(3);
    }
    return pi;
}

/* Exit code of a child, or -1 if it did not finish in time (then killed). */
static long finish(PROCESS_INFORMATION *pi)
{
    DWORD code = 0;
    if (WaitForSingleObject(pi->hProcess, HANG_MS) != WAIT_OBJECT_0) {
        TerminateProcess(pi->hProcess, 99);
        WaitForSingleObject(pi->hProcess, HANG_MS);
        code = (DWORD)-1;
    } else {
        GetExitCodeProcess(pi->hProcess, &code);
    }
    CloseHandle(pi->hProcess);
    CloseHandle(pi->hThread);
    return (long)(int)code;
}

static pl_handle open_ok(const char *path, int flags)
{
    pl_handle h = -1;
    int created = -1;
    int rc = pl_open(path, flags, -1, &h, &created);
    check(rc == 0, "pl_open", __LINE__, "%s: rc %d", path, rc);
    return h;
}

/* ---- child processes ---------------------------------------------------- */

static int child_main(int argc, wchar_t **argv)
{
    char path[4 * MAX_PATH];
    const wchar_t *mode = argv[2];
    pl_handle h;
    int created, rc;

    if (argc > 3)
        utf8_of(argv[3], path, sizeof path);
    if (wcscmp(mode, L"trylock") == 0 && argc == 5) {
        if (pl_open(path, 0, -1, &h, &created) != 0)
            return 100;
        rc = pl_try_lock(h, _wtoi(argv[4]));
        return rc == 0 ? 0 : rc == PY_EWOULDBLOCK ? 1 : 100;
    }
    if (wcscmp(mode, L"hold") == 0 && argc == 7) {
        HANDLE ready = (HANDLE)(intptr_t)_wtoi64(argv[4]);
        HANDLE go = (HANDLE)(intptr_t)_wtoi64(argv[5]);
        static const char rec[] = "child-record";
        if (pl_open(path, PL_OPEN_CREATE, -1, &h, &created) != 0 || pl_try_lock(h, 0) != 0 ||
            pl_write_record(h, rec, sizeof rec - 1) != 0)
            return 100;
        SetEvent(ready);
        WaitForSingleObject(go, HANG_MS);
        /* Exit holding the lock: the system must release it. */
        ExitProcess((UINT)_wtoi(argv[6]));
    }
    if (wcscmp(mode, L"read") == 0 && argc == 5) {
        char want[256], got[256];
        DWORD n = 0;
        HANDLE f = CreateFileW(argv[3], GENERIC_READ,
                               FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                               OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
        utf8_of(argv[4], want, sizeof want);
        if (f == INVALID_HANDLE_VALUE || !ReadFile(f, got, sizeof got - 1, &n, NULL))
            return 100;
        got[n] = 0;
        return strcmp(got, want) == 0 ? 0 : 1;
    }
    if (wcscmp(mode, L"exitwhen") == 0 && argc == 5) {
        WaitForSingleObject((HANDLE)(intptr_t)_wtoi64(argv[3]), HANG_MS);
        return _wtoi(argv[4]);
    }
    if (wcscmp(mode, L"inherit") == 0 && argc == 6) {
        /* Did the parent's lock handle come along?  A handle value that is
         * invalid here, or names another object, says no. */
        HANDLE inh = (HANDLE)(intptr_t)_wtoi64(argv[3]);
        BY_HANDLE_FILE_INFORMATION info;
        if (!GetFileInformationByHandle(inh, &info))
            return 0;
        return (info.nFileIndexLow == (DWORD)_wtoi64(argv[4]) &&
                info.dwVolumeSerialNumber == (DWORD)_wtoi64(argv[5]))
                   ? 1
                   : 0;
    }
    return 101;
}

/* ---- lock tests ------------------------------------------------------- */

static void test_open_and_stat(void)
{
    char path[4 * MAX_PATH];
    pl_handle h1, h2, h3;
    pl_file_info a, b;
    int created = -1;

    section("open creates once, stat identifies the file");
    path_in(path, sizeof path, "open.lock");
    CHECK_EQ(pl_open(path, 0, -1, &h1, &created), ENOENT);
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h1, &created), 0);
    CHECK_EQ(created, 1);
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h2, &created), 0);
    CHECK_EQ(created, 0);
    CHECK_EQ(pl_open(path, 0, -1, &h3, &created), 0);
    CHECK_EQ(created, 0);
    CHECK_EQ(pl_file_stat(h1, &a), 0);
    CHECK_EQ(pl_file_stat(h2, &b), 0);
    CHECK(a.dev == b.dev && a.ino == b.ino);
    CHECK_EQ(a.nlink, 1);
    CHECK_EQ(a.size, 0);
    {
        /* The values os.stat gives on Python 3.12+ (FILE_ID_INFO), or
         * the by-handle ones where that is missing. */
        FILE_ID_INFO id;
        BY_HANDLE_FILE_INFORMATION bh;
        uint64_t lo, hi;
        CHECK(GetFileInformationByHandle((HANDLE)(intptr_t)h1, &bh));
        if (GetFileInformationByHandleEx((HANDLE)(intptr_t)h1, FileIdInfo, &id, sizeof id)) {
            memcpy(&lo, id.FileId.Identifier, 8);
            memcpy(&hi, id.FileId.Identifier + 8, 8);
            CHECK(a.dev == id.VolumeSerialNumber && hi == 0 && a.ino == lo);
        } else {
            printf("   (no FILE_ID_INFO here: by-handle serial and index)\n");
            CHECK(a.dev == bh.dwVolumeSerialNumber &&
                  a.ino == (((uint64_t)bh.nFileIndexHigh << 32) | bh.nFileIndexLow));
        }
    }
    CHECK_EQ(pl_write_record(h1, "abc", 3), 0);
    CHECK_EQ(pl_file_stat(h2, &b), 0);
    CHECK_EQ(b.size, 3);
    CHECK_EQ(pl_close(h1), 0);
    CHECK_EQ(pl_close(h2), 0);
    CHECK_EQ(pl_close(h3), 0);
}

static void test_exclusive_and_shared(void)
{
    char path[4 * MAX_PATH];
    pl_handle h1, h2, h3;

    section("exclusive lock refuses a second handle; unlock is idempotent");
    path_in(path, sizeof path, "excl.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    h3 = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_try_lock(h1, 0), 0);
    CHECK_EQ(pl_try_lock(h2, 0), PY_EWOULDBLOCK);
    CHECK_EQ(pl_try_lock(h2, 1), PY_EWOULDBLOCK);
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_try_lock(h2, 0), 0);
    CHECK_EQ(pl_try_lock(h1, 1), PY_EWOULDBLOCK);
    CHECK_EQ(pl_unlock(h2), 0);
    CHECK_EQ(pl_unlock(h2), 0);

    section("shared locks coexist and keep an exclusive one out");
    CHECK_EQ(pl_try_lock(h1, 1), 0);
    CHECK_EQ(pl_try_lock(h2, 1), 0);
    CHECK_EQ(pl_try_lock(h3, 0), PY_EWOULDBLOCK);
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_try_lock(h3, 0), PY_EWOULDBLOCK);
    CHECK_EQ(pl_unlock(h2), 0);
    CHECK_EQ(pl_try_lock(h3, 0), 0);
    CHECK_EQ(pl_unlock(h3), 0);

    section("closing a handle releases its lock at once");
    CHECK_EQ(pl_try_lock(h1, 0), 0);
    CHECK_EQ(pl_close(h1), 0);
    CHECK_EQ(pl_try_lock(h2, 0), 0);
    CHECK_EQ(pl_close(h2), 0);
    CHECK_EQ(pl_close(h3), 0);
}

static void test_second_process(void)
{
    char path[4 * MAX_PATH];
    wchar_t wpath[MAX_PATH];
    PROCESS_INFORMATION pi;
    pl_handle h;

    section("a second process is refused while the lock is held");
    path_in(path, sizeof path, "proc.lock");
    wpath_in(wpath, MAX_PATH, L"proc.lock");
    h = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_try_lock(h, 0), 0);
    pi = spawn(L"trylock \"%ls\" 0", wpath);
    CHECK_EQ(finish(&pi), 1);
    pi = spawn(L"trylock \"%ls\" 1", wpath);
    CHECK_EQ(finish(&pi), 1);
    CHECK_EQ(pl_unlock(h), 0);
    CHECK_EQ(pl_try_lock(h, 1), 0);
    pi = spawn(L"trylock \"%ls\" 1", wpath);
    CHECK_EQ(finish(&pi), 0);
    pi = spawn(L"trylock \"%ls\" 0", wpath);
    CHECK_EQ(finish(&pi), 1);
    CHECK_EQ(pl_unlock(h), 0);
    pi = spawn(L"trylock \"%ls\" 0", wpath);
    CHECK_EQ(finish(&pi), 0);
    CHECK_EQ(pl_close(h), 0);
}

static void test_record(void)
{
    char path[4 * MAX_PATH], buf[64];
    wchar_t wpath[MAX_PATH];
    static const char rec[] = "pylock-record v1 hello";
    PROCESS_INFORMATION pi;
    pl_handle h1, h2, hr;
    size_t len = 0;
    DWORD n = 0;
    HANDLE plain;

    section("the record at offset 0 stays readable while the lock is held");
    path_in(path, sizeof path, "record.lock");
    wpath_in(wpath, MAX_PATH, L"record.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_read_record(h2, buf, sizeof buf, &len), 0);
    CHECK_EQ(len, 0);
    CHECK_EQ(pl_try_lock(h1, 0), 0);
    CHECK_EQ(pl_write_record(h1, rec, sizeof rec - 1), 0);
    CHECK_EQ(pl_read_record(h2, buf, sizeof buf, &len), 0);
    CHECK(len == sizeof rec - 1 && memcmp(buf, rec, len) == 0);
    CHECK_EQ(pl_read_record(h2, buf, 6, &len), 0);
    CHECK(len == 6 && memcmp(buf, "pylock", 6) == 0);

    plain = CreateFileW(wpath, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                        NULL, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    CHECK(plain != INVALID_HANDLE_VALUE);
    memset(buf, 0, sizeof buf);
    CHECK(ReadFile(plain, buf, sizeof buf - 1, &n, NULL));
    CHECK(n == sizeof rec - 1 && strcmp(buf, rec) == 0);
    CloseHandle(plain);

    pi = spawn(L"read \"%ls\" \"%hs\"", wpath, rec);
    CHECK_EQ(finish(&pi), 0);

    section("a read-only handle reads the record, cannot write it, can lock");
    hr = open_ok(path, PL_OPEN_READONLY);
    CHECK_EQ(pl_read_record(hr, buf, sizeof buf, &len), 0);
    CHECK(len == sizeof rec - 1 && memcmp(buf, rec, len) == 0);
    CHECK_EQ(pl_write_record(hr, "x", 1), EBADF);
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_try_lock(hr, 0), 0);
    CHECK_EQ(pl_try_lock(h2, 1), PY_EWOULDBLOCK);
    CHECK_EQ(pl_close(hr), 0);
    CHECK_EQ(pl_close(h1), 0);
    CHECK_EQ(pl_close(h2), 0);
}

typedef struct {
    pl_handle h;
    int shared;
    int64_t timeout_ns;
    pl_waiter *w;
    HANDLE entering;
    int rc;
    double returned_ms;
    int proc; /* 1: pl_proc_wait instead of pl_lock_wait */
} wait_job;

static DWORD WINAPI wait_thread(LPVOID arg)
{
    wait_job *job = arg;
    SetEvent(job->entering);
    if (job->proc)
        job->rc = pl_proc_wait(job->h, job->timeout_ns, job->w);
    else
        job->rc = pl_lock_wait(job->h, job->shared, job->timeout_ns, job->w);
    job->returned_ms = now_ms();
    return 0;
}

static HANDLE start_wait(wait_job *job)
{
    job->entering = CreateEventW(NULL, TRUE, FALSE, NULL);
    job->rc = -1;
    HANDLE t = CreateThread(NULL, 0, wait_thread, job, 0, NULL);
    WaitForSingleObject(job->entering, HANG_MS);
    return t;
}

static int join(HANDLE t, wait_job *job)
{
    int done = WaitForSingleObject(t, HANG_MS) == WAIT_OBJECT_0;
    CloseHandle(t);
    CloseHandle(job->entering);
    return done;
}

static double wake_ms_lock, wake_ms_proc, timed_wait_ms;

static void probe_kernel_lock_wait(void)
{
    char path[4 * MAX_PATH];
    pl_handle h1, h2;
    pl_waiter *w = pl_waiter_new();
    int rc;

    section("lock waits: queued in the kernel, or refused at once (never a silent hang)");
    path_in(path, sizeof path, "probe.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_try_lock(h1, 0), 0);
    rc = pl_lock_wait(h2, 0, 100 * 1000000LL, w);
    check(rc == PY_ETIMEDOUT || rc == ENOTSUP, "wait on a held lock", __LINE__, "rc %d", rc);
    g_kernel_lock_wait = rc == PY_ETIMEDOUT;
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_try_lock(h1, 0), 0); /* the refused or timed-out wait holds nothing */
    CHECK_EQ(pl_unlock(h1), 0);
    if (!g_kernel_lock_wait) {
        printf("   this platform does not queue overlapped LockFileEx waits (%s): pl_lock_wait "
               "returns ENOTSUP\n",
               is_wine() ? "Wine's NtLockFile: \"Async I/O lock wait not implemented\"" : "?");
        CHECK(is_wine()); /* Windows must queue them */
    }
    pl_waiter_free(w);
    pl_close(h1);
    pl_close(h2);
}

static void test_wait_woken_by_exit(void)
{
    char path[4 * MAX_PATH], buf[64];
    wchar_t wpath[MAX_PATH];
    HANDLE ready = inheritable_event(), go = inheritable_event(), t;
    PROCESS_INFORMATION pi;
    wait_job job;
    size_t len = 0;
    double go_ms;
    int rc;

    section("a blocking lock wait is woken when the holder process dies");
    path_in(path, sizeof path, "die.lock");
    wpath_in(wpath, MAX_PATH, L"die.lock");
    if (!g_kernel_lock_wait) {
        skip("no kernel lock waits on this platform (see above)");
    } else {
        pi = spawn(L"hold \"%ls\" %lld %lld 7", wpath, (long long)(intptr_t)ready,
                   (long long)(intptr_t)go);
        CHECK_EQ(WaitForSingleObject(ready, HANG_MS), WAIT_OBJECT_0);
        memset(&job, 0, sizeof job);
        job.h = open_ok(path, 0);
        job.timeout_ns = -1;
        job.w = pl_waiter_new();
        CHECK(job.w != NULL);
        CHECK_EQ(pl_try_lock(job.h, 0), PY_EWOULDBLOCK);
        CHECK_EQ(pl_read_record(job.h, buf, sizeof buf, &len), 0);
        CHECK(len == 12 && memcmp(buf, "child-record", 12) == 0);
        t = start_wait(&job);
        /* The wait must still be blocked while the child holds the lock. */
        CHECK_EQ(WaitForSingleObject(t, 200), WAIT_TIMEOUT);
        go_ms = now_ms();
        SetEvent(go);
        CHECK(join(t, &job));
        CHECK_EQ(job.rc, 0);
        wake_ms_lock = job.returned_ms - go_ms;
        CHECK_EQ(finish(&pi), 7);
        CHECK_EQ(pl_unlock(job.h), 0);
        CHECK_EQ(pl_close(job.h), 0);
        pl_waiter_free(job.w);
        ResetEvent(ready);
        ResetEvent(go);
    }

    section("the holder's exit seen on its process handle, then the lock is free");
    pi = spawn(L"hold \"%ls\" %lld %lld 9", wpath, (long long)(intptr_t)ready,
               (long long)(intptr_t)go);
    CHECK_EQ(WaitForSingleObject(ready, HANG_MS), WAIT_OBJECT_0);
    memset(&job, 0, sizeof job);
    job.proc = 1;
    job.timeout_ns = -1;
    job.w = pl_waiter_new();
    CHECK_EQ(pl_proc_open(pi.dwProcessId, &job.h), 0);
    {
        pl_handle lh = open_ok(path, 0);
        CHECK_EQ(pl_try_lock(lh, 0), PY_EWOULDBLOCK);
        t = start_wait(&job);
        CHECK_EQ(WaitForSingleObject(t, 200), WAIT_TIMEOUT);
        go_ms = now_ms();
        SetEvent(go);
        CHECK(join(t, &job));
        CHECK_EQ(job.rc, 0);
        wake_ms_proc = job.returned_ms - go_ms;
        /* Windows may release a dead process's locks a moment after its
         * handle is signalled: a kernel wait covers that gap. */
        rc = pl_try_lock(lh, 0);
        if (rc == PY_EWOULDBLOCK && g_kernel_lock_wait)
            rc = pl_lock_wait(lh, 0, (int64_t)HANG_MS * 1000000, NULL);
        CHECK_EQ(rc, 0);
        CHECK_EQ(pl_read_record(lh, buf, sizeof buf, &len), 0);
        CHECK(len == 12 && memcmp(buf, "child-record", 12) == 0);
        pl_close(lh);
    }
    CHECK_EQ(finish(&pi), 9);
    pl_proc_close(job.h);
    pl_waiter_free(job.w);
    CloseHandle(ready);
    CloseHandle(go);
}

static void test_timeout_and_cancel(void)
{
    char path[4 * MAX_PATH];
    pl_handle h1, h2, h3;
    pl_waiter *w;
    wait_job job;
    HANDLE t;
    double t0, dt;

    path_in(path, sizeof path, "timed.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    h3 = open_ok(path, PL_OPEN_CREATE);
    w = pl_waiter_new();

    section("timeout 0 tries once; no waiter means a plain wait");
    CHECK_EQ(pl_try_lock(h1, 0), 0);
    CHECK_EQ(pl_lock_wait(h2, 1, 0, w), PY_ETIMEDOUT);
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_lock_wait(h2, 0, 0, w), 0);
    CHECK_EQ(pl_unlock(h2), 0);
    CHECK_EQ(pl_lock_wait(h2, 0, 5000 * 1000000LL, NULL), 0);
    CHECK_EQ(pl_unlock(h2), 0);

    section("a waiter cancelled before the wait does not take a free lock");
    pl_waiter_cancel(w);
    CHECK_EQ(pl_lock_wait(h2, 0, -1, w), ECANCELED);
    CHECK_EQ(pl_try_lock(h3, 0), 0);
    CHECK_EQ(pl_unlock(h3), 0);
    pl_waiter_free(w);

    section("a timed wait times out after its timeout and leaves no lock");
    if (!g_kernel_lock_wait) {
        skip("no kernel lock waits on this platform");
    } else {
        w = pl_waiter_new();
        CHECK_EQ(pl_try_lock(h1, 0), 0);
        t0 = now_ms();
        CHECK_EQ(pl_lock_wait(h2, 0, 300 * 1000000LL, w), PY_ETIMEDOUT);
        dt = now_ms() - t0;
        timed_wait_ms = dt;
        check(dt >= 300.0 && dt < 5000.0, "timed wait lasted its timeout", __LINE__, "%.1f ms", dt);
        CHECK_EQ(pl_unlock(h1), 0);
        CHECK_EQ(pl_try_lock(h3, 0), 0); /* h2 did not keep a lock behind */
        CHECK_EQ(pl_unlock(h3), 0);
        pl_waiter_free(w);
    }

    section("cancelling a blocked wait returns ECANCELED and leaves no lock");
    if (!g_kernel_lock_wait) {
        skip("no kernel lock waits on this platform");
    } else {
        CHECK_EQ(pl_try_lock(h1, 0), 0);
        memset(&job, 0, sizeof job);
        job.h = h2;
        job.timeout_ns = -1;
        job.w = pl_waiter_new();
        t = start_wait(&job);
        CHECK_EQ(WaitForSingleObject(t, 100), WAIT_TIMEOUT);
        pl_waiter_cancel(job.w);
        CHECK(join(t, &job));
        CHECK_EQ(job.rc, ECANCELED);
        CHECK_EQ(pl_unlock(h1), 0);
        CHECK_EQ(pl_try_lock(h3, 0), 0);
        CHECK_EQ(pl_unlock(h3), 0);
        pl_waiter_free(job.w);
    }

    pl_close(h1);
    pl_close(h2);
    pl_close(h3);
}

static int race_granted, race_cancelled;

static void test_cancel_grant_race(void)
{
    char path[4 * MAX_PATH];
    pl_handle h1, h2, h3;
    int bad = 0;

    section("cancel racing with the grant: only 0 leaves the lock held (300 rounds)");
    if (!g_kernel_lock_wait) {
        skip("no kernel lock waits on this platform");
        return;
    }
    path_in(path, sizeof path, "race.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    h3 = open_ok(path, PL_OPEN_CREATE);
    for (int i = 0; i < 300; i++) {
        wait_job job;
        HANDLE t;
        int probe;
        if (pl_try_lock(h1, 0) != 0) {
            bad++;
            break;
        }
        memset(&job, 0, sizeof job);
        job.h = h2;
        job.timeout_ns = -1;
        job.w = pl_waiter_new();
        t = start_wait(&job);
        if (i % 2) {
            pl_unlock(h1);
            pl_waiter_cancel(job.w);
        } else {
            pl_waiter_cancel(job.w);
            pl_unlock(h1);
        }
        if (!join(t, &job)) {
            bad++;
            break;
        }
        probe = pl_try_lock(h3, 0);
        if (job.rc == 0) {
            race_granted++;
            bad += probe != PY_EWOULDBLOCK;
            pl_unlock(h2);
        } else if (job.rc == ECANCELED) {
            race_cancelled++;
            bad += probe != 0;
            pl_unlock(h3);
        } else {
            bad++;
        }
        pl_waiter_free(job.w);
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(race_granted + race_cancelled, 300);
    printf("   granted %d, cancelled %d\n", race_granted, race_cancelled);
    pl_close(h1);
    pl_close(h2);
    pl_close(h3);
}

static void test_not_inherited(void)
{
    char path[4 * MAX_PATH];
    BY_HANDLE_FILE_INFORMATION info;
    PROCESS_INFORMATION pi;
    pl_handle h;

    section("lock handles are not inherited by child processes");
    path_in(path, sizeof path, "inherit.lock");
    h = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_try_lock(h, 0), 0);
    CHECK(GetFileInformationByHandle((HANDLE)(intptr_t)h, &info));
    pi = spawn(L"inherit %lld %lu %lu", (long long)h, info.nFileIndexLow,
               info.dwVolumeSerialNumber);
    CHECK_EQ(finish(&pi), 0);
    CHECK_EQ(pl_close(h), 0);
}

/* ---- one-call acquisition (claim.c on top of this core) ------------------ */

static uint32_t crc32_of(const char *data, size_t len)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned char)data[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static int reports_pending_delete(pl_handle h)
{
    FILE_STANDARD_INFO si;
    return GetFileInformationByHandleEx((HANDLE)(intptr_t)h, FileStandardInfo, &si, sizeof si) &&
           si.DeletePending;
}

typedef struct {
    pl_handle h;
    pl_lockfile *lf;
    HANDLE entering;
    int rc;
} claim_job;

static DWORD WINAPI wait_then_claim(LPVOID arg)
{
    claim_job *job = arg;
    SetEvent(job->entering);
    job->rc = pl_lock_wait(job->h, 0, (int64_t)HANG_MS * 1000000, NULL);
    if (job->rc == 0)
        job->rc = pl_claim(job->lf);
    return 0;
}

static void test_acquire_and_claim(void)
{
    static const char head[] = "{\"pid\":4242,\"program\":\"t\xc3\xa9st\",\"acquired_at\":";
    char path[4 * MAX_PATH], buf[512];
    wchar_t wpath[MAX_PATH];
    pl_lockfile a, b;
    pl_file_info st;
    pl_handle h1, h2, h3;
    size_t len = 0, plen = 0;
    unsigned crc = 0;
    int hdr = 0;

    section("pl_acquire: lock, check the file is linked, write the record");
    path_in(path, sizeof path, "claim.lock");
    wpath_in(wpath, MAX_PATH, L"claim.lock");
    h1 = open_ok(path, PL_OPEN_CREATE);
    h2 = open_ok(path, PL_OPEN_CREATE);
    memset(&a, 0, sizeof a);
    a.handle = h1;
    a.head = head;
    a.head_len = sizeof head - 1;
    a.head_crc = crc32_of(head, sizeof head - 1);
    b = a;
    b.handle = h2;
    CHECK_EQ(pl_acquire(&a, ATTEMPT), 0);
    CHECK_EQ(a.record_error, 0);
    CHECK_EQ(pl_file_stat(h1, &st), 0);
    CHECK(a.st.dev == st.dev && a.st.ino == st.ino && a.st.nlink == 1);
    CHECK_EQ(pl_acquire(&b, ATTEMPT), PY_EWOULDBLOCK);
    CHECK_EQ(pl_read_record(h2, buf, sizeof buf - 1, &len), 0);
    buf[len] = 0;
    CHECK(sscanf(buf, "pylock-record v1 %zu %8x\n%n", &plen, &crc, &hdr) == 2 && hdr > 0);
    CHECK_EQ((size_t)hdr + plen, len);
    CHECK(memcmp(buf + hdr, head, sizeof head - 1) == 0 && buf[len - 1] == '}');
    CHECK_EQ(crc32_of(buf + hdr, plen), crc);

    section("pl_acquire: a shared lock writes no record");
    CHECK_EQ(pl_unlock(h1), 0);
    a.shared = b.shared = 1;
    a.head_len = b.head_len = 0;
    CHECK_EQ(pl_write_record(h1, "untouched", 9), 0);
    CHECK_EQ(pl_acquire(&a, ATTEMPT), 0);
    CHECK_EQ(pl_acquire(&b, ATTEMPT), 0);
    CHECK_EQ(pl_read_record(h2, buf, 9, &len), 0);
    CHECK(len == 9 && memcmp(buf, "untouched", 9) == 0);
    CHECK_EQ(pl_unlock(h1), 0);
    CHECK_EQ(pl_unlock(h2), 0);
    a.shared = b.shared = 0;

    section("pl_claim: the lock of a deleted file is given back (PL_E_UNLINKED)");
    h3 = open_ok(path, PL_OPEN_CREATE);
    b.handle = h3;
    CHECK_EQ(pl_acquire(&a, ATTEMPT), 0);
    CHECK(DeleteFileW(wpath));
    if (!reports_pending_delete(h1)) {
        skip("this platform does not report pending deletes (Wine), so nlink stays 1");
        CHECK_EQ(pl_unlock(h1), 0);
    } else {
        CHECK_EQ(pl_acquire(&b, ATTEMPT), PY_EWOULDBLOCK);
        if (g_kernel_lock_wait) {
            /* h3 was opened before the delete and waits; the holder
             * releases; the waiter must find the file unlinked. */
            claim_job job = {h3, &b, CreateEventW(NULL, TRUE, FALSE, NULL), -1};
            HANDLE t = CreateThread(NULL, 0, wait_then_claim, &job, 0, NULL);
            WaitForSingleObject(job.entering, HANG_MS);
            CHECK_EQ(WaitForSingleObject(t, 100), WAIT_TIMEOUT);
            CHECK_EQ(pl_unlock(h1), 0);
            CHECK_EQ(WaitForSingleObject(t, HANG_MS), WAIT_OBJECT_0);
            CHECK_EQ(job.rc, PL_E_UNLINKED);
            CloseHandle(t);
            CloseHandle(job.entering);
        } else {
            CHECK_EQ(pl_unlock(h1), 0);
            CHECK_EQ(pl_acquire(&b, ATTEMPT), PL_E_UNLINKED);
        }
        CHECK_EQ(pl_try_lock(h1, 0), 0); /* the refused claim holds nothing */
        CHECK_EQ(pl_unlock(h1), 0);
    }
    pl_close(h1);
    pl_close(h2);
    pl_close(h3);
}

/* ---- errors ----------------------------------------------------------- */

static void test_errors(void)
{
    char path[4 * MAX_PATH];
    wchar_t wpath[MAX_PATH];
    pl_handle h, h2;
    pl_file_info st;
    int created, rc;
    DWORD attrs;

    section("errors: missing directory, directory, device, bad names");
    path_in(path, sizeof path, "no-such-dir\\x.lock");
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h, &created), ENOENT);
    CHECK_EQ(pl_open(g_dir, PL_OPEN_CREATE, -1, &h, &created), EISDIR);
    CHECK_EQ(pl_open(g_dir, 0, -1, &h, &created), EISDIR);
    CHECK_EQ(pl_open("NUL", PL_OPEN_CREATE, -1, &h, &created), PL_E_NOTREG);
    CHECK_EQ(pl_open("", PL_OPEN_CREATE, -1, &h, &created), ENOENT);
    path_in(path, sizeof path, "bad\xff\xfe.lock");
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h, &created), EILSEQ);
    path_in(path, sizeof path, "a<b.lock");
    rc = pl_open(path, PL_OPEN_CREATE, -1, &h, &created);
    check(rc == EINVAL || rc == ENOENT, "invalid name refused", __LINE__, "rc %d", rc);

    section("UTF-8 names, lone surrogates (Python's surrogatepass) included");
    path_in(path, sizeof path, "caf\xc3\xa9-\xe2\x9c\x93.lock");
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h, &created), 0);
    CHECK_EQ(created, 1);
    pl_close(h);
    wpath_in(wpath, MAX_PATH, L"caf\x00e9-\x2713.lock");
    CHECK(GetFileAttributesW(wpath) != INVALID_FILE_ATTRIBUTES);
    path_in(path, sizeof path, "lone-\xed\xa0\x80.lock");
    rc = pl_open(path, PL_OPEN_CREATE, -1, &h, &created);
    if (rc == 0) {
        pl_close(h);
        wpath_in(wpath, MAX_PATH, L"lone-\xd800.lock");
        CHECK(GetFileAttributesW(wpath) != INVALID_FILE_ATTRIBUTES);
    } else {
        /* Wine stores names as UTF-8 on the host, which cannot hold a
         * lone surrogate; Windows can. */
        check(rc == EINVAL || rc == ENOENT || rc == EILSEQ, "lone surrogate", __LINE__, "rc %d", rc);
        printf("   (this file system cannot store a lone surrogate: rc %d)\n", rc);
    }

    section("create_mode without owner write makes a read-only file");
    path_in(path, sizeof path, "readonly.lock");
    wpath_in(wpath, MAX_PATH, L"readonly.lock");
    CHECK_EQ(pl_open(path, PL_OPEN_CREATE, 0444, &h, &created), 0);
    CHECK_EQ(created, 1);
    attrs = GetFileAttributesW(wpath);
    CHECK(attrs != INVALID_FILE_ATTRIBUTES && (attrs & FILE_ATTRIBUTE_READONLY));
    rc = pl_open(path, PL_OPEN_CREATE, -1, &h2, &created);
    if (rc == 0 && is_wine()) {
        /* Wine keeps the attribute as Unix mode bits, which root ignores. */
        pl_close(h2);
        skip("read-only file opened for writing: Wine running as root");
    } else {
        CHECK_EQ(rc, EACCES);
    }
    CHECK_EQ(pl_open(path, PL_OPEN_READONLY, -1, &h2, &created), 0);
    CHECK_EQ(pl_try_lock(h2, 0), 0);
    CHECK_EQ(pl_try_lock(h, 0), PY_EWOULDBLOCK);
    pl_close(h2);
    pl_close(h);
    SetFileAttributesW(wpath, FILE_ATTRIBUTE_NORMAL);

    section("paths longer than MAX_PATH");
    {
        wchar_t deep[1024];
        char udeep[4096];
        swprintf(deep, 1024, L"\\\\?\\%ls", g_wdir);
        for (int i = 0; i < 6; i++) {
            wcscat(deep, L"\\abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
            CreateDirectoryW(deep, NULL);
        }
        utf8_of(deep + 4, udeep, sizeof udeep);
        strcat(udeep, "\\deep.lock");
        CHECK(strlen(udeep) > MAX_PATH);
        rc = pl_open(udeep, PL_OPEN_CREATE, -1, &h, &created);
        CHECK_EQ(rc, 0);
        if (rc == 0) {
            CHECK_EQ(created, 1);
            CHECK_EQ(pl_try_lock(h, 0), 0);
            CHECK_EQ(pl_open(udeep, 0, -1, &h2, &created), 0);
            CHECK_EQ(pl_try_lock(h2, 0), PY_EWOULDBLOCK);
            pl_close(h2);
            pl_close(h);
        }
    }

    section("symbolic links are refused");
    {
        wchar_t target[MAX_PATH], link[MAX_PATH];
        wpath_in(target, MAX_PATH, L"target.lock");
        wpath_in(link, MAX_PATH, L"link.lock");
        path_in(path, sizeof path, "target.lock");
        h = open_ok(path, PL_OPEN_CREATE);
        pl_close(h);
        if (CreateSymbolicLinkW(link, target, 0x2 /* ALLOW_UNPRIVILEGED_CREATE */) &&
            (attrs = GetFileAttributesW(link)) != INVALID_FILE_ATTRIBUTES &&
            (attrs & FILE_ATTRIBUTE_REPARSE_POINT)) {
            path_in(path, sizeof path, "link.lock");
            CHECK_EQ(pl_open(path, PL_OPEN_CREATE, -1, &h, &created), PL_E_SYMLINK);
            CHECK_EQ(pl_open(path, 0, -1, &h, &created), PL_E_SYMLINK);
        } else {
            printf("   SKIP: no symbolic links here (CreateSymbolicLinkW: error %lu); "
                   "Wine 8 has no reparse points\n",
                   GetLastError());
        }
    }

    section("a deleted lock file reports no links");
    path_in(path, sizeof path, "deleted.lock");
    wpath_in(wpath, MAX_PATH, L"deleted.lock");
    h = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_try_lock(h, 0), 0);
    CHECK(DeleteFileW(wpath));
    CHECK_EQ(pl_file_stat(h, &st), 0);
    {
        FILE_STANDARD_INFO si;
        CHECK(GetFileInformationByHandleEx((HANDLE)(intptr_t)h, FileStandardInfo, &si, sizeof si));
        if (si.DeletePending)
            CHECK_EQ(st.nlink, 0);
        else
            skip("this platform does not report the pending delete (Wine)");
    }
    rc = pl_open(path, PL_OPEN_CREATE, -1, &h2, &created);
    if (rc == EAGAIN) {
        printf("   classic delete: the name is unusable until the last handle closes (EAGAIN)\n");
    } else if (rc == 0 && created == 1) {
        printf("   POSIX delete: the name is free at once, a new file\n");
        CHECK_EQ(pl_try_lock(h2, 0), 0); /* a different file, a different lock */
        pl_close(h2);
    } else if (rc == 0 && is_wine()) {
        printf("   Wine: the name keeps naming the deleted file until it is closed\n");
        CHECK_EQ(pl_file_stat(h2, &st), 0);
        pl_close(h2);
    } else {
        check(0, "open after delete", __LINE__, "rc %d created %d", rc, created);
    }
    pl_close(h);
}

static void test_fs_stat(void)
{
    char path[4 * MAX_PATH];
    pl_fs_info fs;
    pl_handle h;

    section("file system of the lock file");
    path_in(path, sizeof path, "fs.lock");
    h = open_ok(path, PL_OPEN_CREATE);
    CHECK_EQ(pl_fs_stat(h, &fs), 0);
    CHECK(fs.name[0] != 0);
    CHECK_EQ(fs.remote, 0);
    CHECK_EQ(fs.magic, 0);
    printf("   name %s, remote %d\n", fs.name, fs.remote);
    pl_close(h);
}

/* ---- process tests ---------------------------------------------------- */

static uint64_t creation_of(HANDLE p)
{
    FILETIME c, e, k, u;
    if (!GetProcessTimes(p, &c, &e, &k, &u))
        return 0;
    return ((uint64_t)c.dwHighDateTime << 32) | c.dwLowDateTime;
}

static void test_self_identity(void)
{
    pl_identity a, b;
    pl_handle h;

    section("identity of this process");
    CHECK_EQ(pl_identity_of(GetCurrentProcessId(), &a), 0);
    CHECK_EQ(a.pid, GetCurrentProcessId());
    CHECK(a.start_time != 0 && a.start_time == creation_of(GetCurrentProcess()));
    CHECK_EQ(a.pidfs_ino, 0);
    CHECK(a.boot_id[0] != 0);
    CHECK_EQ(pl_proc_open(GetCurrentProcessId(), &h), 0);
    CHECK_EQ(pl_proc_identity(h, GetCurrentProcessId(), &b), 0);
    CHECK(a.start_time == b.start_time && strcmp(a.boot_id, b.boot_id) == 0);
    /* The boot precedes every process of the boot. */
    CHECK(strtoull(a.boot_id, NULL, 10) > 0 && strtoull(a.boot_id, NULL, 10) <= a.start_time);
    CHECK_EQ(pl_proc_identity(h, GetCurrentProcessId() + 4, &b), EINVAL);
    pl_proc_close(h);
    printf("   boot_id %s, start_time %llu\n", a.boot_id, (unsigned long long)a.start_time);
    CHECK_EQ(pl_identity_of(0, &a), EINVAL);
    CHECK_EQ(pl_identity_of(-5, &a), EINVAL);
    CHECK_EQ(pl_proc_open(0, &h), EINVAL);
    CHECK_EQ(pl_proc_open(0x100000000LL, &h), EINVAL);
}

static void test_process_exit(void)
{
    HANDLE go = inheritable_event(), t;
    PROCESS_INFORMATION pi;
    pl_identity before, pinned, after;
    pl_handle h;
    pl_waiter *w;
    wait_job job;
    int exited = -1, code = -1, rc;
    int64_t fd;
    double go_ms;

    section("process exit: poll, timed and cancelled waits, wake, exit code");
    pi = spawn(L"exitwhen %lld 42", (long long)(intptr_t)go);
    CHECK_EQ(pl_proc_open(pi.dwProcessId, &h), 0);
    CHECK_EQ(pl_identity_of(pi.dwProcessId, &before), 0);
    CHECK_EQ(pl_proc_identity(h, pi.dwProcessId, &pinned), 0);
    CHECK(before.start_time == pinned.start_time && before.start_time == creation_of(pi.hProcess));
    CHECK_EQ(strcmp(before.boot_id, pinned.boot_id), 0);
    CHECK_EQ(pl_proc_poll(h, &exited), 0);
    CHECK_EQ(exited, 0);
    CHECK_EQ(pl_proc_returncode(h, pi.dwProcessId, &code), EAGAIN);
    w = pl_waiter_new();
    CHECK_EQ(pl_proc_wait(h, 200 * 1000000LL, w), PY_ETIMEDOUT);
    CHECK_EQ(pl_proc_wait(h, 0, w), PY_ETIMEDOUT);
    pl_waiter_cancel(w);
    CHECK_EQ(pl_proc_wait(h, -1, w), ECANCELED);
    pl_waiter_free(w);
    CHECK_EQ(pl_proc_event_fd(h, &fd), ENOSYS);

    memset(&job, 0, sizeof job);
    job.proc = 1;
    job.h = h;
    job.timeout_ns = -1;
    job.w = pl_waiter_new();
    t = start_wait(&job);
    CHECK_EQ(WaitForSingleObject(t, 200), WAIT_TIMEOUT);
    go_ms = now_ms();
    SetEvent(go);
    CHECK(join(t, &job));
    CHECK_EQ(job.rc, 0);
    wake_ms_proc = job.returned_ms - go_ms;
    pl_waiter_free(job.w);
    CHECK_EQ(pl_proc_poll(h, &exited), 0);
    CHECK_EQ(exited, 1);
    CHECK_EQ(pl_proc_returncode(h, pi.dwProcessId, &code), 0);
    CHECK_EQ(code, 42);
    CHECK_EQ(pl_proc_wait(h, 0, NULL), 0);
    /* Pinned: the identity is still there after the exit. */
    CHECK_EQ(pl_proc_identity(h, pi.dwProcessId, &after), 0);
    CHECK(after.start_time == before.start_time);
    CHECK_EQ(finish(&pi), 42);
    CHECK_EQ(pl_proc_close(h), 0);

    section("identity mismatch once the process is gone");
    /* An exited process is gone for identity purposes even while its
     * object lingers (Wine keeps it for about half a second). */
    rc = pl_identity_of(before.pid, &after);
    check(rc == ESRCH || (rc == 0 && after.start_time != before.start_time),
          "identity after exit is gone or another process's", __LINE__, "rc %d", rc);
    rc = pl_proc_open(before.pid, &h);
    if (rc == 0) {
        /* Pinned: either a newcomer with the id, or the dead one, exited. */
        CHECK_EQ(pl_proc_identity(h, before.pid, &after), 0);
        CHECK_EQ(pl_proc_poll(h, &exited), 0);
        CHECK(after.start_time != before.start_time || exited == 1);
        pl_proc_close(h);
    } else {
        CHECK_EQ(rc, ESRCH);
    }
    CloseHandle(go);

    section("a crash exit code comes back as its 32 bits");
    go = inheritable_event();
    SetEvent(go);
    pi = spawn(L"exitwhen %lld -1073741819", (long long)(intptr_t)go); /* 0xC0000005 */
    CHECK_EQ(pl_proc_open(pi.dwProcessId, &h), 0);
    CHECK_EQ(pl_proc_wait(h, (int64_t)HANG_MS * 1000000, NULL), 0);
    CHECK_EQ(pl_proc_returncode(h, pi.dwProcessId, &code), 0);
    CHECK_EQ((unsigned)code, 0xC0000005u);
    pl_proc_close(h);
    finish(&pi);
    CloseHandle(go);

    section("no SIGCHLD fallback on Windows");
    CHECK_EQ(pl_child_poll(pi.dwProcessId, &exited, &code), ENOSYS);
    {
        int heard = 0;
        CHECK_EQ(pl_sigchld_open(&fd, &heard), ENOSYS);
    }
    CHECK_EQ(pl_sigchld_drain(0), ENOSYS);
    CHECK_EQ(pl_procs_fingerprint(NULL, NULL), ENOSYS);
    CHECK_EQ(pl_procs_gone(NULL, NULL, 0, 0, 0, NULL), ENOSYS);
}

/* ---- main ------------------------------------------------------------- */

static void remove_tree(const wchar_t *dir)
{
    wchar_t pattern[1024], child[1024];
    WIN32_FIND_DATAW fd;
    HANDLE f;

    swprintf(pattern, 1024, L"%ls\\*", dir);
    f = FindFirstFileW(pattern, &fd);
    if (f != INVALID_HANDLE_VALUE) {
        do {
            if (wcscmp(fd.cFileName, L".") == 0 || wcscmp(fd.cFileName, L"..") == 0)
                continue;
            swprintf(child, 1024, L"%ls\\%ls", dir, fd.cFileName);
            if ((fd.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) &&
                !(fd.dwFileAttributes & FILE_ATTRIBUTE_REPARSE_POINT)) {
                remove_tree(child);
            } else {
                SetFileAttributesW(child, FILE_ATTRIBUTE_NORMAL);
                if (!DeleteFileW(child))
                    RemoveDirectoryW(child);
            }
        } while (FindNextFileW(f, &fd));
        FindClose(f);
    }
    RemoveDirectoryW(dir);
}

/* Lock files opened by name in a directory handle: found in the directory
 * that was opened, even after it was renamed and another took its name. */
static void test_open_at(void)
{
    char d[4 * MAX_PATH], file[4 * MAX_PATH], sub[4 * MAX_PATH];
    wchar_t wd[MAX_PATH], wmoved[MAX_PATH], wlock[MAX_PATH], wother[MAX_PATH];
    pl_handle dh = -1, h = -1, h2 = -1;
    int created = -1, rc;

    section("open_at: lock files by name in an opened directory");
    path_in(d, sizeof d, "at");
    path_in(file, sizeof file, "at-file");
    wpath_in(wd, MAX_PATH, L"at");
    wpath_in(wmoved, MAX_PATH, L"at-moved");
    CHECK(CreateDirectoryW(wd, NULL));
    CHECK_EQ(pl_open(file, PL_OPEN_CREATE, -1, &h, &created), 0);
    CHECK_EQ(pl_close(h), 0);
    CHECK_EQ(pl_open_dir(file, &dh), ENOTDIR);
    path_in(sub, sizeof sub, "at-missing");
    CHECK_EQ(pl_open_dir(sub, &dh), ENOENT);
    CHECK_EQ(pl_open_dir(d, &dh), 0);
    {
        pl_file_info di; /* what LockAt compares before each open */
        CHECK_EQ(pl_file_stat(dh, &di), 0);
        CHECK(di.ino != 0);
    }
    CHECK_EQ(pl_open_at(dh, "a\\b", PL_OPEN_CREATE, -1, &h, &created), EINVAL);
    CHECK_EQ(pl_open_at(dh, "a/b", PL_OPEN_CREATE, -1, &h, &created), EINVAL);
    CHECK_EQ(pl_open_at(dh, "a:stream", PL_OPEN_CREATE, -1, &h, &created), EINVAL);
    CHECK_EQ(pl_open_at(dh, "..", PL_OPEN_CREATE, -1, &h, &created), EINVAL);
    CHECK_EQ(pl_open_at(dh, "", PL_OPEN_CREATE, -1, &h, &created), EINVAL);
    CHECK_EQ(pl_open_at(dh, "a.lock", 0, -1, &h, &created), ENOENT);
    CHECK(MoveFileW(wd, wmoved));
    CHECK(CreateDirectoryW(wd, NULL)); /* another directory takes the name */
    wpath_in(wlock, MAX_PATH, L"at-moved\\a.lock");
    wpath_in(wother, MAX_PATH, L"at\\a.lock");
    rc = pl_open_at(dh, "a.lock", PL_OPEN_CREATE, -1, &h, &created);
    if (rc == EBADF && is_wine()) {
        /* Wine (8) fails an open relative to a directory handle whose
         * directory was renamed (it may have created the file in it
         * first); Windows opens in the directory.  Either way nothing
         * appears in the directory that took the old name. */
        printf("   (Wine refuses an open relative to a renamed directory: EBADF)\n");
        CHECK_EQ(pl_close(dh), 0);
        path_in(sub, sizeof sub, "at-moved");
        CHECK_EQ(pl_open_dir(sub, &dh), 0);
        rc = pl_open_at(dh, "a.lock", PL_OPEN_CREATE, -1, &h, &created);
    } else {
        CHECK_EQ(created, 1);
    }
    CHECK_EQ(rc, 0);
    CHECK(GetFileAttributesW(wlock) != INVALID_FILE_ATTRIBUTES);
    CHECK(GetFileAttributesW(wother) == INVALID_FILE_ATTRIBUTES);
    CHECK_EQ(pl_open_at(dh, "A.LOCK", 0, -1, &h2, &created), 0); /* as CreateFileW */
    CHECK_EQ(created, 0);
    CHECK_EQ(pl_try_lock(h, 0), 0);
    CHECK_EQ(pl_try_lock(h2, 0), PY_EWOULDBLOCK);
    CHECK_EQ(pl_close(h2), 0);
    CHECK_EQ(pl_close(h), 0);
    CHECK_EQ(pl_open_at(dh, "b.lock", PL_OPEN_CREATE, -1, &h, &created), 0);
    CHECK_EQ(created, 1);
    CHECK_EQ(pl_close(h), 0);
    wpath_in(wother, MAX_PATH, L"at-moved\\sub");
    CHECK(CreateDirectoryW(wother, NULL));
    CHECK_EQ(pl_open_at(dh, "sub", PL_OPEN_CREATE, -1, &h, &created), EISDIR);
    CHECK_EQ(pl_unix_at(dh, "s", 0, PL_UNIX_BIND, -1), ENOSYS);
    CHECK_EQ(pl_close(dh), 0);
}

int wmain(int argc, wchar_t **argv)
{
    wchar_t tmp[MAX_PATH], deep[1024];

    if (argc >= 3 && wcscmp(argv[1], L"child") == 0)
        return child_main(argc, argv);

    GetModuleFileNameW(NULL, g_exe, MAX_PATH);
    GetTempPathW(MAX_PATH, tmp);
    /* A non-ASCII directory name: every path crosses the UTF-8 boundary. */
    swprintf(g_wdir, MAX_PATH, L"%lspylock-t\x00e9st-%lu-%llu", tmp, GetCurrentProcessId(),
             (unsigned long long)GetTickCount64());
    if (!CreateDirectoryW(g_wdir, NULL)) {
        printf("cannot create %ls: %lu\n", g_wdir, GetLastError());
        return 2;
    }
    utf8_of(g_wdir, g_dir, sizeof g_dir);

    test_open_and_stat();
    test_open_at();
    test_exclusive_and_shared();
    test_second_process();
    test_record();
    probe_kernel_lock_wait();
    test_wait_woken_by_exit();
    test_timeout_and_cancel();
    test_cancel_grant_race();
    test_not_inherited();
    test_acquire_and_claim();
    test_errors();
    test_fs_stat();
    test_self_identity();
    test_process_exit();

    printf("timing: process wait woken %.1f ms after the holder was told to exit\n",
           wake_ms_proc);
    if (g_kernel_lock_wait)
        printf("timing: lock wait woken %.1f ms after the holder was told to exit; "
               "a 300 ms timed wait took %.1f ms\n",
               wake_ms_lock, timed_wait_ms);
    swprintf(deep, 1024, L"\\\\?\\%ls", g_wdir);
    remove_tree(deep);
    printf("%d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
