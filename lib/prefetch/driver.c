// SPDX-License-Identifier: MIT
/*
 * The prefetch driver: the engine's gate reports go through a bounded queue
 * (never blocking the engine; a full queue drops and counts) to a thread
 * that runs the prefetch policy and calls mp_pager_prefetch(); it also keeps
 * the hints the pager's eviction policy and prefetch admission read. A policy
 * whose ops say inline_gates (none) has no thread: its reports are handled
 * as they are published.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <moepager/store.h>
#include <moepager/trace.h>
#include <moepager/traj.h>
#include <moepager/source.h>
#include <moepager/pager.h>
#include <moepager/prefetch.h>

#include "base/base.h"
#include "pager/hooks.h"
#include "prefetch/policy.h"

#define DEFAULT_QUEUE 1024u
#define POLL_MS 50

struct pf_event {
	uint64_t step;		/* producer's iteration index */
	uint32_t request;
	uint32_t token;
	uint32_t layer;
	uint32_t k;
	uint64_t t_ns;		/* when the engine reported it */
	bool begin;		/* an iteration's start with its semantic vector, no gate */
	bool has_weights;
	bool has_probs;
	bool has_logits;	/* the ring's J floats are router logits: softmax on the thread */
	bool has_x;
	uint32_t ids[MP_TRAJ_MAX_K];
	float weights[MP_TRAJ_MAX_K];
};

/* A request's routed-id map (source op seq_map), while its sequence is open. */
struct pf_map {
	uint32_t request;
	const uint32_t *const *map;
};

/* What the thread keeps per request (beside its iter in the policy). */
struct pf_req {
	bool early;		/* its next iteration was begun before its first gate */
	uint64_t last_ns, last_step;
	uint32_t last_layer;
};

struct mp_prefetcher {
	struct mp_pager *pager;
	struct mp_prefetcher_config cfg;
	uint32_t L, J, K, spl, nkeys;
	char *emap_path;

	/* Producer side (engine threads), under plock for multiple producers. */
	pthread_mutex_t plock;
	uint64_t pstep;
	int64_t player;		/* layer of the last event, -1 for a begin */
	bool pstarted;

	/* The queue: single consumer; head written by producers, tail by the thread. */
	struct pf_event *ring;
	float *ring_probs;	/* [queue][J] */
	float *ring_x;		/* [queue][hidden], policies that take the layer input only */
	float *ring_sem;	/* [queue][sem.dim], with semantic vectors only */
	float *train_sem;	/* [sem.dim]: mp_prefetcher_train()'s vector */
	uint32_t hidden;
	/*
	 * [L][J][hidden]: each layer's router as f32, its columns scaled by
	 * the layer's FFN norm weights; what a layer's input divided by its
	 * own norm weights is multiplied with (speculate()).
	 */
	float *routers;
	float *norms;		/* [L][hidden] the FFN norm weights, NULL: none */
	float *xs;		/* [hidden] scratch: the layer input without its norm weights */
	float *spec;		/* [spec_rows][J] scratch: the speculative gates */
	float *miss_w;		/* [L] scratch: the hints' next miss weights */

	/* The source's stash between gate() and route() of one (request, token, layer). */
	float *pend_logits;	/* [J] */
	float *pend_x;		/* [hidden] */
	uint32_t pend_req, pend_tok, pend_layer;
	bool pend;
	uint32_t mask;
	_Atomic uint64_t head;
	_Atomic uint64_t tail;
	int efd;
	/*
	 * No thread: events are handled on the producer's thread as they are
	 * published, under plock, for a policy whose ops say inline_gates (none:
	 * ~1.5 us a gate by the policy clock, where waking a thread per gate
	 * cost the engine ~17 us on a 2-vCPU VM; docs/region.md, session 33).
	 */
	bool inline_events;
	/*
	 * The policy has no ops that read an iteration (no begin, gate or end,
	 * no layer_input: none): the source keeps neither the router's
	 * distribution nor the layer's input between gate() and route().
	 */
	bool ids_only;

	/* The thread and the policy (policy state only under lock). */
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	pthread_mutex_t lock;
	pthread_cond_t drained;
	struct mp_prefetch pf;
	bool pf_ok;
	uint64_t cur_step;	/* iteration the policy is in */
	struct pf_req *reqs;	/* [pf.niters]: the thread's own state of each request */

	/*
	 * Requests that read other rows than the router's ids (adapter rows):
	 * their maps, under lock; hint scratch for a layer's rows (spl each).
	 */
	struct pf_map *maps;
	uint32_t nmaps, cap_maps;
	/* mp_prefetcher_set_models(): the map of each model's requests (under lock). */
	const uint32_t *const *models[MP_PREFETCH_MAX_MODELS];
	uint32_t nmodels;
	bool one_store;		/* MP_PREFETCH_ONE_STORE */
	double *h_none;
	float *h_only;
	uint32_t *h_n;
	uint8_t *h_live;	/* with models: the row is an open request's (2) or a model's (1) */

	/* Position each queued prefetch was predicted for (nkeys), UINT64_MAX: none. */
	uint64_t *issued_pos;
	uint32_t *live;		/* the keys whose issued_pos is set, nlive of them */
	uint32_t nlive;
	uint64_t expired;

	/* Hints for the pager's eviction policy (nkeys each). */
	struct mp_evict_hints hints;
	bool hints_attached;
	bool truth;

	/* The replay order (oracle/belady). */
	struct mp_replay_seg *future;
	uint32_t nfuture;
	uint64_t nsteps;
	uint64_t *next_use_true;	/* [nsteps][L][K] */

	_Atomic uint64_t events, dropped, iterations, predicted, issued, policy_ns;
	_Atomic uint64_t row_predicted, row_issued;
	/* Hint rows taken from an iter whose request has no map while others have one. */
	_Atomic uint64_t hint_unmapped;

	/* Measuring pf.load_ratio: gaps between consecutive gates, reads from the pager. */
	float *gaps;		/* [L x requests] this step's */
	uint32_t ngaps;
	uint64_t meas_step;
	uint64_t reads0, read_ns0;
	double t_layer, t_load;	/* smoothed, ns */
};

static uint32_t key_of(const struct mp_prefetcher *d, uint32_t layer, uint32_t expert)
{
	return layer * d->spl + expert;
}

