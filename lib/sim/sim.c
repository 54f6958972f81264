// SPDX-License-Identifier: MIT
/* Trace-driven cache simulator: a prefetch policy and an eviction policy against a budget. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/trace.h>
#include <moepager/prefetch.h>
#include <moepager/sim.h>

#include "base/base.h"
#include "evict/evict.h"
#include "prefetch/policy.h"

enum { K_ABSENT = 0, K_LOADING, K_RESIDENT };

struct qitem {
	uint32_t key;
	float prio;
	uint64_t pos;		/* predicted position of use */
	double issued;
	uint64_t seq;
};

struct sim {
	const struct mp_sim_config *cfg;
	struct mp_sim_result *res;
	const struct mp_trace *t;
	uint32_t L, J, K, nkeys, channels;
	uint8_t *state;
	uint8_t *prefetched;
	uint8_t *wasted;	/* a prefetch of it was evicted unused since its last use */
	uint8_t *pinned;
	double *done;
	double *chan_free;
	uint32_t reserved;
	double now;
	struct qitem *q;
	uint32_t qn;
	uint64_t qseq;
	int32_t *qidx;		/* key -> place in q, -1 */
	struct mp_evict pol;
	bool pol_ok;
	struct mp_prefetch pf;
	bool pf_ok;
	struct mp_evict_hints hints;
	bool truth;		/* next_use comes from the trace (oracle/belady) */
	float *sem;		/* [cfg->sem.dim]: the iteration's semantic vector */
	float *spec;		/* [spec_rows][J]: a position's speculative gates */
	int err;		/* the first semantic or speculation source error */
};

int mp_replay_split(const struct mp_trace *t, double fraction, struct mp_replay_seg *train,
		    uint32_t *ntrain, struct mp_replay_seg *eval, uint32_t *neval)
{
	uint32_t n = mp_trace_requests(t);

	*ntrain = *neval = 0;
	if (!(fraction > 0 && fraction < 1))
		return mp_err(-EINVAL, "train fraction %g is not in (0, 1)", fraction);
	if (n == 1) {
		uint32_t tok = mp_trace_tokens(t, 0);
		uint32_t cut = (uint32_t)lround(fraction * tok);

		cut = MP_MIN(MP_MAX(cut, 1u), tok - 1);
		if (tok < 2)
			return mp_err(-EINVAL, "trace has one token: nothing to evaluate");
		train[(*ntrain)++] = (struct mp_replay_seg){ 0, 0, cut };
		eval[(*neval)++] = (struct mp_replay_seg){ 0, cut, tok };
		return 0;
	}
	uint32_t cut = (uint32_t)lround(fraction * n);

	cut = MP_MIN(MP_MAX(cut, 1u), n - 1);
	for (uint32_t r = 0; r < n; r++) {
		struct mp_replay_seg s = { r, 0, mp_trace_tokens(t, r) };

		if (r < cut)
			train[(*ntrain)++] = s;
		else
			eval[(*neval)++] = s;
	}
	return 0;
}

static bool sim_evictable(void *arg, uint32_t key)
{
	struct sim *s = arg;

	if (s->pinned[key])
		return false;
	return s->state[key] == K_RESIDENT ||
	       (s->state[key] == K_LOADING && s->done[key] <= s->now);
}

static void sim_evict(struct sim *s, uint32_t key)
{
	s->state[key] = K_ABSENT;
	s->reserved--;
	if (s->pol.ops->on_remove)
		s->pol.ops->on_remove(&s->pol, key);
	if (s->prefetched[key]) {
		s->prefetched[key] = 0;
		s->wasted[key] = 1;
		s->res->prefetch_wasted++;
	}
}

static void q_remove(struct sim *s, uint32_t i)
{
	s->qidx[s->q[i].key] = -1;
	s->q[i] = s->q[--s->qn];
	if (i < s->qn)
		s->qidx[s->q[i].key] = (int32_t)i;
}

static uint32_t min_channel(const struct sim *s, uint32_t from)
{
	uint32_t c = from;

	for (uint32_t i = from; i < s->channels; i++)
		if (s->chan_free[i] < s->chan_free[c])
			c = i;
	return c;
}

/* Starts a read of key on channel c at time start. */
static void start_load(struct sim *s, uint32_t key, uint32_t c, double start)
{
	s->state[key] = K_LOADING;
	s->done[key] = start + s->cfg->load_cost;
	s->chan_free[c] = s->done[key];
	s->reserved++;
	if (s->pol.ops->on_insert)
		s->pol.ops->on_insert(&s->pol, key);
}

