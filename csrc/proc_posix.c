/*
 * pylock's C core, processes on Linux and macOS: what both do alike.
 * Reading a child's exit without reaping it is the fallback's ground
 * truth, so it lives once here.
 */
#if !defined(_WIN32)

#include "pl_proc_internal.h"
#include "pylock_proc.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>

int pl__valid_pid(int64_t pid)
{
    return pid > 0 && pid <= INT_MAX;
}

int pl__child_status(idtype_t idtype, id_t id, int *exited, int *returncode)
{
    siginfo_t si;
    int r;

    do {
        memset(&si, 0, sizeof si);
        r = waitid(idtype, id, &si, WEXITED | WNOHANG | WNOWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return errno;
    /* WNOHANG with nothing to report leaves si_pid 0 (zeroed above). */
    *exited = si.si_pid != 0;
    if (*exited)
        *returncode = si.si_code == CLD_EXITED ? si.si_status : -si.si_status;
    return 0;
}

int pl_child_poll(int64_t pid, int *exited, int *returncode)
{
    if (!pl__valid_pid(pid))
        return EINVAL;
    *exited = 0;
    *returncode = 0;
    return pl__child_status(P_PID, (id_t)pid, exited, returncode);
}

#endif /* !_WIN32 */