static void store_u64(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* Request's routed-id map, or NULL (called under lock). */
static const uint32_t *const *map_of(const struct mp_prefetcher *d, uint32_t request)
{
	for (uint32_t i = 0; i < d->nmaps; i++)
		if (d->maps[i].request == request)
			return d->maps[i].map;
	return NULL;
}

/*
 * The map an iter's predictions go through: its request's while open, then
 * (a request over, its hints still standing) its model's (called under lock).
 */
static const uint32_t *const *iter_map(const struct mp_prefetcher *d,
				       const struct mp_prefetch_iter *it)
{
	const uint32_t *const *m = d->nmaps ? map_of(d, it->request) : NULL;

	if (!m && it->model < d->nmodels)
		m = d->models[it->model];
	return m;
}

/* The model whose requests read through map m (0: none is). */
static uint32_t model_of(const struct mp_prefetcher *d, const uint32_t *const *m)
{
	for (uint32_t x = 0; m && x < d->nmodels; x++)
		if (d->models[x] == m)
			return x;
	return 0;
}

/* The row layer's router id e is read from for a request with map m. */
static uint32_t row_of(const uint32_t *const *m, uint32_t layer, uint32_t e)
{
	return m && m[layer] ? m[layer][e] : e;
}

/*
 * The router's id of a reported row (the policies learn in the router's
 * ids, which every adapter shares: its router is the base's), or false for
 * a row no router id of the request's map reaches.
 */
static bool router_id(const struct mp_prefetcher *d, const uint32_t *const *m, uint32_t layer,
		      uint32_t row, uint32_t *out)
{
	const uint32_t *t = m ? m[layer] : NULL;

	if (!t || (row < d->J && t[row] == row)) {
		*out = row;
		return row < d->J;
	}
	for (uint32_t e = 0; e < d->J; e++)
		if (t[e] == row) {
			*out = e;
			return true;
		}
	return false;
}

/*
 * With models: h_live[row] of layer l is 2 for a row an open request's map
 * reaches, 1 for another model's, 0 for the rest (none without models).
 */
static void mark_live(struct mp_prefetcher *d, uint32_t l)
{
	memset(d->h_live, 0, d->spl);
	for (uint32_t x = 0; x < d->nmodels; x++)
		for (uint32_t e = 0; e < d->J; e++)
			if (d->models[x][l][e] < d->spl)
				d->h_live[d->models[x][l][e]] = 1;
	for (uint32_t i = 0; d->nmodels && i < d->nmaps; i++)
		for (uint32_t e = 0; e < d->J; e++)
			if (row_of(d->maps[i].map, l, e) < d->spl)
				d->h_live[row_of(d->maps[i].map, l, e)] = 2;
}

/*
 * Layer l's eviction hints, per row: the probability that any request
 * being decoded uses it at its next pass, 1 - prod(1 - p_r) over the
 * requests that predict it (one request's own p when only one does), -1
 * when none does. A request's prediction of router id e lands on the row
 * its map reads e from.
 */
static void layer_hints(struct mp_prefetcher *d, uint32_t l)
{
	const struct mp_prefetch *pf = &d->pf;

	for (uint32_t row = 0; row < d->spl; row++) {
		d->h_none[row] = 1.0;
		d->h_n[row] = 0;
	}
	for (uint32_t r = 0; r < pf->niters; r++) {
		const struct mp_prefetch_iter *it = &pf->iters[r];
		const uint32_t *const *m;

		if (!it->used)
			continue;
		m = iter_map(d, it);
		if (!m && d->cap_maps)
			atomic_fetch_add(&d->hint_unmapped, 1);
		for (uint32_t e = 0; e < d->J; e++) {
			float p = it->hint_p[(size_t)l * d->J + e];
			uint32_t row = row_of(m, l, e);

			if (!(p >= 0) || row >= d->spl)
				continue;
			d->h_only[row] = p;
			d->h_n[row]++;
			d->h_none[row] *= 1.0 - (p > 1 ? 1 : p);
		}
	}
	mark_live(d, l);
	for (uint32_t row = 0; row < d->spl; row++) {
		float p = d->h_n[row] == 0 ? -1.0f : d->h_n[row] == 1 ? d->h_only[row] :
			  (float)(1.0 - d->h_none[row]);

		/* A model with no request open: its rows are the first to go. */
		if (d->h_live[row] == 1)
			p = 0.0f;
		__atomic_store(&d->hints.p[key_of(d, l, row)], &p, __ATOMIC_RELAXED);
	}
}

/* Every layer's hints again (a request opened or closed: which models run changed). */
static void all_hints(struct mp_prefetcher *d)
{
	for (uint32_t l = 0; l < d->L; l++)
		layer_hints(d, l);
}

/*
 * Hands the policy's last output to the pager and the hints; items of
 * iteration step, predicted for the current request: in router ids, read
 * (and so fetched) at the rows of its map.
 */
static void issue(struct mp_prefetcher *d, uint64_t step)
{
	struct mp_prefetch *pf = &d->pf;
	uint64_t now = __atomic_load_n(&d->hints.now, __ATOMIC_RELAXED);
	const uint32_t *const *m = iter_map(d, pf->it);

	for (uint32_t l = 0; l < d->L; l++)
		if (pf->hint_dirty[l])
			layer_hints(d, l);
	for (uint32_t i = 0; i < pf->n; i++) {
		const struct mp_prefetch_item *it = &pf->items[i];
		uint32_t row = row_of(m, it->layer, it->expert);
		uint32_t key = key_of(d, it->layer, row);
		uint64_t pos = step * d->L + it->layer;
		double prio = (double)it->prio * 1e6;
		int r;

		/* A row the pager does not page (a variant's owned expert, in memory). */
		if (row >= d->spl)
			continue;
		if (!d->truth && d->hints.next_use) {
			uint64_t cur = __atomic_load_n(&d->hints.next_use[key], __ATOMIC_RELAXED);

			if (cur == UINT64_MAX || cur < now || pos < cur)
				store_u64(&d->hints.next_use[key], pos);
		}
		r = mp_pager_prefetch(d->pager, it->layer, row, prio > 1e9 ? 1000000000 : (int)prio);
		atomic_fetch_add(&d->predicted, 1);
		if (r > 0)
			atomic_fetch_add(&d->issued, 1);
		if (row >= d->J) {
			atomic_fetch_add(&d->row_predicted, 1);
			if (r > 0)
				atomic_fetch_add(&d->row_issued, 1);
		}
		if (r >= 0 && (r > 0 || pos < d->issued_pos[key])) {
			if (d->issued_pos[key] == UINT64_MAX)
				d->live[d->nlive++] = key;
			d->issued_pos[key] = pos;
		}
	}
}

/*
 * Drops queued prefetches whose layer has run since they were predicted: a
 * read that can only arrive after its use costs bandwidth and memory for
 * nothing (the engine demanded the expert, or did not need it).
 */
struct expiry {
	const struct mp_prefetcher *d;
	uint64_t now;
};

static bool stale(void *arg, uint32_t key)
{
	const struct expiry *x = arg;

	return x->d->issued_pos[key] < x->now;
}

static void expire(struct mp_prefetcher *d, uint64_t now)
{
	struct expiry x = { d, now };
	bool any = false;
	uint32_t n = 0;

	for (uint32_t i = 0; i < d->nlive && !any; i++)
		any = d->issued_pos[d->live[i]] < now;
	if (!any)
		return;
	d->expired += mp_pager_drop_prefetches(d->pager, stale, &x);
	for (uint32_t i = 0; i < d->nlive; i++) {
		uint32_t key = d->live[i];

		if (d->issued_pos[key] < now)
			d->issued_pos[key] = UINT64_MAX;
		else
			d->live[n++] = key;
	}
	d->nlive = n;
}

/* The next (request, token) after the current one, for an early begin. */
static void guess_next(struct mp_prefetcher *d, uint64_t step, uint32_t req, uint32_t tok,
		       uint32_t *nreq, uint32_t *ntok)
{
	*nreq = req;
	*ntok = tok + 1;
	if (d->future && step + 1 < d->nsteps) {
		uint64_t s = step + 1;

		for (uint32_t g = 0; g < d->nfuture; g++) {
			uint64_t len = d->future[g].end - d->future[g].begin;

			if (s < len) {
				*nreq = d->future[g].request;
				*ntok = d->future[g].begin + (uint32_t)s;
				return;
			}
			s -= len;
		}
	}
}

/* Router logits to their softmax, in place. */
static void softmax(float *v, uint32_t n)
{
	float max = -INFINITY;
	double sum = 0;

	for (uint32_t j = 0; j < n; j++)
		max = fmaxf(max, v[j]);
	for (uint32_t j = 0; j < n; j++) {
		v[j] = expf(v[j] - max);
		sum += v[j];
	}
	for (uint32_t j = 0; j < n; j++)
		v[j] = (float)(v[j] / sum);
}

/* Eight floats, one AVX2 register (two SSE ones in the default build). */
typedef float v8f __attribute__((vector_size(32)));

/*
 * w . x over n floats: eight running sums side by side in one vector (a
 * logit to about 1e-6, plenty for a top-k), then their total.
 */
static inline __attribute__((always_inline)) float dot8(const float *restrict w,
							const float *restrict x, uint32_t n)
{
	v8f part = { 0 };
	double acc = 0;
	uint32_t i = 0;

	for (; i + 8 <= n; i += 8) {
		v8f a, b;

		memcpy(&a, w + i, sizeof(a));
		memcpy(&b, x + i, sizeof(b));
		part += a * b;
	}
	for (; i < n; i++)
		acc += (double)w[i] * x[i];
	for (uint32_t t = 0; t < 8; t++)
		acc += part[t];
	return (float)acc;
}

/*
 * out[j] = W's row j . x, J rows of n floats. The AVX2 clone keeps dot8()'s
 * eight sums in one register instead of two (the same sums in the same
 * order: the same logits); a router lookahead is mostly this.
 */
#ifndef __SANITIZE_THREAD__	/* TSan instruments ifunc resolvers, which run before it is up */
__attribute__((target_clones("avx2", "default")))
#endif
static void gemv(const float *restrict W, const float *restrict x, uint32_t J, uint32_t n,
		 float *restrict out)
{
	for (uint32_t j = 0; j < J; j++)
		out[j] = dot8(W + (size_t)j * n, x, n);
}

/*
 * The routers of the next pf.spec_rows layers applied to layer's input x,
 * each a softmax (Mixtral-offloading's lookahead, one or more layers deep),
 * those the policy wants only (pf.spec_want; the others are left unset).
 * x is the residual stream through layer's FFN norm; dividing out its
 * weights and applying a later layer's (folded into d->routers) makes it
 * that layer's norm of the same stream, the rest of its input, as the model
 * would compute it if the layers between added nothing.
 */
static const float *speculate(struct mp_prefetcher *d, uint32_t layer, const float *x)
{
	const float *w = d->norms ? d->norms + (size_t)layer * d->hidden : NULL;
	bool xs = false;

	if (!d->routers || !x || layer + 1 >= d->L)
		return NULL;
	for (uint32_t r = 0; r < d->pf.spec_rows && layer + 1 + r < d->L; r++) {
		const float *W = d->routers + (size_t)(layer + 1 + r) * d->J * d->hidden;
		float *out = d->spec + (size_t)r * d->J;

		if (!mp_prefetch_spec_wanted(&d->pf, r))
			continue;
		if (!xs) {
			for (uint32_t i = 0; i < d->hidden; i++)
				d->xs[i] = !w ? x[i] : w[i] != 0 ? x[i] / w[i] : 0.0f;
			xs = true;
		}
		gemv(W, d->xs, d->J, d->hidden, out);
		softmax(out, d->J);
	}
	return d->spec;
}

static int by_value(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x > y) - (x < y);
}