/* Runs queued prefetches whose channel frees up by `until` (demand keeps channel 0 free). */
static void process_io(struct sim *s, double until)
{
	uint32_t first = s->channels > 1 ? 1 : 0;

	while (s->qn) {
		uint32_t c = min_channel(s, first), best = 0;
		struct qitem it;
		double start;

		for (uint32_t i = 1; i < s->qn; i++)
			if (s->q[i].prio > s->q[best].prio ||
			    (s->q[i].prio == s->q[best].prio && s->q[i].seq < s->q[best].seq))
				best = i;
		it = s->q[best];
		start = MP_MAX(s->chan_free[c], it.issued);
		if (start > until)
			break;
		q_remove(s, best);
		/* Its layer has passed: the prediction is moot. */
		if (it.pos < s->hints.now || s->state[it.key] != K_ABSENT)
			continue;
		if (s->reserved >= s->cfg->capacity) {
			double saved = s->now;
			int64_t v;

			s->now = start;
			v = s->pol.ops->pick_victim(&s->pol, sim_evictable, s);
			s->now = saved;
			if (v < 0 || (!s->cfg->no_admit && !mp_evict_admit(&s->hints, it.key,
									     (uint32_t)v))) {
				s->res->prefetch_refused++;
				continue;
			}
			sim_evict(s, (uint32_t)v);
		}
		start_load(s, it.key, c, start);
		s->prefetched[it.key] = 1;
		s->res->prefetch_loads++;
	}
}

/* Queues the policy's last output; items of iteration `it`. */
static void take_items(struct sim *s, uint64_t it)
{
	for (uint32_t i = 0; i < s->pf.n; i++) {
		const struct mp_prefetch_item *x = &s->pf.items[i];
		uint32_t key = x->layer * s->J + x->expert;
		uint64_t pos = it * s->L + x->layer;

		s->res->prefetch_emitted++;
		if (!s->truth) {
			uint64_t cur = s->hints.next_use[key];

			if (cur == UINT64_MAX || cur < s->hints.now || pos < cur)
				s->hints.next_use[key] = pos;
		}
		if (s->state[key] != K_ABSENT)
			continue;
		if (s->qidx[key] >= 0) {
			struct qitem *q = &s->q[s->qidx[key]];

			q->prio = MP_MAX(q->prio, x->prio);
			q->pos = MP_MIN(q->pos, pos);
			continue;
		}
		s->qidx[key] = (int32_t)s->qn;
		s->q[s->qn++] = (struct qitem){ key, x->prio, pos, s->now, s->qseq++ };
	}
}

static int route(const struct sim *s, const struct mp_replay_seg *seg, uint32_t tok, uint32_t l,
		 const uint32_t **ids, const float **w, const float **probs)
{
	*probs = mp_trace_probs(s->t, seg->request, tok, l);
	return mp_trace_route(s->t, seg->request, tok, l, ids, w);
}

/* Begins an iteration with its semantic vector, when there is a source. */
static void sim_begin(struct sim *s, uint32_t request, uint32_t tok)
{
	const struct mp_sem_source *src = &s->cfg->sem;
	uint64_t t0;
	int err = 0;

	if (src->dim && !s->err) {
		err = src->fn(src->arg, request, tok, s->sem);
		if (err)
			s->err = mp_err(err, "simulate: semantic vector of request %u token %u: %s",
					request, tok, strerror(-err));
	}
	t0 = mp_prefetch_cpu_ns();
	mp_prefetch_begin(&s->pf, request, tok, src->dim && !err ? s->sem : NULL);
	s->res->policy_ns += mp_prefetch_cpu_ns() - t0;
}

/*
 * The speculative gates of the next pf.spec_rows layers at this position,
 * when the policy takes them (those it wants: pf.spec_want).
 */
static const float *speculate(struct sim *s, uint32_t request, uint32_t tok, uint32_t layer)
{
	const struct mp_spec_source *src = &s->cfg->spec;

	if (!src->fn || !s->pf.spec_rows || layer + 1 >= s->L || s->err)
		return NULL;
	for (uint32_t r = 0; r < s->pf.spec_rows && layer + 1 + r < s->L; r++) {
		int err = !mp_prefetch_spec_wanted(&s->pf, r) ? 0 :
			  src->fn(src->arg, request, tok, layer, layer + 1 + r,
				  s->spec + (size_t)r * s->J);

		if (err) {
			s->err = mp_err(err, "simulate: speculative gate of request %u token %u "
					"layer %u for layer %u: %s", request, tok, layer,
					layer + 1 + r, strerror(-err));
			return NULL;
		}
	}
	return s->spec;
}

