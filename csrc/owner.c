/*
 * pylock's C core, every platform: which attempt owns a Lock object.
 *
 * A Lock object is used by one acquisition at a time (a thread, a task, or
 * a pylock thread finishing an abandoned wait).  Python cannot keep that
 * fact itself: an exception from a signal handler may land right after a
 * call returns, before the caller has stored what the call did.  So the
 * owner is a word here, taken and given back in single calls, named by a
 * token the caller holds before it calls: whatever interrupts it, the caller
 * gives back exactly what it owns.  Bit 0 of the word says someone waits.
 */
#include "pylock.h"

#include <errno.h>

#define WAITING ((uintptr_t)1)

#if defined(_MSC_VER)
#include <windows.h>

static uintptr_t load_word(uintptr_t *word)
{
    return (uintptr_t)InterlockedCompareExchangePointer((PVOID volatile *)word, NULL, NULL);
}

/* On failure *seen gets the word's value, as with __atomic_compare_exchange. */
static int swap_word(uintptr_t *word, uintptr_t *seen, uintptr_t want)
{
    uintptr_t was = (uintptr_t)InterlockedCompareExchangePointer(
        (PVOID volatile *)word, (PVOID)want, (PVOID)*seen);
    if (was == *seen)
        return 1;
    *seen = was;
    return 0;
}
#else
static uintptr_t load_word(uintptr_t *word)
{
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

static int swap_word(uintptr_t *word, uintptr_t *seen, uintptr_t want)
{
    return __atomic_compare_exchange_n(word, seen, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
#endif

PYLOCK_HOT int pl_own(pl_lockfile *lf, uintptr_t token, int waiting)
{
    uintptr_t seen;
    if (token == 0 || (token & WAITING))
        return EINVAL;
    seen = load_word(&lf->owner);
    for (;;) {
        if ((seen & ~WAITING) == token)
            return 0;
        if (seen == 0) {
            /* After a wait others may still wait: this owner wakes them. */
            if (swap_word(&lf->owner, &seen, waiting ? token | WAITING : token))
                return 0;
        } else if (!waiting || (seen & WAITING)) {
            return PL_E_BUSY;
        } else if (swap_word(&lf->owner, &seen, seen | WAITING)) {
            return PL_E_BUSY;
        }
    }
}

PYLOCK_HOT int pl_disown(pl_lockfile *lf, uintptr_t token, int unlock)
{
    uintptr_t seen = load_word(&lf->owner);
    if (token == 0 || (seen & ~WAITING) != token)
        return -1;
    /* Still the owner: nobody else uses the descriptor until the word is 0. */
    if (unlock && lf->handle >= 0)
        pl_release(lf); /* files the hold when metrics time it, unlocks */
    else
        lf->held_since = 0;
    while (!swap_word(&lf->owner, &seen, 0)) {
        /* Only a waiter's mark can have changed it meanwhile. */
    }
    return (seen & WAITING) ? 1 : 0;
}