/* The eviction hints' miss weights for the current load ratio (mp_prefetch_miss_weights()). */
static void publish_miss_weights(struct mp_prefetcher *d)
{
	mp_prefetch_miss_weights(&d->pf, d->miss_w);
	for (uint32_t l = 0; l < d->L; l++)
		__atomic_store(&d->hints.miss_w[l], &d->miss_w[l], __ATOMIC_RELAXED);
}

/*
 * Keeps pf.load_ratio, one expert read over one layer's compute, current.
 * A layer's compute is the lower quartile of an iteration's gate-to-gate
 * gaps: gaps with a fault in them include its stall, and under memory
 * pressure fewer than three in four layers find every expert resident. A
 * read is the mean time of the file tier's demand reads since the last
 * iteration (mp_pager_demand_reads: prefetch reads yield to them, so they would
 * time the yielding, not the device).
 */
static void measure(struct mp_prefetcher *d, struct pf_req *rq, const struct pf_event *ev)
{
	const double a = 0.25;	/* smoothing over about four iterations */
	uint64_t reads, read_ns;

	if (ev->step == rq->last_step && ev->layer == rq->last_layer + 1 && rq->last_ns &&
	    ev->t_ns > rq->last_ns && d->ngaps < d->L * d->pf.niters)
		d->gaps[d->ngaps++] = (float)(ev->t_ns - rq->last_ns);
	rq->last_ns = ev->t_ns;
	rq->last_step = ev->step;
	rq->last_layer = ev->layer;
	if (ev->step == d->meas_step)
		return;
	d->meas_step = ev->step;
	if (d->ngaps) {
		double q;

		qsort(d->gaps, d->ngaps, sizeof(*d->gaps), by_value);
		q = d->gaps[d->ngaps / 4];
		d->t_layer = d->t_layer > 0 ? (1 - a) * d->t_layer + a * q : q;
	}
	d->ngaps = 0;
	mp_pager_demand_reads(d->pager, &reads, &read_ns);
	if (reads > d->reads0 && read_ns >= d->read_ns0) {
		double t = (double)(read_ns - d->read_ns0) / (double)(reads - d->reads0);

		d->t_load = d->t_load > 0 ? (1 - a) * d->t_load + a * t : t;
	}
	d->reads0 = reads;
	d->read_ns0 = read_ns;
	if (d->t_layer > 0 && d->t_load > 0)
		d->pf.load_ratio = (float)(d->t_load / d->t_layer);
	publish_miss_weights(d);
}