static void learn(struct sim *s, const struct mp_replay_seg *segs, uint32_t n)
{
	for (uint32_t g = 0; g < n; g++) {
		for (uint32_t tok = segs[g].begin; tok < segs[g].end; tok++) {
			sim_begin(s, segs[g].request, tok);
			for (uint32_t l = 0; l < s->L; l++) {
				const uint32_t *ids;
				const float *w, *probs;

				if (route(s, &segs[g], tok, l, &ids, &w, &probs))
					continue;
				/* Only the prefetch policy learns: the cache starts cold. */
				mp_prefetch_gate(&s->pf, l, ids, w, s->K, probs, NULL);
			}
			mp_prefetch_end(&s->pf);
		}
	}
}

struct step {
	uint32_t seg;
	uint32_t tok;
};

/* Fills next[] (per use, in replay order) with the position of the key's next use. */
static int future(struct sim *s, const struct mp_replay_seg *segs, const struct step *steps,
		  uint64_t nsteps, uint64_t **out)
{
	uint64_t n = nsteps * s->L * s->K;
	uint64_t *next = malloc(n * sizeof(*next)), *last = malloc(s->nkeys * sizeof(*last));

	if (!next || !last) {
		free(next);
		free(last);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < s->nkeys; k++)
		last[k] = UINT64_MAX;
	for (uint64_t i = nsteps; i-- > 0;) {
		for (uint32_t l = s->L; l-- > 0;) {
			const uint32_t *ids;
			const float *w, *p;

			route(s, &segs[steps[i].seg], steps[i].tok, l, &ids, &w, &p);
			for (uint32_t j = 0; j < s->K; j++) {
				uint32_t key = l * s->J + ids[j];

				next[(i * s->L + l) * s->K + j] = last[key];
				last[key] = i * s->L + l;
			}
		}
	}
	for (uint32_t k = 0; k < s->nkeys; k++)
		s->hints.next_use[k] = s->truth ? last[k] : UINT64_MAX;
	free(last);
	*out = next;
	return 0;
}

static void run_layer(struct sim *s, const struct mp_replay_seg *seg, uint32_t tok, uint32_t l,
		      uint64_t it, const uint64_t *next, uint64_t nsteps,
		      const struct step *steps, const struct mp_replay_seg *segs)
{
	const uint32_t *ids;
	const float *w, *probs;
	uint32_t keys[MP_MAX_TOPK];
	const float *spec;
	uint64_t t0;
	double ready;

	s->hints.now = it * s->L + l;
	process_io(s, s->now);
	route(s, seg, tok, l, &ids, &w, &probs);
	for (uint32_t i = 0; i < s->K; i++) {
		keys[i] = l * s->J + ids[i];
		s->pinned[keys[i]] = 1;
	}
	if (s->pol.ops->on_route) {
		struct mp_evict_route r = { seg->request, tok, l, s->K, keys, w };

		s->pol.ops->on_route(&s->pol, &r);
	}
	spec = speculate(s, seg->request, tok, l);
	t0 = mp_prefetch_cpu_ns();
	mp_prefetch_gate(&s->pf, l, ids, w, s->K, probs, spec);
	s->res->policy_ns += mp_prefetch_cpu_ns() - t0;
	take_items(s, it);
	if (l + 1 == s->L) {
		/*
		 * The map is complete: without semantic vectors it is the next
		 * iteration's context, known now; a token's embedding only when
		 * its step starts.
		 */
		t0 = mp_prefetch_cpu_ns();
		mp_prefetch_end(&s->pf);
		s->res->policy_ns += mp_prefetch_cpu_ns() - t0;
		if (it + 1 < nsteps && !s->cfg->sem.dim) {
			sim_begin(s, segs[steps[it + 1].seg].request, steps[it + 1].tok);
			take_items(s, it + 1);
		}
	}
	ready = s->now;
	for (uint32_t i = 0; i < s->K; i++) {
		uint32_t key = keys[i];

		s->res->uses++;
		if (s->state[key] == K_LOADING && s->done[key] <= s->now)
			s->state[key] = K_RESIDENT;
		if (s->state[key] == K_RESIDENT) {
			s->res->hits++;
			if (s->pol.ops->on_access)
				s->pol.ops->on_access(&s->pol, key);
		} else if (s->state[key] == K_LOADING) {
			s->res->late++;
			ready = MP_MAX(ready, s->done[key]);
			if (s->pol.ops->on_fault)
				s->pol.ops->on_fault(&s->pol, key);
		} else {
			uint32_t c;

			if (s->qidx[key] >= 0) {
				s->res->miss_queued++;
				q_remove(s, (uint32_t)s->qidx[key]);
			} else if (!s->truth && s->hints.next_use[key] == it * s->L + l) {
				s->res->miss_predicted++;
				s->res->miss_predicted_wasted += s->wasted[key];
			}
			if (s->pol.ops->on_fault)
				s->pol.ops->on_fault(&s->pol, key);
			if (s->reserved >= s->cfg->capacity) {
				int64_t v = s->pol.ops->pick_victim(&s->pol, sim_evictable, s);

				if (v >= 0)
					sim_evict(s, (uint32_t)v);
			}
			c = min_channel(s, 0);
			start_load(s, key, c, MP_MAX(s->chan_free[c], s->now));
			s->res->demand_loads++;
			ready = MP_MAX(ready, s->done[key]);
		}
		if (s->prefetched[key]) {
			s->prefetched[key] = 0;
			s->res->prefetch_used++;
		}
		s->wasted[key] = 0;
		s->hints.next_use[key] = s->truth ? next[(it * s->L + l) * s->K + i] : UINT64_MAX;
	}
	s->res->stall += ready - s->now;
	s->now = ready;
	for (uint32_t i = 0; i < s->K; i++)
		if (s->state[keys[i]] == K_LOADING && s->done[keys[i]] <= s->now)
			s->state[keys[i]] = K_RESIDENT;
	s->now += s->cfg->dense_cost + s->K;
	process_io(s, s->now);
	for (uint32_t i = 0; i < s->K; i++)
		s->pinned[keys[i]] = 0;
}

