/*
 * pylock's C core on Windows, processes.
 *
 * A process HANDLE pins the process: Windows does not reuse a process id
 * while any handle to the process is open, and the handle stays valid (and
 * signalled) after the process exits.  Identity is the process id plus its
 * creation time (a FILETIME, unique per process and across boots), and
 * exit is waited for on the handle itself, so there is no descriptor for an
 * event loop (pl_proc_event_fd) and no SIGCHLD fallback: both are ENOSYS
 * here, by design.
 *
 * boot_id is the kernel's boot time in 100 ns units since 1601 (like
 * start_time), as a decimal string.  SystemTimeOfDayInformation gives the
 * boot time (which the kernel moves whenever the clock is stepped) and the
 * sum of those steps; their difference is the boot time as first set: the
 * same for every process, for the whole boot, whatever happens to the
 * clock.  Python treats another boot_id as another boot, so it must not
 * move while the system runs.
 */
#include "pl_win_internal.h"
#include "pylock_proc.h"

#ifdef _WIN32

#include <stdio.h>

static int valid_pid(int64_t pid)
{
    return pid > 0 && pid <= 0xFFFFFFFFLL;
}

/* OpenProcess says ERROR_INVALID_PARAMETER for a process id nobody has. */
static int open_error(DWORD err)
{
    if (err == ERROR_INVALID_PARAMETER)
        return ESRCH;
    if (err == ERROR_ACCESS_DENIED)
        return EPERM; /* it exists, but is not ours to open */
    return pl_win_errno(err);
}

typedef struct {
    LARGE_INTEGER boot_time;
    LARGE_INTEGER current_time;
    LARGE_INTEGER time_zone_bias;
    ULONG time_zone_id;
    ULONG reserved;
    ULONGLONG boot_time_bias;
    ULONGLONG sleep_time_bias;
} pl_timeofday_info;

typedef LONG(WINAPI *pl_query_system_information_fn)(ULONG, PVOID, ULONG, PULONG);

static uint64_t boot_time(void)
{
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    pl_query_system_information_fn query =
        ntdll ? (pl_query_system_information_fn)(void (*)(void))GetProcAddress(
                    ntdll, "NtQuerySystemInformation")
              : NULL;
    pl_timeofday_info info;
    uint64_t prev = 0, now;
    FILETIME ft;
    ULARGE_INTEGER t;

    /* The two fields are read without a lock: a clock step in between
     * would tear them, so read until two answers agree. */
    for (int i = 0; query != NULL && i < 4; i++) {
        memset(&info, 0, sizeof info);
        if (query(3 /* SystemTimeOfDayInformation */, &info, sizeof info, NULL) < 0 ||
            info.boot_time.QuadPart <= 0)
            break;
        now = (uint64_t)info.boot_time.QuadPart - info.boot_time_bias;
        if (i > 0 && now == prev)
            return now;
        prev = now;
    }
    /* Without it, derive it from the uptime, to the second so that
     * processes reading at different moments agree. */
    GetSystemTimeAsFileTime(&ft);
    t.LowPart = ft.dwLowDateTime;
    t.HighPart = ft.dwHighDateTime;
    return (t.QuadPart - GetTickCount64() * 10000ULL) / 10000000ULL * 10000000ULL;
}

static int identity_of_handle(HANDLE h, int64_t pid, pl_identity *out)
{
    FILETIME created, exited, kernel, user;

    if (!GetProcessTimes(h, &created, &exited, &kernel, &user))
        return pl_win_errno(GetLastError());
    memset(out, 0, sizeof *out);
    out->pid = pid;
    out->start_time = ((uint64_t)created.dwHighDateTime << 32) | created.dwLowDateTime;
    out->pidfs_ino = 0;
    snprintf(out->boot_id, sizeof out->boot_id, "%llu", (unsigned long long)boot_time());
    return 0;
}

/* A process that has exited but whose object someone still holds open is
 * gone for identity purposes, as a zombie is on Linux. */
static int has_exited(HANDLE h, int can_wait)
{
    DWORD code;
    if (can_wait)
        return WaitForSingleObject(h, 0) == WAIT_OBJECT_0;
    /* Without SYNCHRONIZE: only a process that exited with 259 itself
     * would be taken for a running one. */
    return GetExitCodeProcess(h, &code) && code != STILL_ACTIVE;
}