/*
 * The clock handle() is timed by: inline, the handling never sleeps (its
 * lock has no other taker), so the vDSO's clock instead of a thread CPU
 * clock's system call per gate.
 */
static uint64_t policy_clock(const struct mp_prefetcher *d)
{
	return d->inline_events ? mp_now_ns() : mp_prefetch_cpu_ns();
}

static void handle(struct mp_prefetcher *d, const struct pf_event *ev, float *probs,
		   const float *x, const float *sem)
{
	struct mp_prefetch *pf = &d->pf;
	uint64_t t0 = policy_clock(d);
	uint32_t ids[MP_TRAJ_MAX_K], k = 0;
	float w[MP_TRAJ_MAX_K];
	struct pf_req *rq;

	if (ev->has_logits)
		softmax(probs, d->J);
	pthread_mutex_lock(&d->lock);
	if (!ev->begin) {
		const uint32_t *const *m = d->nmaps ? map_of(d, ev->request) : NULL;

		/* Rerouted rows back to the router's ids; rows of no known map are left out. */
		for (uint32_t i = 0; i < ev->k; i++)
			if (router_id(d, m, ev->layer, ev->ids[i], &ids[k]))
				w[k++] = ev->has_weights ? ev->weights[i] : 0.0f;
		if (!k)
			goto out;
	}
	rq = &d->reqs[mp_prefetch_switch(pf, ev->request)];
	if (d->nmodels && !d->one_store)
		mp_prefetch_set_model(pf, model_of(d, map_of(d, ev->request)));
	if (ev->begin) {
		mp_prefetch_begin(pf, ev->request, ev->token, sem);
		issue(d, ev->step);
		atomic_fetch_add(&d->iterations, 1);
		rq->early = true;
		goto out;
	}
	measure(d, rq, ev);
	expire(d, ev->step * d->L + ev->layer);
	if (!pf->it->in_iter || pf->it->token != ev->token || (ev->layer == 0 && !rq->early)) {
		mp_prefetch_begin(pf, ev->request, ev->token, NULL);
		issue(d, ev->step);
		atomic_fetch_add(&d->iterations, 1);
	}
	rq->early = false;
	d->cur_step = ev->step;
	if (!mp_prefetch_gate(pf, ev->layer, ids, ev->has_weights ? w : NULL, k,
			      ev->has_probs || ev->has_logits ? probs : NULL,
			      ev->has_x ? speculate(d, ev->layer, x) : NULL))
		issue(d, ev->step);
	if (ev->layer + 1 == d->L) {
		uint32_t nreq, ntok;

		mp_prefetch_end(pf);
		/* The map is complete: without semantic vectors it is the next one's context. */
		if (!pf->env.sem_dim) {
			guess_next(d, ev->step, ev->request, ev->token, &nreq, &ntok);
			/* A guess for another request starts that one's iteration early. */
			if (nreq != ev->request)
				rq = &d->reqs[mp_prefetch_switch(pf, nreq)];
			mp_prefetch_begin(pf, nreq, ntok, NULL);
			issue(d, ev->step + 1);
			atomic_fetch_add(&d->iterations, 1);
			rq->early = true;
		}
	}
out:
	pthread_mutex_unlock(&d->lock);
	atomic_fetch_add(&d->policy_ns, policy_clock(d) - t0);
}

/* Handles the events queued so far: on the thread, or inline under plock (inline_events). */
static void consume(struct mp_prefetcher *d)
{
	uint64_t tail = atomic_load_explicit(&d->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&d->head, memory_order_acquire);

	while (tail != head) {
		uint32_t i = (uint32_t)(tail & d->mask);

		handle(d, &d->ring[i], d->ring_probs + (size_t)i * d->J,
		       d->ring_x ? d->ring_x + (size_t)i * d->hidden : NULL,
		       d->ring_sem ? d->ring_sem + (size_t)i * d->cfg.sem.dim : NULL);
		atomic_fetch_add(&d->events, 1);
		tail++;
		atomic_store_explicit(&d->tail, tail, memory_order_release);
	}
}

static void *thread_main(void *arg)
{
	struct mp_prefetcher *d = arg;
	struct pollfd pfd = { .fd = d->efd, .events = POLLIN };

	while (!atomic_load(&d->stop)) {
		uint64_t v;

		if (atomic_load_explicit(&d->tail, memory_order_relaxed) ==
		    atomic_load_explicit(&d->head, memory_order_acquire)) {
			pthread_mutex_lock(&d->lock);
			pthread_cond_broadcast(&d->drained);
			pthread_mutex_unlock(&d->lock);
			if (poll(&pfd, 1, POLL_MS) > 0 && read(d->efd, &v, sizeof(v)) < 0)
				(void)0;	/* EAGAIN: another wake-up consumed it */
			continue;
		}
		consume(d);
	}
	return NULL;
}

/*
 * The producer's step index of an event of layer (-1: an iteration's begin),
 * under plock. A step is one pass of every sequence through the layers: a
 * batch reports each layer for all its sequences before the next layer, one
 * sequence all its layers in turn, so a step starts where the layer goes down.
 */
static uint64_t producer_step(struct mp_prefetcher *d, int64_t layer)
{
	if (d->pstarted && layer < d->player)
		d->pstep++;
	d->pstarted = true;
	d->player = layer;
	return d->pstep;
}

/*
 * The next free queue entry, under plock (still held when it returns one),
 * or NULL with the event counted as dropped and plock released.
 */
static struct pf_event *claim(struct mp_prefetcher *d)
{
	uint64_t head = atomic_load_explicit(&d->head, memory_order_relaxed);

	if (head - atomic_load_explicit(&d->tail, memory_order_acquire) > d->mask) {
		pthread_mutex_unlock(&d->plock);
		atomic_fetch_add(&d->dropped, 1);
		return NULL;
	}
	return &d->ring[head & d->mask];
}

/* Publishes the entry claim() returned, releases plock and wakes the thread (or handles it). */
static void publish(struct mp_prefetcher *d)
{
	uint64_t head = atomic_load_explicit(&d->head, memory_order_relaxed);
	uint64_t one = 1;

	atomic_store_explicit(&d->head, head + 1, memory_order_release);
	if (d->inline_events)
		consume(d);
	pthread_mutex_unlock(&d->plock);
	if (d->inline_events)
		return;
	if (write(d->efd, &one, sizeof(one)) < 0)
		(void)0;	/* cannot overflow at one per event; the poll timeout covers it */
}

