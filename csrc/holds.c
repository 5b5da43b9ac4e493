/*
 * pylock's C core, every platform: timing holds for pylock.metrics.  While
 * metrics are on, pl_claim stamps the hold's start and pl_release files its
 * length, so an uncontended acquire + release pays two clock readings and
 * two atomic adds and no Python.
 */
#include "pl_lock_internal.h"
#include "pylock.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <time.h>
#endif
#if defined(_MSC_VER)
#include <intrin.h>
#endif

int64_t pl__monotonic_ns(void)
{
#if defined(_WIN32)
    static LARGE_INTEGER freq; /* fixed at boot; a racing first read stores the same */
    LARGE_INTEGER c;
    if (freq.QuadPart == 0)
        QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&c);
    return (c.QuadPart / freq.QuadPart) * 1000000000LL +
           (c.QuadPart % freq.QuadPart) * 1000000000LL / freq.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#endif
}

/* Several Lock objects (threads) may share one pl_hold_stats, and the core
 * runs without the GIL. */
static void add(uint64_t *counter, uint64_t n)
{
#if defined(_MSC_VER)
    _InterlockedExchangeAdd64((volatile __int64 *)counter, (__int64)n);
#else
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
#endif
}

/* The b with 2**(b-1) <= d < 2**b (0 for 0), as Python's int.bit_length. */
static unsigned bit_length(uint64_t d)
{
#if defined(_MSC_VER)
    unsigned long top;
    return _BitScanReverse64(&top, d) ? (unsigned)top + 1 : 0;
#else
    return d ? 64u - (unsigned)__builtin_clzll(d) : 0;
#endif
}

PYLOCK_HOT int pl_release(pl_lockfile *lf)
{
    pl_hold_stats *holds = lf->holds;
    int64_t since = lf->held_since;
    lf->held_since = 0;
    if (holds != NULL && since != 0) {
        int64_t held = pl__monotonic_ns() - since;
        if (held >= 0) {
            add(&holds->held_ns, (uint64_t)held);
            add(&holds->slots[bit_length((uint64_t)held)], 1);
        }
    }
    return pl_unlock(lf->handle);
}
