/* SPDX-License-Identifier: MIT */
/*
 * The trace-driven cache simulator (mp_prefetch_simulate(), public in
 * <moepager/prefetch.h>): replays a routing trace against a budget of
 * experts with a prefetch and an eviction policy on a simple time model.
 */
#ifndef MP_PREFETCH_SIM_H
#define MP_PREFETCH_SIM_H

#include <moepager/prefetch.h>

#endif /* MP_PREFETCH_SIM_H */