int mp_prefetcher_begin(struct mp_prefetcher *d, uint32_t request, uint32_t token,
			const float *sem)
{
	struct pf_event *ev;
	uint64_t step, slot;

	if (!d || !sem || !d->cfg.sem.dim)
		return mp_err(-EINVAL, "prefetcher: begin of request %u token %u: %s", request,
			      token, !d ? "no prefetcher" : !sem ? "no semantic vector" :
			      "opened without semantic vectors (sem.dim = 0)");
	pthread_mutex_lock(&d->plock);
	step = producer_step(d, -1);
	ev = claim(d);
	if (!ev)
		return -ENOSPC;
	slot = (uint64_t)(ev - d->ring);
	*ev = (struct pf_event){ .step = step, .request = request, .token = token,
				 .t_ns = mp_now_ns(), .begin = true };
	memcpy(d->ring_sem + slot * d->cfg.sem.dim, sem, d->cfg.sem.dim * sizeof(float));
	publish(d);
	return 0;
}

/*
 * t_ns: when the gate ran (CLOCK_MONOTONIC), for the load ratio; logits: the
 * J floats at probs are the router's logits, turned into probabilities on
 * the prefetch thread rather than the engine's.
 */
static int gate_at(struct mp_prefetcher *d, uint32_t request, uint32_t token, uint32_t layer,
		   const uint32_t *ids, const float *weights, uint32_t k, const float *probs,
		   bool logits, const float *x, uint64_t t_ns)
{
	struct pf_event *ev;
	uint64_t step, slot;

	if (!d || !ids || !k || k > MP_TRAJ_MAX_K || layer >= d->L)
		return mp_err(-EINVAL, "prefetcher: gate of layer %u with %u experts", layer, k);
	/* Rows past the experts (an adapter's) come from the source, mapped on the thread. */
	for (uint32_t i = 0; i < k; i++)
		if (ids[i] >= d->spl)
			return mp_err(-EINVAL, "prefetcher: layer %u: expert %u out of range",
				      layer, ids[i]);
	pthread_mutex_lock(&d->plock);
	step = producer_step(d, layer);
	/* Positions and the true future are kept here, synchronously (even for a dropped event). */
	store_u64(&d->hints.now, step * d->L + layer);
	if (d->truth && d->next_use_true) {
		for (uint32_t i = 0; i < k; i++) {
			uint64_t nu = step < d->nsteps ?
				d->next_use_true[(step * d->L + layer) * d->K + i] : UINT64_MAX;

			store_u64(&d->hints.next_use[key_of(d, layer, ids[i])], nu);
		}
	} else if (!d->truth && d->hints.next_use) {
		for (uint32_t i = 0; i < k; i++)
			store_u64(&d->hints.next_use[key_of(d, layer, ids[i])], UINT64_MAX);
	}
	ev = claim(d);
	if (!ev)
		return -ENOSPC;
	slot = (uint64_t)(ev - d->ring);
	ev->step = step;
	ev->request = request;
	ev->token = token;
	ev->layer = layer;
	ev->k = k;
	ev->t_ns = t_ns;
	ev->begin = false;
	memcpy(ev->ids, ids, k * sizeof(*ids));
	ev->has_weights = weights != NULL;
	if (weights)
		memcpy(ev->weights, weights, k * sizeof(*weights));
	ev->has_probs = probs && !logits;
	ev->has_logits = probs && logits;
	if (probs)
		memcpy(d->ring_probs + slot * d->J, probs, d->J * sizeof(float));
	ev->has_x = x && d->ring_x;
	if (ev->has_x)
		memcpy(d->ring_x + slot * d->hidden, x, d->hidden * sizeof(float));
	publish(d);
	return 0;
}

int mp_prefetcher_gate(struct mp_prefetcher *d, uint32_t request, uint32_t token,
		       uint32_t layer, const uint32_t *ids, const float *weights, uint32_t k,
		       const float *probs, const float *x)
{
	for (uint32_t i = 0; d && ids && i < k && i < MP_TRAJ_MAX_K; i++)
		if (ids[i] >= d->J)
			return mp_err(-EINVAL, "prefetcher: layer %u: expert %u out of range",
				      layer, ids[i]);
	return gate_at(d, request, token, layer, ids, weights, k, probs, false, x, mp_now_ns());
}

int mp_prefetcher_traj_fn(const struct mp_traj_rec *r, void *arg)
{
	struct mp_prefetcher *d = arg;

	if (r->kind != MP_TRAJ_ROUTE || r->token == MP_TRAJ_NONE || r->token == MP_TOKEN_PROMPT)
		return 0;
	/* Records arrive in batches: the probe's own time keeps the gaps between gates. */
	gate_at(d, r->request, r->token, r->layer, r->ids,
		(r->flags & MP_TRAJ_F_WEIGHTS) ? r->weights : NULL, r->k, NULL, false, NULL,
		r->ts_ns ? r->ts_ns : mp_now_ns());
	return 0;
}

int mp_prefetcher_flush(struct mp_prefetcher *d, uint32_t timeout_ms)
{
	uint64_t deadline = mp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int err = 0;

	pthread_mutex_lock(&d->lock);
	while (atomic_load(&d->tail) != atomic_load(&d->head)) {
		struct timespec ts;
		uint64_t now = mp_now_ns();

		if (now >= deadline) {
			err = -ETIMEDOUT;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 5000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&d->drained, &d->lock, &ts);
	}
	pthread_mutex_unlock(&d->lock);
	return err;
}

int mp_prefetcher_train(struct mp_prefetcher *d, const struct mp_trace *t, uint32_t request,
			uint32_t begin, uint32_t end)
{
	int err = 0;

	if (!d || !t || mp_trace_layers(t) != d->L || mp_trace_experts(t) != d->J ||
	    request >= mp_trace_requests(t) || end > mp_trace_tokens(t, request) || begin > end)
		return mp_err(-EINVAL, "prefetcher: train: trace, request %u or tokens [%u, %u) "
			      "do not fit", request, begin, end);
	if (d->cfg.sem.dim && !d->cfg.sem.fn)
		return mp_err(-EINVAL, "prefetcher: train: semantic vectors of trace tokens need "
			      "sem.fn");
	mp_prefetcher_flush(d, 10000);
	pthread_mutex_lock(&d->lock);
	for (uint32_t tok = begin; tok < end && !err; tok++) {
		if (d->cfg.sem.dim) {
			err = d->cfg.sem.fn(d->cfg.sem.arg, request, tok, d->train_sem);
			if (err) {
				mp_err(err, "semantic vector of token %u: %s", tok, strerror(-err));
				break;
			}
		}
		mp_prefetch_switch(&d->pf, request);
		mp_prefetch_begin(&d->pf, request, tok, d->cfg.sem.dim ? d->train_sem : NULL);
		for (uint32_t l = 0; l < d->L && !err; l++) {
			const uint32_t *ids;
			const float *w;

			err = mp_trace_route(t, request, tok, l, &ids, &w);
			if (!err)
				err = mp_prefetch_gate(&d->pf, l, ids, w, mp_trace_topk(t),
						       mp_trace_probs(t, request, tok, l), NULL);
		}
		mp_prefetch_end(&d->pf);
	}
	/* Training output is not prefetched and its hints are not this run's. */
	d->pf.n = 0;
	for (uint32_t i = 0; i < d->pf.niters; i++)
		d->reqs[i].early = false;
	pthread_mutex_unlock(&d->lock);
	return err ? mp_err(err, "prefetcher: train: request %u: %s", request,
			    mp_last_error()) : 0;
}

