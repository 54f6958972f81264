/* SPDX-License-Identifier: MIT */
/* Eviction policies: a small vtable the pager calls, one file per policy. */
#ifndef MP_EVICT_H
#define MP_EVICT_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * Keys are the pager's slot numbers: key = layer * slots_per_layer + expert.
 * Every hook runs under the pager's lock, so a policy needs no locking of
 * its own and must not call back into the pager. A hook a policy does not
 * need may be NULL.
 */
/*
 * Hints a prefetcher or a trace replay gives the policies that want them
 * (finemoe reads p, belady next_use) and the prefetch admission check
 * (mp_evict_admit()). The driver owns the arrays (nkeys long) and writes
 * them from its own thread with __atomic stores; readers load them the same
 * way: a stale hint only changes one choice.
 */
struct mp_evict_hints {
	float *p;		/* probability of use from the last searched map, < 0: none */
	uint64_t *next_use;	/* position of the next (predicted) use, UINT64_MAX: unknown */
	uint64_t now;		/* the current position: next_use below it is stale */
	/*
	 * [layers], may be NULL: what losing one of the layer's experts costs,
	 * relative to the others. Above 1 for a layer no prefetch can bring
	 * back in time (its prediction comes less than a read's time before
	 * its use), so the policies that weigh it (ema, finemoe) keep that
	 * layer's experts over those a prefetch would bring back.
	 */
	float *miss_w;
};

struct mp_evict_env {
	uint32_t nkeys;
	uint32_t layers;
	uint32_t experts;		/* base experts per layer */
	uint32_t slots_per_layer;
	const struct mp_evict_hints *hints;	/* may be NULL (see prefetch/policy.h) */
};

/*
 * Whether a prefetch of `incoming` may evict `victim`: not when both have a
 * probability of use and the victim's is no lower, nor when the victim's
 * next use is known and comes no later than the incoming expert's (a
 * prefetch never evicts an expert more likely, or sooner, needed than the
 * one it brings).
 */
static inline bool mp_evict_admit(const struct mp_evict_hints *h, uint32_t incoming,
				   uint32_t victim)
{
	uint64_t now, vi, in;

	if (h && h->p) {
		float pi, pv;

		__atomic_load(&h->p[incoming], &pi, __ATOMIC_RELAXED);
		__atomic_load(&h->p[victim], &pv, __ATOMIC_RELAXED);
		if (pi >= 0 && pv >= 0 && !(pi > pv))
			return false;
	}
	if (!h || !h->next_use)
		return true;
	now = __atomic_load_n(&h->now, __ATOMIC_RELAXED);
	vi = __atomic_load_n(&h->next_use[victim], __ATOMIC_RELAXED);
	in = __atomic_load_n(&h->next_use[incoming], __ATOMIC_RELAXED);
	if (vi == UINT64_MAX || vi < now)
		return true;
	return in != UINT64_MAX && in >= now && vi > in;
}

/*
 * CoServe's two-stage victim choice (§4.3), shared by the MoE-expert policy
 * (coserve.c) and the CoE layer's model pool (lib/coe/): offer each
 * candidate that may go, then take the victim. Stage 1: the largest
 * candidate that cannot run (a subsequent one none of whose preliminaries
 * is resident); stage 2, when there is none: the lowest usage probability.
 * Ties go to the candidate offered first. Evicting victims one at a time
 * until the newcomer fits is the paper's sorted sweep through both stages.
 */
struct mp_two_stage {
	int64_t s1, s2;
	uint64_t s1_bytes;
	double s2_p;
};

static inline void mp_two_stage_init(struct mp_two_stage *t)
{
	*t = (struct mp_two_stage){ .s1 = -ENOENT, .s2 = -ENOENT };
}

static inline void mp_two_stage_offer(struct mp_two_stage *t, uint32_t key, uint64_t bytes,
				      double p, bool unrunnable)
{
	if (unrunnable && (t->s1 < 0 || bytes > t->s1_bytes)) {
		t->s1 = key;
		t->s1_bytes = bytes;
	}
	if (t->s2 < 0 || p < t->s2_p) {
		t->s2 = key;
		t->s2_p = p;
	}
}

/* The victim, or -ENOENT when nothing was offered. */
static inline int64_t mp_two_stage_victim(const struct mp_two_stage *t)
{
	return t->s1 >= 0 ? t->s1 : t->s2;
}

/* A routing decision as the engine reported it (mp_pager_route()). */
struct mp_evict_route {
	uint32_t request;
	uint32_t token;
	uint32_t layer;
	uint32_t k;
	const uint32_t *keys;		/* k keys */
	const float *weights;		/* k gate weights, or NULL */
};

struct mp_evict;

/* Answers whether a resident key may be evicted now (not being filled, mapped or used). */
typedef bool (*mp_evict_ok_fn)(void *arg, uint32_t key);

