/*
 * Helpers shared by the POSIX process code (proc_linux.c, proc_macos.c,
 * proc_posix.c, sigchld_posix.c).  Not part of the cdef.
 */
#ifndef PYLOCK_PROC_INTERNAL_H
#define PYLOCK_PROC_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>

/* A pid the kernel could hand out (1 .. INT_MAX). */
int pl__valid_pid(int64_t pid);

/* waitid(WEXITED | WNOHANG | WNOWAIT) on one child: never reaps.  0 with
 * *exited set (and *returncode, Popen-style, when exited), or an errno
 * (ECHILD: not our child, or already reaped). */
int pl__child_status(idtype_t idtype, id_t id, int *exited, int *returncode);

/* Nonzero when no thread of this process can take SIGCHLD (every thread
 * blocks it): a handler would then never run.  Per platform. */
int pl__sigchld_blocked_everywhere(void);

#endif