int mp_prefetcher_set_future(struct mp_prefetcher *d, const struct mp_replay_seg *segs,
			     uint32_t n)
{
	const struct mp_trace *t = d->cfg.trace;
	uint64_t nsteps = 0, *next, *last, s;
	struct mp_replay_seg *copy;

	if (!t || !n)
		return mp_err(-EINVAL, "prefetcher: a future needs the replayed trace");
	for (uint32_t g = 0; g < n; g++) {
		if (segs[g].request >= mp_trace_requests(t) || segs[g].begin > segs[g].end ||
		    segs[g].end > mp_trace_tokens(t, segs[g].request))
			return mp_err(-EINVAL, "prefetcher: future segment %u is outside the trace",
				      g);
		nsteps += segs[g].end - segs[g].begin;
	}
	copy = malloc(n * sizeof(*copy));
	next = malloc((nsteps ? nsteps : 1) * d->L * d->K * sizeof(*next));
	last = malloc(d->nkeys * sizeof(*last));
	if (!copy || !next || !last) {
		free(copy);
		free(next);
		free(last);
		return -ENOMEM;
	}
	memcpy(copy, segs, n * sizeof(*copy));
	for (uint32_t k = 0; k < d->nkeys; k++)
		last[k] = UINT64_MAX;
	s = nsteps;
	for (uint32_t g = n; g-- > 0;) {
		for (uint32_t tok = segs[g].end; tok-- > segs[g].begin;) {
			s--;
			for (uint32_t l = d->L; l-- > 0;) {
				const uint32_t *ids;
				const float *w;

				mp_trace_route(t, segs[g].request, tok, l, &ids, &w);
				for (uint32_t i = 0; i < d->K; i++) {
					uint32_t key = key_of(d, l, ids[i]);

					next[(s * d->L + l) * d->K + i] = last[key];
					last[key] = s * d->L + l;
				}
			}
		}
	}
	pthread_mutex_lock(&d->plock);
	free(d->future);
	free(d->next_use_true);
	d->future = copy;
	d->nfuture = n;
	d->nsteps = nsteps;
	d->next_use_true = next;
	d->pstep = 0;
	d->pstarted = false;
	if (d->truth)
		for (uint32_t k = 0; k < d->nkeys; k++)
			store_u64(&d->hints.next_use[k], last[k]);
	pthread_mutex_unlock(&d->plock);
	free(last);
	return 0;
}

void mp_prefetcher_stats(struct mp_prefetcher *d, struct mp_prefetcher_stats *out)
{
	struct mp_emap *m;

	memset(out, 0, sizeof(*out));
	out->events = atomic_load(&d->events);
	out->dropped = atomic_load(&d->dropped);
	out->iterations = atomic_load(&d->iterations);
	out->predicted = atomic_load(&d->predicted);
	out->issued = atomic_load(&d->issued);
	out->policy_ns = atomic_load(&d->policy_ns);
	out->row_predicted = atomic_load(&d->row_predicted);
	out->row_issued = atomic_load(&d->row_issued);
	out->hint_unmapped = atomic_load(&d->hint_unmapped);
	pthread_mutex_lock(&d->lock);
	out->expired = d->expired;
	out->load_ratio = d->pf.load_ratio;
	m = mp_prefetch_finemoe_emap(&d->pf);
	if (m) {
		struct mp_emap_stats es;

		mp_emap_stats(m, &es);
		out->emap_records = es.count;
		out->emap_bytes = mp_prefetch_finemoe_bytes(&d->pf);
	}
	pthread_mutex_unlock(&d->lock);
}

/* Points the pager's eviction policy at our hints, or detaches them. */
static void attach_hints(struct mp_prefetcher *d, bool on)
{
	mp_pager_set_hints(d->pager, on ? &d->hints : NULL);
	d->hints_attached = on;
}

void mp_prefetcher_close(struct mp_prefetcher *d)
{
	if (!d)
		return;
	if (d->thread_started) {
		atomic_store(&d->stop, true);
		pthread_join(d->thread, NULL);
	}
	if (d->hints_attached)
		attach_hints(d, false);
	if (d->pf_ok && d->emap_path && mp_prefetch_finemoe_emap(&d->pf)) {
		int err = mp_emap_save(mp_prefetch_finemoe_emap(&d->pf), d->emap_path);

		if (err)
			mp_warn("prefetcher: the expert maps were not saved: %s", mp_last_error());
	}
	if (d->pf_ok)
		mp_prefetch_fini(&d->pf);
	if (d->efd >= 0)
		close(d->efd);
	pthread_mutex_destroy(&d->plock);
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->drained);
	free(d->ring);
	free(d->ring_probs);
	free(d->ring_x);
	free(d->ring_sem);
	free(d->train_sem);
	free(d->routers);
	free(d->norms);
	free(d->xs);
	free(d->spec);
	free(d->pend_logits);
	free(d->pend_x);
	free(d->hints.p);
	free(d->hints.next_use);
	free(d->hints.miss_w);
	free(d->miss_w);
	free(d->issued_pos);
	free(d->live);
	free(d->gaps);
	free(d->reqs);
	free(d->maps);
	free(d->h_none);
	free(d->h_only);
	free(d->h_n);
	free(d->h_live);
	free(d->future);
	free(d->next_use_true);
	free(d->emap_path);
	free(d);
}

/* Reads tensor name of n floats as f32 into out. Returns 0, -ENOENT (no such tensor) or -errno. */
static int read_f32(struct mp_store *s, const char *name, size_t n, float *out, void *buf)
{
	const struct mp_tensor_info *t = mp_store_tensor(s, name);
	int err;

	if (!t || t->bytes != n * mp_dtype_size(t->dtype))
		return -ENOENT;
	err = mp_store_read_tensor(s, t, buf);
	if (!err)
		mp_dtype_to_f32(t->dtype, buf, out, n);
	return err;
}

/*
 * For speculation: every layer's router as f32 with its FFN norm weights
 * folded in (speculate()), read once from the store. A model without norm
 * weights is speculated on as its inputs come.
 */
