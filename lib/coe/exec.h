/* SPDX-License-Identifier: MIT */
/* An executor's engine and runners, and whole-model loads through the pager (exec.c). */
#ifndef MP_COE_EXEC_H
#define MP_COE_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "coe/coe_priv.h"

struct coe_exec;

/* An engine of `threads` and a runner per architecture with max_batch sequences. */
int coe_exec_open(struct mp_coe *c, struct mp_pager *p, const char *engine, uint32_t threads,
		  uint32_t max_batch, uint32_t tokens, struct coe_exec **out);
void coe_exec_close(struct coe_exec *ex);
/*
 * Runs model on n requests (their ids pick their input tokens) as one batch;
 * out[i] gets request i's output (the argmax of its last logits).
 */
int coe_exec_run(struct coe_exec *ex, uint32_t model, const uint64_t *ids, uint32_t n,
		 uint32_t *out);
/* Memory one batch item of arch holds (KV cache, activations). */
uint64_t coe_exec_item_bytes(const struct coe_exec *ex, uint32_t arch);

/* Starts reading every slot of model: as demand (all at once) or as prefetches. */
int coe_model_load(struct mp_coe *c, struct mp_pager *p, uint32_t model, bool demand);
/* Touches every slot under the pager's guard: returns once the whole model is in. */
int coe_model_touch(struct mp_coe *c, struct mp_pager *p, uint32_t model);
/*
 * Writes the model's weights out of the CPU caches (x86; elsewhere a no-op),
 * as they are when it has just been loaded or other models ran since.
 */
int coe_model_flush(struct mp_coe *c, struct mp_pager *p, uint32_t model);
/* Whether the model sits in host memory, unmapped (its load is a host-tier one). */
bool coe_model_host(struct mp_coe *c, struct mp_pager *p, uint32_t model);
/* Evicts every slot of model; returns how many the pager refused as busy. */
uint32_t coe_model_evict(struct mp_coe *c, struct mp_pager *p, uint32_t model, bool keep_host);

#endif /* MP_COE_EXEC_H */
