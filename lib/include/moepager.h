/* SPDX-License-Identifier: MIT */
/*
 * moepager: paged expert weights for Mixture-of-Experts inference.
 *
 * The one header an engine includes. Each area has its own section header
 * under moepager/; all public names start with mp_ (or MP_ for macros).
 * Calls return 0 (or a count) on success and a negative errno on failure;
 * a failing call also logs one line through the handler installed with
 * mp_set_log_handler() and leaves that line in mp_last_error().
 */
#ifndef MOEPAGER_H
#define MOEPAGER_H

#include <moepager/mp_version.h>
#include <moepager/common.h>
#include <moepager/store.h>
#include <moepager/adapter.h>
#include <moepager/consolidate.h>
#include <moepager/trace.h>
#include <moepager/traj.h>
#include <moepager/engine.h>
#include <moepager/runner.h>
#include <moepager/tokenizer.h>
#include <moepager/eval.h>
#include <moepager/pager.h>
#include <moepager/image.h>
#include <moepager/share.h>
#include <moepager/prefetch.h>
#include <moepager/serve.h>
#include <moepager/adapters.h>
#include <moepager/multi.h>
#include <moepager/coe.h>

#endif /* MOEPAGER_H */
