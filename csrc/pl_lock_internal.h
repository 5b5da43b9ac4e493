/*
 * Between pylock's lock-file sources (claim.c, holds.c, lock_posix.c); not
 * part of the API in pylock.h.
 */
#ifndef PYLOCK_LOCK_INTERNAL_H
#define PYLOCK_LOCK_INTERNAL_H

#include "pylock.h"

/* Whether path (not followed) names the file st describes; *size gets the
 * file's size from the same lookup. */
int pl__same_file_at(const char *path, const pl_file_info *st, uint64_t *size);

/* CLOCK_MONOTONIC (the performance counter on Windows) in ns. */
int64_t pl__monotonic_ns(void);

#endif