static void sim_free(struct sim *s)
{
	if (s->pf_ok)
		mp_prefetch_fini(&s->pf);
	if (s->pol_ok)
		mp_evict_fini(&s->pol);
	free(s->state);
	free(s->prefetched);
	free(s->wasted);
	free(s->pinned);
	free(s->done);
	free(s->chan_free);
	free(s->q);
	free(s->qidx);
	free(s->hints.next_use);
	free(s->hints.miss_w);
	free(s->sem);
	free(s->spec);
}

int mp_prefetch_simulate(const struct mp_sim_config *in, struct mp_sim_result *out)
{
	struct mp_sim_config cfg = *in;
	const struct mp_prefetch_ops *pops = mp_prefetch_find(cfg.prefetch);
	const struct mp_evict_ops *eops = mp_evict_find(cfg.evict);
	uint32_t nreq = mp_trace_requests(cfg.trace), ntrain, neval;
	struct mp_replay_seg *train = NULL, *eval = NULL;
	struct step *steps = NULL;
	uint64_t nsteps = 0, *next = NULL;
	struct sim s = { 0 };
	int err;

	memset(out, 0, sizeof(*out));
	err = mp_check_reserved(cfg.reserved, MP_ARRAY_SIZE(cfg.reserved), "simulator config");
	if (err)
		return err;
	if (!pops)
		return mp_err(-EINVAL, "unknown prefetch policy '%s' (%s)", cfg.prefetch ?: "",
			      mp_prefetch_names());
	if (!eops)
		return mp_err(-EINVAL, "unknown eviction policy '%s' (%s)", cfg.evict ?: "",
			      mp_evict_names());
	if (!cfg.train_fraction)
		cfg.train_fraction = 0.7;
	if (!cfg.load_cost)
		cfg.load_cost = 1.0;
	if (!cfg.dense_cost)
		cfg.dense_cost = 0.5;
	if (!cfg.io_channels)
		cfg.io_channels = 1;
	s.cfg = &cfg;
	s.res = out;
	s.t = cfg.trace;
	s.L = mp_trace_layers(s.t);
	s.J = mp_trace_experts(s.t);
	s.K = mp_trace_topk(s.t);
	s.nkeys = s.L * s.J;
	s.channels = cfg.io_channels;
	if (cfg.capacity < s.K + 1)
		return mp_err(-EINVAL, "simulated cache of %u experts cannot hold top-%u plus one",
			      cfg.capacity, s.K);
	s.truth = !strcmp(pops->name, "oracle") || !strcmp(eops->name, "belady");

	train = calloc(nreq + 1, sizeof(*train));
	eval = calloc(nreq + 1, sizeof(*eval));
	s.state = calloc(s.nkeys, 1);
	s.prefetched = calloc(s.nkeys, 1);
	s.wasted = calloc(s.nkeys, 1);
	s.pinned = calloc(s.nkeys, 1);
	s.done = calloc(s.nkeys, sizeof(double));
	s.chan_free = calloc(s.channels, sizeof(double));
	s.q = calloc(s.nkeys, sizeof(*s.q));
	s.qidx = malloc(s.nkeys * sizeof(*s.qidx));
	s.hints.next_use = malloc(s.nkeys * sizeof(uint64_t));
	s.sem = cfg.sem.dim ? malloc(cfg.sem.dim * sizeof(float)) : NULL;
	err = -ENOMEM;
	if (!train || !eval || !s.state || !s.prefetched || !s.wasted || !s.pinned || !s.done ||
	    !s.chan_free || !s.q || !s.qidx || !s.hints.next_use || (cfg.sem.dim && !s.sem))
		goto out;
	for (uint32_t k = 0; k < s.nkeys; k++)
		s.qidx[k] = -1;
	err = mp_replay_split(s.t, cfg.train_fraction, train, &ntrain, eval, &neval);
	if (err)
		goto out;
	for (uint32_t g = 0; cfg.max_tokens && g < neval; g++)
		if (eval[g].end - eval[g].begin > cfg.max_tokens)
			eval[g].end = eval[g].begin + cfg.max_tokens;

	struct mp_prefetch_env penv = {
		.layers = s.L, .experts = s.J, .topk = s.K, .distance = cfg.distance,
		.emap_capacity = cfg.emap_capacity, .trace = s.t, .sem_dim = cfg.sem.dim,
	};
	err = mp_prefetch_init(&s.pf, pops, &penv);
	if (err)
		goto out;
	s.pf_ok = true;
	s.spec = malloc((size_t)MP_MAX(s.pf.spec_rows, 1u) * s.J * sizeof(float));
	err = -ENOMEM;
	if (!s.spec)
		goto out;
	/* A layer's compute: its dense part and k expert FFNs of one unit each. */
	s.pf.load_ratio = (float)(cfg.load_cost / (cfg.dense_cost + s.K));
	s.hints.p = s.pf.it->hint_p;
	s.hints.miss_w = malloc(s.L * sizeof(float));
	err = -ENOMEM;
	if (!s.hints.miss_w)
		goto out;
	mp_prefetch_miss_weights(&s.pf, s.hints.miss_w);
	struct mp_evict_env eenv = {
		.nkeys = s.nkeys, .layers = s.L, .experts = s.J, .slots_per_layer = s.J,
		.hints = &s.hints,
	};
	err = mp_evict_init(&s.pol, eops, &eenv);
	if (err)
		goto out;
	s.pol_ok = true;

	learn(&s, train, ntrain);
	out->policy_ns = 0;	/* the evaluation's only */
	err = s.err;
	if (err)
		goto out;

	for (uint32_t g = 0; g < neval; g++)
		nsteps += eval[g].end - eval[g].begin;
	steps = malloc(nsteps * sizeof(*steps));
	err = -ENOMEM;
	if (!steps)
		goto out;
	nsteps = 0;
	for (uint32_t g = 0; g < neval; g++)
		for (uint32_t tok = eval[g].begin; tok < eval[g].end; tok++)
			steps[nsteps++] = (struct step){ g, tok };
	err = future(&s, eval, steps, nsteps, &next);
	if (err)
		goto out;

	s.hints.now = 0;
	for (uint64_t it = 0; it < nsteps; it++) {
		const struct mp_replay_seg *seg = &eval[steps[it].seg];

		if (!it || cfg.sem.dim) {
			sim_begin(&s, seg->request, steps[it].tok);
			take_items(&s, it);
		}
		for (uint32_t l = 0; l < s.L; l++)
			run_layer(&s, seg, steps[it].tok, l, it, next, nsteps, steps, eval);
		out->tokens++;
	}
	out->time = s.now;
	err = s.err;
out:
	free(next);
	free(steps);
	free(train);
	free(eval);
	sim_free(&s);
	return err;
}