struct mp_evict_ops {
	const char *name;
	const char *description;
	/* Sets pol->priv. Returns 0 or -errno. */
	int (*init)(struct mp_evict *pol);
	/* The key's data entered host memory (a fill finished). */
	void (*on_insert)(struct mp_evict *pol, uint32_t key);
	/* A resident key was used: routed to, or looked up. */
	void (*on_access)(struct mp_evict *pol, uint32_t key);
	/* A thread faulted on the key (resident in the host tier, or not at all). */
	void (*on_fault)(struct mp_evict *pol, uint32_t key);
	/* The key's data left host memory. */
	void (*on_remove)(struct mp_evict *pol, uint32_t key);
	/* Every routing decision, before the engine reads the experts. */
	void (*on_route)(struct mp_evict *pol, const struct mp_evict_route *r);
	/*
	 * Chooses a resident key to evict among those evictable() accepts.
	 * Returns the key, or -ENOENT when none qualifies.
	 */
	int64_t (*pick_victim)(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg);
	void (*fini)(struct mp_evict *pol);
};

struct mp_evict {
	const struct mp_evict_ops *ops;
	struct mp_evict_env env;
	void *priv;
};

/* The miss weight of key's layer (hints->miss_w; 1 without one). */
static inline double mp_evict_miss_w(const struct mp_evict *pol, uint32_t key)
{
	const struct mp_evict_hints *h = pol->env.hints;
	uint32_t layer;
	float w;

	if (!h || !h->miss_w || !pol->env.slots_per_layer)
		return 1.0;
	layer = key / pol->env.slots_per_layer;
	if (layer >= pol->env.layers)
		return 1.0;
	__atomic_load(&h->miss_w[layer], &w, __ATOMIC_RELAXED);
	return w > 0 ? w : 1.0;
}

extern const struct mp_evict_ops mp_evict_lru;
extern const struct mp_evict_ops mp_evict_fifo;
extern const struct mp_evict_ops mp_evict_lfu;
extern const struct mp_evict_ops mp_evict_finemoe;
extern const struct mp_evict_ops mp_evict_coserve;
extern const struct mp_evict_ops mp_evict_belady;
extern const struct mp_evict_ops mp_evict_ema;

/* The policy called name ("lru", "fifo", ...), or NULL. */
const struct mp_evict_ops *mp_evict_find(const char *name);
/* Comma-separated names of the known policies, for messages. */
const char *mp_evict_names(void);

/* Creates pol with ops for env. Returns 0 or -errno. */
int mp_evict_init(struct mp_evict *pol, const struct mp_evict_ops *ops,
		   const struct mp_evict_env *env);
void mp_evict_fini(struct mp_evict *pol);

/*
 * An intrusive recency list over keys, shared by the list-based policies:
 * head is the most recent end, victims are searched from the tail.
 */
struct mp_keylist {
	uint32_t *prev;
	uint32_t *next;
	uint32_t head;
	uint32_t tail;
	uint32_t n;
	uint8_t *on;
};

#define MP_KEYLIST_NONE UINT32_MAX

int mp_keylist_init(struct mp_keylist *l, uint32_t nkeys);
void mp_keylist_fini(struct mp_keylist *l);
void mp_keylist_push_head(struct mp_keylist *l, uint32_t key);
void mp_keylist_remove(struct mp_keylist *l, uint32_t key);
/* The key nearest the tail that evictable() accepts, or -ENOENT. */
int64_t mp_keylist_victim(const struct mp_keylist *l, mp_evict_ok_fn evictable, void *arg);
/*
 * The key with the lowest score(pol, key) that evictable() accepts, equal
 * scores going to the one nearest the tail (the least recent), or -ENOENT.
 */
int64_t mp_keylist_min_victim(const struct mp_keylist *l,
			      double (*score)(const struct mp_evict *pol, uint32_t key),
			      const struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg);

/*
 * LRU's hooks over an mp_keylist in pol->priv, shared by the list-based
 * policies (lru, fifo, belady's recency fallback).
 */
int mp_evict_lru_init(struct mp_evict *pol);
void mp_evict_lru_insert(struct mp_evict *pol, uint32_t key);
void mp_evict_lru_access(struct mp_evict *pol, uint32_t key);
void mp_evict_lru_remove(struct mp_evict *pol, uint32_t key);
int64_t mp_evict_lru_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg);
void mp_evict_lru_fini(struct mp_evict *pol);

/*
 * LFU's state and hooks, shared by the policies that rank by use counts
 * (lfu, finemoe): counts survive eviction; resident keys keep a recency
 * list for ties.
 */
struct mp_lfu_state {
	struct mp_keylist recent;	/* resident keys, most recent at the head */
	uint64_t *freq;
};

int mp_evict_lfu_init(struct mp_evict *pol);
void mp_evict_lfu_insert(struct mp_evict *pol, uint32_t key);
void mp_evict_lfu_access(struct mp_evict *pol, uint32_t key);
void mp_evict_lfu_remove(struct mp_evict *pol, uint32_t key);
void mp_evict_lfu_fini(struct mp_evict *pol);

#endif /* MP_EVICT_H */