static int load_routers(struct mp_prefetcher *d, const char *policy)
{
	struct mp_store *s = mp_pager_store(d->pager);
	size_t per = (size_t)d->J * d->hidden;
	char name[MP_TENSOR_NAME_MAX];
	void *buf;
	int err = 0;

	d->routers = malloc((size_t)d->L * per * sizeof(float));
	d->norms = malloc((size_t)d->L * d->hidden * sizeof(float));
	d->xs = malloc(d->hidden * sizeof(float));
	buf = malloc(per * sizeof(float));
	if (!d->routers || !d->norms || !d->xs || !buf) {
		free(buf);
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < d->L && !err; l++) {
		snprintf(name, sizeof(name), "blk.%u.router", l);
		err = read_f32(s, name, per, d->routers + l * per, buf);
		if (err == -ENOENT)
			err = mp_err(-EINVAL, "prefetch %s: %s: no %u x %u router", policy, name,
				     d->J, d->hidden);
		snprintf(name, sizeof(name), "blk.%u.ffn_norm", l);
		if (!err && d->norms &&
		    read_f32(s, name, d->hidden, d->norms + (size_t)l * d->hidden, buf)) {
			free(d->norms);
			d->norms = NULL;
		}
	}
	for (uint32_t l = 0; !err && d->norms && l < d->L; l++)
		for (uint32_t j = 0; j < d->J; j++)
			for (uint32_t i = 0; i < d->hidden; i++)
				d->routers[l * per + (size_t)j * d->hidden + i] *=
					d->norms[(size_t)l * d->hidden + i];
	free(buf);
	return err;
}

static int load_emap(struct mp_prefetcher *d)
{
	struct mp_emap *cur = mp_prefetch_finemoe_emap(&d->pf), *m;
	int err;

	if (!cur || access(d->emap_path, F_OK))
		return 0;
	err = mp_emap_load(d->emap_path, mp_emap_config(cur), &m);
	if (err)
		return err;
	mp_prefetch_finemoe_set_emap(&d->pf, m);
	mp_info("prefetcher: %s: loaded the expert-map store", d->emap_path);
	return 0;
}

int mp_prefetcher_open(struct mp_pager *p, const struct mp_prefetcher_config *cfg,
		       struct mp_prefetcher **out)
{
	const struct mp_prefetch_ops *ops;
	const struct mp_geometry *geo;
	const char *name;
	struct mp_prefetcher *d;
	uint32_t q;
	int err;

	*out = NULL;
	if (!p)
		return mp_err(-EINVAL, "prefetcher: no pager");
	if (cfg && (err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
					    "prefetcher config")))
		return err;
	if (cfg && (cfg->reserved32 || cfg->requests > MP_PREFETCH_MAX_REQUESTS))
		return mp_err(-EINVAL, "prefetcher: %s", cfg->reserved32 ? "reserved32 is not zero" :
			      "more requests than MP_PREFETCH_MAX_REQUESTS");
	name = cfg && cfg->policy ? cfg->policy : getenv("MOEPAGER_PREFETCH");
	if (!name || !*name)
		name = "none";
	ops = mp_prefetch_find(name);
	if (!ops)
		return mp_err(-EINVAL, "prefetcher: unknown policy '%s' (%s)", name,
			      mp_prefetch_names());
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->efd = -1;
	pthread_mutex_init(&d->plock, NULL);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->drained, NULL);
	if (cfg)
		d->cfg = *cfg;
	geo = mp_store_geometry(mp_pager_store(p));
	d->pager = p;
	d->L = geo->layers;
	d->J = geo->experts;
	d->K = geo->topk;
	d->spl = mp_pager_slots_per_layer(p);
	d->nkeys = d->L * d->spl;
	q = d->cfg.queue_events ? d->cfg.queue_events : DEFAULT_QUEUE;
	if (q & (q - 1)) {
		err = mp_err(-EINVAL, "prefetcher: queue_events %u is not a power of two", q);
		goto close;
	}
	d->mask = q - 1;
	d->ring = calloc(q, sizeof(*d->ring));
	d->ring_probs = calloc((size_t)q * d->J, sizeof(float));
	d->hidden = geo->hidden;
	d->pend_logits = calloc(d->J, sizeof(float));
	d->pend_x = calloc(d->hidden, sizeof(float));
	d->hints.p = malloc(d->nkeys * sizeof(float));
	d->hints.next_use = malloc(d->nkeys * sizeof(uint64_t));
	d->hints.miss_w = malloc(d->L * sizeof(float));
	d->miss_w = malloc(d->L * sizeof(float));
	d->issued_pos = malloc(d->nkeys * sizeof(uint64_t));
	d->live = malloc(d->nkeys * sizeof(uint32_t));
	d->h_none = malloc(d->spl * sizeof(*d->h_none));
	d->h_only = malloc(d->spl * sizeof(*d->h_only));
	d->h_n = malloc(d->spl * sizeof(*d->h_n));
	d->h_live = malloc(d->spl);
	d->emap_path = d->cfg.emap_path ? strdup(d->cfg.emap_path) : NULL;
	err = -ENOMEM;
	if (!d->ring || !d->ring_probs || !d->hints.p || !d->hints.next_use || !d->hints.miss_w ||
	    !d->miss_w || !d->issued_pos ||
	    !d->live || !d->h_none || !d->h_only || !d->h_n || !d->h_live ||
	    !d->pend_logits || !d->pend_x ||
	    (d->cfg.emap_path && !d->emap_path))
		goto close;
	if (d->cfg.sem.dim) {
		if (d->cfg.sem.dim > MP_EMAP_MAX_SEM) {
			err = mp_err(-EINVAL, "prefetcher: semantic vectors of %u floats (at most "
				     "%u)", d->cfg.sem.dim, MP_EMAP_MAX_SEM);
			goto close;
		}
		d->ring_sem = calloc((size_t)q * d->cfg.sem.dim, sizeof(float));
		d->train_sem = calloc(d->cfg.sem.dim, sizeof(float));
		if (!d->ring_sem || !d->train_sem)
			goto close;
	}
	if (ops->layer_input) {
		d->ring_x = calloc((size_t)q * d->hidden, sizeof(float));
		if (!d->ring_x)
			goto close;
		err = load_routers(d, ops->name);
		if (err)
			goto close;
	}
	for (uint32_t l = 0; l < d->L; l++)
		d->hints.miss_w[l] = 1.0f;
	for (uint32_t k = 0; k < d->nkeys; k++) {
		d->hints.p[k] = -1.0f;
		d->hints.next_use[k] = UINT64_MAX;
		d->issued_pos[k] = UINT64_MAX;
	}
	d->truth = d->cfg.trace != NULL;
	if (d->cfg.trace && (err = mp_trace_check_geometry(d->cfg.trace, geo)))
		goto close;

	struct mp_prefetch_env env = {
		.layers = d->L, .experts = d->J, .topk = d->K, .distance = d->cfg.distance,
		.emap_capacity = d->cfg.emap_capacity, .trace = d->cfg.trace,
		.sem_dim = d->cfg.sem.dim, .requests = d->cfg.requests,
	};
	err = mp_prefetch_init(&d->pf, ops, &env);
	if (err)
		goto close;
	d->pf_ok = true;
	d->spec = calloc((size_t)MP_MAX(d->pf.spec_rows, 1u) * d->J, sizeof(float));
	d->reqs = calloc(d->pf.niters, sizeof(*d->reqs));
	d->gaps = malloc((size_t)d->L * d->pf.niters * sizeof(*d->gaps));
	if (!d->reqs || !d->gaps || !d->spec) {
		err = -ENOMEM;
		goto close;
	}
	if (d->emap_path && (err = load_emap(d)))
		goto close;
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->efd < 0) {
		err = mp_err(-errno, "prefetcher: eventfd: %s", strerror(errno));
		goto close;
	}
	/* Without admission the pager sees no predicted next uses (belady needs the true ones). */
	if (d->cfg.no_admit && !d->truth) {
		free(d->hints.next_use);
		d->hints.next_use = NULL;
	}
	attach_hints(d, true);
	d->inline_events = ops->inline_gates;
	d->ids_only = !ops->begin && !ops->gate && !ops->end && !ops->layer_input;
	if (!d->inline_events) {
		err = -pthread_create(&d->thread, NULL, thread_main, d);
		if (err) {
			mp_err(err, "prefetcher: cannot start its thread");
			goto close;
		}
		d->thread_started = true;
	}
	mp_debug("prefetcher: policy %s, distance %u", ops->name, d->pf.env.distance);
	*out = d;
	return 0;