int pl_identity_of(int64_t pid, pl_identity *out)
{
    HANDLE h;
    int rc, can_wait = 1;

    if (!valid_pid(pid))
        return EINVAL;
    h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION | SYNCHRONIZE, FALSE, (DWORD)pid);
    if (h == NULL && GetLastError() == ERROR_ACCESS_DENIED) {
        can_wait = 0;
        h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, (DWORD)pid);
    }
    if (h == NULL)
        return open_error(GetLastError());
    rc = identity_of_handle(h, pid, out);
    if (rc == 0 && has_exited(h, can_wait))
        rc = ESRCH;
    CloseHandle(h);
    return rc;
}

int pl_proc_open(int64_t pid, pl_handle *out)
{
    HANDLE h;

    if (!valid_pid(pid))
        return EINVAL;
    h = OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, FALSE, (DWORD)pid);
    if (h == NULL)
        return open_error(GetLastError());
    *out = (pl_handle)(intptr_t)h;
    return 0;
}

int pl_proc_close(pl_handle h)
{
    return CloseHandle(as_handle(h)) ? 0 : pl_win_errno(GetLastError());
}

/* The pinned process cannot be reaped away under the handle, so this
 * answers even after it exited. */
int pl_proc_identity(pl_handle h, int64_t pid, pl_identity *out)
{
    DWORD actual;

    if (!valid_pid(pid))
        return EINVAL;
    actual = GetProcessId(as_handle(h));
    if (actual == 0)
        return pl_win_errno(GetLastError());
    if ((int64_t)actual != pid)
        return EINVAL; /* the handle pins some other process */
    return identity_of_handle(as_handle(h), pid, out);
}

int pl_proc_poll(pl_handle h, int *exited)
{
    DWORD r = WaitForSingleObject(as_handle(h), 0);
    if (r == WAIT_OBJECT_0) {
        *exited = 1;
        return 0;
    }
    if (r == WAIT_TIMEOUT) {
        *exited = 0;
        return 0;
    }
    return pl_win_errno(GetLastError());
}

int pl_proc_wait(pl_handle h, int64_t timeout_ns, pl_waiter *w)
{
    return pl_win_wait(as_handle(h), pl_win_cancel_event(w), timeout_ns);
}

/* The exit code as GetExitCodeProcess gives it.  Exit codes are 32-bit
 * unsigned on Windows (an NTSTATUS like 0xC0000005 for a crash); they come
 * back as the same 32 bits in an int, so Python gets Popen's value back
 * with rc & 0xFFFFFFFF.  EAGAIN while the process is still running. */
int pl_proc_returncode(pl_handle h, int64_t pid, int *returncode)
{
    DWORD code;
    int exited, rc;

    if (!valid_pid(pid))
        return EINVAL;
    if ((rc = pl_proc_poll(h, &exited)) != 0)
        return rc;
    if (!exited)
        return EAGAIN;
    if (!GetExitCodeProcess(as_handle(h), &code))
        return pl_win_errno(GetLastError());
    *returncode = (int)code;
    return 0;
}

int pl_proc_event_fd(pl_handle h, int64_t *fd)
{
    (void)h;
    (void)fd;
    return ENOSYS;
}

int pl_proc_signal(pl_handle h, int signum)
{
    (void)h;
    (void)signum;
    return ENOSYS;
}

int pl_child_poll(int64_t pid, int *exited, int *returncode)
{
    (void)pid;
    (void)exited;
    (void)returncode;
    return ENOSYS;
}

int pl_sigchld_open(int64_t *fd, int *heard)
{
    (void)fd;
    (void)heard;
    return ENOSYS;
}

int pl_sigchld_drain(int64_t fd)
{
    (void)fd;
    return ENOSYS;
}

/* Windows always pins with a process handle: the fallback's identity
 * checks have no use there. */
int pl_procs_fingerprint(uint64_t *tasks, int64_t *last_pid)
{
    (void)tasks;
    (void)last_pid;
    return ENOSYS;
}

int pl_procs_gone(const int64_t *pids, const uint64_t *start_times, int64_t n,
                  int64_t exact_after, int64_t exact_upto, uint8_t *gone)
{
    (void)pids;
    (void)start_times;
    (void)n;
    (void)exact_after;
    (void)exact_upto;
    (void)gone;
    return ENOSYS;
}

#endif /* _WIN32 */
