/* SPDX-License-Identifier: MIT */
/* The USDT probes of provider moepager: the one place that names them and their arguments. */
#ifndef MP_PROBES_H
#define MP_PROBES_H

#include <stdint.h>

/*
 * MP_PROBE(name, args...) fires moepager:name. docs/probes.md is the stable
 * interface: change a probe only by adding a new one.
 *
 * Each probe has a prototype below, called under `if (0)`: arguments are
 * checked against it (count, pointer types) whether or not probes are
 * compiled in, and never evaluated twice. With <sys/sdt.h> a probe site is
 * one nop until a tracer attaches; each argument is cast to its documented
 * type so the note's size and sign never depend on the caller's expression.
 *
 * tier numbers: 0 host-memory tier, 1 file tier, 2+ tiers stacked after them.
 */

/*
 * The router of layer chose ids[0..k) with gate weights (may be NULL) for
 * token of request: the generated-token index (decode step t is token t,
 * as moe-trace counts), or UINT32_MAX for a prompt token.
 */
static inline void mp_probe_args_route(uint32_t request, uint32_t token, uint32_t layer,
				       uint32_t k, const uint32_t *ids, const float *weights)
{
	(void)request; (void)token; (void)layer; (void)k; (void)ids; (void)weights;
}

/* A batched prompt pass of request over sequence positions first..first+n-1 begins. */
static inline void mp_probe_args_prefill(uint32_t request, uint32_t first, uint32_t n)
{
	(void)request; (void)first; (void)n;
}

/* The pager starts serving a fault on (layer, expert) from tier; addr is the faulting address. */
static inline void mp_probe_args_fault_begin(uint32_t layer, uint32_t expert, uint32_t tier,
					     uint64_t addr)
{
	(void)layer; (void)expert; (void)tier; (void)addr;
}

/* ... and is done after latency_ns, err 0 or a negative errno (the range was poisoned). */
static inline void mp_probe_args_fault_done(uint32_t layer, uint32_t expert, uint32_t tier,
					    uint64_t latency_ns, int32_t err)
{
	(void)layer; (void)expert; (void)tier; (void)latency_ns; (void)err;
}

/* A prefetch of (layer, expert) from tier was queued. */
static inline void mp_probe_args_prefetch_issue(uint32_t layer, uint32_t expert, uint32_t tier)
{
	(void)layer; (void)expert; (void)tier;
}

/* ... and completed latency_ns after it was issued, err 0 or a negative errno. */
static inline void mp_probe_args_prefetch_done(uint32_t layer, uint32_t expert, uint32_t tier,
					       uint64_t latency_ns, int32_t err)
{
	(void)layer; (void)expert; (void)tier; (void)latency_ns; (void)err;
}

/* (layer, expert) left the range; bytes freed (0: unmapped but kept in the host tier). */
static inline void mp_probe_args_evict(uint32_t layer, uint32_t expert, uint64_t bytes)
{
	(void)layer; (void)expert; (void)bytes;
}

/*
 * A pager opened the expert range of a model: id (unique in the process,
 * from 1), base address, slot stride, slots per layer, layers and experts
 * per layer. Slot s = (address - base) / slot_bytes holds layer
 * s / slots_per_layer, expert s % slots_per_layer.
 */
static inline void mp_probe_args_region(uint64_t id, uint64_t base, uint64_t slot_bytes,
					uint32_t slots_per_layer, uint32_t layers, uint32_t experts)
{
	(void)id; (void)base; (void)slot_bytes; (void)slots_per_layer; (void)layers; (void)experts;
}

/* ... and closes it: faults at base are no longer the pager's. */
static inline void mp_probe_args_region_close(uint64_t id, uint64_t base)
{
	(void)id; (void)base;
}

#ifdef MP_HAVE_USDT
#include <sys/sdt.h>

#define MP_PROBE_EMIT_route(request, token, layer, k, ids, weights)			\
	STAP_PROBE6(moepager, route, (uint32_t)(request), (uint32_t)(token),		\
		    (uint32_t)(layer), (uint32_t)(k), (const uint32_t *)(ids),		\
		    (const float *)(weights))
#define MP_PROBE_EMIT_prefill(request, first, n)					\
	STAP_PROBE3(moepager, prefill, (uint32_t)(request), (uint32_t)(first), (uint32_t)(n))
#define MP_PROBE_EMIT_fault_begin(layer, expert, tier, addr)				\
	STAP_PROBE4(moepager, fault_begin, (uint32_t)(layer), (uint32_t)(expert),	\
		    (uint32_t)(tier), (uint64_t)(addr))
#define MP_PROBE_EMIT_fault_done(layer, expert, tier, latency_ns, err)			\
	STAP_PROBE5(moepager, fault_done, (uint32_t)(layer), (uint32_t)(expert),	\
		    (uint32_t)(tier), (uint64_t)(latency_ns), (int32_t)(err))
#define MP_PROBE_EMIT_prefetch_issue(layer, expert, tier)				\
	STAP_PROBE3(moepager, prefetch_issue, (uint32_t)(layer), (uint32_t)(expert),	\
		    (uint32_t)(tier))
#define MP_PROBE_EMIT_prefetch_done(layer, expert, tier, latency_ns, err)		\
	STAP_PROBE5(moepager, prefetch_done, (uint32_t)(layer), (uint32_t)(expert),	\
		    (uint32_t)(tier), (uint64_t)(latency_ns), (int32_t)(err))
#define MP_PROBE_EMIT_evict(layer, expert, bytes)					\
	STAP_PROBE3(moepager, evict, (uint32_t)(layer), (uint32_t)(expert), (uint64_t)(bytes))
#define MP_PROBE_EMIT_region(id, base, slot_bytes, slots_per_layer, layers, experts)	\
	STAP_PROBE6(moepager, region, (uint64_t)(id), (uint64_t)(base),		\
		    (uint64_t)(slot_bytes), (uint32_t)(slots_per_layer), (uint32_t)(layers),	\
		    (uint32_t)(experts))
#define MP_PROBE_EMIT_region_close(id, base)						\
	STAP_PROBE2(moepager, region_close, (uint64_t)(id), (uint64_t)(base))

/* True when this build carries the probes (tests check it rather than guess). */
#define MP_PROBES_ENABLED 1
#else
#define MP_PROBE_EMIT_route(...)		((void)0)
#define MP_PROBE_EMIT_prefill(...)		((void)0)
#define MP_PROBE_EMIT_fault_begin(...)		((void)0)
#define MP_PROBE_EMIT_fault_done(...)		((void)0)
#define MP_PROBE_EMIT_prefetch_issue(...)	((void)0)
#define MP_PROBE_EMIT_prefetch_done(...)	((void)0)
#define MP_PROBE_EMIT_evict(...)		((void)0)
#define MP_PROBE_EMIT_region(...)		((void)0)
#define MP_PROBE_EMIT_region_close(...)		((void)0)
#define MP_PROBES_ENABLED 0
#endif

#define MP_PROBE(name, ...)						\
	do {								\
		if (0)							\
			mp_probe_args_##name(__VA_ARGS__);		\
		MP_PROBE_EMIT_##name(__VA_ARGS__);			\
	} while (0)

#endif /* MP_PROBES_H */