close:
	mp_prefetcher_close(d);
	return err;
}

/*
 * The expert source: the pager's, plus a gate event per routing report.
 */

static const void *src_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct mp_prefetcher *d = ctx;

	return mp_pager_source_ops()->expert(d->pager, layer, expert);
}

/* Keeps the router's distribution and input until the route of the same token and layer. */
static void src_gate(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const float *logits, uint32_t experts, const float *x, uint32_t hidden)
{
	struct mp_prefetcher *d = ctx;

	if (experts != d->J || hidden != d->hidden || d->ids_only)
		return;
	memcpy(d->pend_logits, logits, experts * sizeof(float));
	memcpy(d->pend_x, x, hidden * sizeof(float));
	d->pend_req = request;
	d->pend_tok = token;
	d->pend_layer = layer;
	d->pend = true;
}

static int src_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		     const uint32_t *ids, const float *weights, uint32_t k)
{
	struct mp_prefetcher *d = ctx;
	int err = mp_pager_source_ops()->route(d->pager, request, token, layer, ids, weights, k);
	bool pend;

	if (err)
		return err;
	if (token == MP_TOKEN_PROMPT)
		return 0;	/* a batched prompt is no iteration of its own */
	pend = d->pend && d->pend_req == request && d->pend_tok == token &&
	       d->pend_layer == layer;
	d->pend = false;
	/*
	 * Rows as routed (an adapter's rows past the model's experts): the
	 * thread maps them back through the request's map (src_seq_map).
	 * A dropped event only loses a prediction; the softmax is the thread's.
	 */
	gate_at(d, request, token, layer, ids, weights, k, pend ? d->pend_logits : NULL, true,
		pend ? d->pend_x : NULL, mp_now_ns());
	return 0;
}

/*
 * A request's map, kept while its sequence is open; taken under the
 * thread's lock, so once a close returns no prediction uses the map (the
 * adapter behind it may then be unloaded and its rows unbound).
 */
static void src_seq_map(void *ctx, uint32_t request, const uint32_t *const *map)
{
	struct mp_prefetcher *d = ctx;
	uint32_t i;

	pthread_mutex_lock(&d->lock);
	for (i = 0; i < d->nmaps && d->maps[i].request != request; i++)
		;
	if (!map) {
		if (i < d->nmaps)
			d->maps[i] = d->maps[--d->nmaps];
	} else if (i < d->nmaps) {
		d->maps[i].map = map;
	} else {
		if (d->nmaps == d->cap_maps) {
			uint32_t cap = d->cap_maps ? 2 * d->cap_maps : 16;
			struct pf_map *n = realloc(d->maps, cap * sizeof(*n));

			/* Out of memory: this request's rows are paged on demand only. */
			if (!n)
				goto unlock;
			d->maps = n;
			d->cap_maps = cap;
		}
		d->maps[d->nmaps++] = (struct pf_map){ request, map };
	}
	if (d->nmodels)
		all_hints(d);
unlock:
	pthread_mutex_unlock(&d->lock);
}

int mp_prefetcher_set_models(struct mp_prefetcher *d, const uint32_t *const *const *maps,
			     uint32_t n, unsigned flags)
{
	if (!d || n > MP_PREFETCH_MAX_MODELS || (n && !maps) || (flags & ~MP_PREFETCH_ONE_STORE))
		return mp_err(-EINVAL, "prefetcher: %u models (at most %u, with their maps), flags "
			      "%#x (known: %#x)", n, MP_PREFETCH_MAX_MODELS, flags,
			      MP_PREFETCH_ONE_STORE);
	for (uint32_t x = 0; x < n; x++)
		if (!maps[x])
			return mp_err(-EINVAL, "prefetcher: model %u has no map", x);
	pthread_mutex_lock(&d->lock);
	for (uint32_t x = 0; x < n; x++)
		d->models[x] = maps[x];
	d->nmodels = n;
	d->one_store = flags & MP_PREFETCH_ONE_STORE;
	all_hints(d);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

/* The token's embedding is the iteration's semantic vector (when the sizes agree). */
static void src_embed(void *ctx, uint32_t request, uint32_t token, const float *e,
		      uint32_t hidden)
{
	struct mp_prefetcher *d = ctx;

	if (hidden == d->cfg.sem.dim)
		mp_prefetcher_begin(d, request, token, e);	/* dropped: no prediction */
}

static int src_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct mp_prefetcher *d = ctx;

	return mp_pager_source_ops()->guard(d->pager, fn, arg);
}

static int src_resident(void *ctx, uint32_t layer, uint32_t expert)
{
	struct mp_prefetcher *d = ctx;

	return mp_pager_source_ops()->resident(d->pager, layer, expert);
}

static const struct mp_expert_source_ops prefetcher_source_ops = {
	.expert = src_expert,
	.route = src_route,
	.guard = src_guard,
	.gate = src_gate,
	.embed = src_embed,
	.seq_map = src_seq_map,
	.resident = src_resident,
};

const struct mp_expert_source_ops *mp_prefetcher_source_ops(void)
{
	return &prefetcher_source_ops;
}
