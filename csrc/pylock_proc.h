/*
 * pylock's C core, processes: identity, pinning and exit notification.
 *
 * Same conventions as pylock.h: 0 or a positive errno value.  A "process
 * handle" pins one process so its pid cannot be recycled under us: a pidfd
 * on Linux, a kqueue with EVFILT_PROC/NOTE_EXIT registered on macOS, a
 * process HANDLE on Windows.  Pin first, verify identity after.
 */
#ifndef PYLOCK_PROC_H
#define PYLOCK_PROC_H

#include "pylock.h"

/* CDEF-BEGIN */
typedef struct {
    int64_t pid;
    uint64_t start_time; /* Linux: clock ticks since boot (stat field 22);
                            macOS: kernel start time in microseconds;
                            Windows: creation time (FILETIME) */
    uint64_t pidfs_ino;  /* Linux with pidfs (6.9+): unique per boot; else 0 */
    char boot_id[40];    /* this boot: Linux boot_id, else the boot time */
} pl_identity;

/* Identity of pid as the kernel shows it now: ESRCH when there is none.
 * Alone it is racy; pair it with pl_proc_open for a pinned answer. */
int pl_identity_of(int64_t pid, pl_identity *out);

/* Pin pid.  ESRCH: no such process.  ENOSYS, EPERM, EACCES: the mechanism
 * is unavailable here (old kernel, seccomp): use the fallback. */
int pl_proc_open(int64_t pid, pl_handle *out);
int pl_proc_close(pl_handle h);
/* Identity of the pinned process (ESRCH once it has been reaped). */
int pl_proc_identity(pl_handle h, int64_t pid, pl_identity *out);
/* *exited = 1 once the pinned process has exited (a zombie counts). */
int pl_proc_poll(pl_handle h, int *exited);
/* Block until the pinned process exits: 0, ETIMEDOUT, ECANCELED, EINTR. */
int pl_proc_wait(pl_handle h, int64_t timeout_ns, pl_waiter *w);
/* Returncode of the exited process, Popen-style (exit code, or -signal),
 * without reaping it: 0 with *returncode set, or ENODATA when the kernel
 * cannot tell (not our child and no PIDFD_INFO_EXIT). */
int pl_proc_returncode(pl_handle h, int64_t pid, int *returncode);
/* A descriptor an event loop can watch for readability (Linux: the pidfd,
 * macOS: the kqueue); ENOSYS on Windows, which waits on the handle. */
int pl_proc_event_fd(pl_handle h, int64_t *fd);
/* Send signum to exactly the pinned process (Linux: pidfd_send_signal):
 * 0, ESRCH once it has been reaped, ENOSYS where the kernel, or the
 * platform (macOS, Windows), cannot signal through a handle. */
int pl_proc_signal(pl_handle h, int signum);

/* Fallback where pinning is unavailable (Linux without pidfd). */
/* Has our child pid exited?  waitid(WNOWAIT): never reaps.  ECHILD when
 * pid is not our child. */
int pl_child_poll(int64_t pid, int *exited, int *returncode);
/* A descriptor that becomes readable when SIGCHLD arrives: a self-pipe fed
 * by pylock's handler, which chains to the previous one with its flags.
 * *heard = 0 when pylock's handler is not the one in place (the program
 * installed its own since) or no thread can take SIGCHLD: exits are then
 * only seen by the caller's periodic checks.  ECHILD when the kernel reaps
 * children itself (SIGCHLD ignored, SA_NOCLDWAIT).  Never consumes a
 * signal.  Drain the descriptor after each wakeup. */
int pl_sigchld_open(int64_t *fd, int *heard);
int pl_sigchld_drain(int64_t fd);
/* A fingerprint of task creation and release on this machine, equal
 * between two reads only if no task was created or reaped in between (as
 * far as this pid namespace shows; Linux).  ENOSYS elsewhere. */
int pl_procs_fingerprint(uint64_t *tasks, int64_t *last_pid);
/* For each of n processes: gone[i] = 1 when pids[i] no longer runs the
 * process that started at start_times[i] (0: any).  Pids in the range
 * (exact_after, exact_upto] (wrapping around when exact_after is the
 * larger; empty when equal) get the exact check: state and start time
 * (a zombie, a recycled pid).  The others are only asked whether they
 * exist at all (one cheap syscall; a zombie exists). */
int pl_procs_gone(const int64_t *pids, const uint64_t *start_times, int64_t n,
                  int64_t exact_after, int64_t exact_upto, uint8_t *gone);
/* CDEF-END */

#endif
