// SPDX-License-Identifier: MIT
/*
 * moepager bench --simulate: the speculative gates of a trace's positions,
 * a later layer's router applied to layer l's FFN input (through the later
 * layer's FFN norm) as the model computes it running the trace's own tokens
 * (routing forced to the trace's): what nextlayer and finemoe+nextlayer read
 * in a real run. A request's layer inputs are computed the first time the
 * simulator asks for one of its gates, with every expert in memory, so only
 * policies that use them pay for running the model. They are kept for the
 * next runs up to a memory limit (tokens x layers x hidden floats a request:
 * a long trace's would not fit); the requests past it are computed again in
 * every run, one at a time. A request runs only as far as the simulator
 * evaluates it (its evaluated part, cut at --max-tokens; session 34: it ran
 * every token of the request).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

struct bench_look {
	struct mp_store *store;
	const struct mp_trace *t;
	const struct bench_sem *sem;
	const struct cli_engine_opts *eng;
	struct mp_engine *e;
	struct mp_resident *res;
	uint32_t L, J, hidden, nreq;
	uint32_t *need;		/* [request]: tokens to run, the evaluated part's end (0: none) */
	uint64_t ran;		/* tokens run, every request and run together */
	float *routers;		/* [L][J][hidden] */
	float *norms;		/* [L][hidden]: the FFN norm weights */
	float **xs;		/* [request]: [tokens][L][hidden] layer inputs, NULL unless kept */
	float *cur;		/* the request being computed */
	uint64_t limit;		/* bytes of xs[] kept at most */
	uint64_t held;		/* bytes of xs[] kept */
	/*
	 * A request computed past the limit, until another one is: the
	 * simulator asks a request's positions in order, so once.
	 */
	float *spill;
	uint32_t spill_req;
	bool said;		/* the limit was said to be reached */
};

void bench_look_close(struct bench_look *b)
{
	if (!b)
		return;
	for (uint32_t r = 0; b->xs && r < b->nreq; r++)
		free(b->xs[r]);
	free(b->xs);
	free(b->need);
	free(b->spill);
	free(b->routers);
	free(b->norms);
	mp_resident_close(b->res);
	mp_engine_close(b->e);
	free(b);
}

/*
 * How far the simulator evaluates each request (mp_prefetch_simulate()'s
 * split, each evaluated part cut at max_tokens): the tokens to run.
 */
static int plan_need(struct bench_look *b, double train_fraction, uint32_t max_tokens)
{
	struct mp_replay_seg *train = calloc(b->nreq + 1, sizeof(*train));
	struct mp_replay_seg *eval = calloc(b->nreq + 1, sizeof(*eval));
	uint32_t ntrain, neval;
	int err = train && eval ? 0 : -ENOMEM;

	if (!err)
		err = mp_replay_split(b->t, train_fraction, train, &ntrain, eval, &neval);
	for (uint32_t g = 0; !err && g < neval; g++) {
		uint32_t end = eval[g].end;

		if (max_tokens && end - eval[g].begin > max_tokens)
			end = eval[g].begin + max_tokens;
		if (eval[g].request < b->nreq && end > b->need[eval[g].request])
			b->need[eval[g].request] = end;
	}
	free(train);
	free(eval);
	return err;
}

int bench_look_open(struct mp_store *s, const struct mp_trace *t, const struct bench_sem *sem,
		    const struct cli_engine_opts *eng, uint64_t limit, double train_fraction,
		    uint32_t max_tokens, struct bench_look **out)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	struct bench_look *b = calloc(1, sizeof(*b));
	int err;

	*out = NULL;
	if (!b)
		return -ENOMEM;
	b->store = s;
	b->t = t;
	b->sem = sem;
	b->eng = eng;
	b->L = g->layers;
	b->J = g->experts;
	b->hidden = g->hidden;
	b->nreq = mp_trace_requests(t);
	b->limit = limit;
	b->spill_req = UINT32_MAX;
	b->xs = calloc(b->nreq, sizeof(*b->xs));
	b->need = calloc(b->nreq, sizeof(*b->need));
	err = b->xs && b->need ? plan_need(b, train_fraction, max_tokens) : -ENOMEM;
	if (err) {
		bench_look_close(b);
		return cli_error(err, "speculative gates: the trace's evaluated part");
	}
	*out = b;
	return 0;
}

uint64_t bench_look_tokens(const struct bench_look *b)
{
	return b ? b->ran : 0;
}

/* Tensor blk.<layer>.<what> of n floats as f32 into out. Returns 0 or -errno (printed). */
static int read_f32(struct bench_look *b, const char *what, uint32_t layer, size_t n, float *out,
		    void *buf)
{
	const struct mp_tensor_info *ti;
	char name[MP_TENSOR_NAME_MAX];
	int err;

	snprintf(name, sizeof(name), "blk.%u.%s", layer, what);
	ti = mp_store_tensor(b->store, name);
	if (!ti || ti->bytes != n * mp_dtype_size(ti->dtype))
		return cli_error(-EINVAL, "%s: no %s of %zu values",
				 mp_store_path(b->store), name, n);
	err = mp_store_read_tensor(b->store, ti, buf);
	if (!err)
		mp_dtype_to_f32(ti->dtype, buf, out, n);
	return err;
}

/* The engine, every expert in memory, the routers and norms as f32, the first time they are needed. */
static int prepare(struct bench_look *b)
{
	struct mp_engine_config ec = { .threads = b->eng->threads };
	size_t per = (size_t)b->J * b->hidden;
	void *buf;
	int err;

	if (b->routers)
		return 0;
	err = mp_engine_open(b->eng->engine, &ec, &b->e);
	if (!err)
		err = mp_resident_open(b->store, NULL, NULL, &b->res);
	if (err) {
		cli_fail(err, "speculative gates");
		return err;
	}
	b->routers = malloc((size_t)b->L * per * sizeof(float));
	b->norms = malloc((size_t)b->L * b->hidden * sizeof(float));
	buf = malloc(per * sizeof(float));
	err = b->routers && b->norms && buf ? 0 : -ENOMEM;
	for (uint32_t l = 0; !err && l < b->L; l++) {
		err = read_f32(b, "router", l, per, b->routers + l * per, buf);
		if (!err)
			err = read_f32(b, "ffn_norm", l, b->hidden,
				       b->norms + (size_t)l * b->hidden, buf);
	}
	free(buf);
	if (err) {
		free(b->routers);
		b->routers = NULL;
	}
	return err;
}

static const void *look_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct bench_look *b = ctx;

	return mp_resident_source_ops()->expert(b->res, layer, expert);
}

/* Keeps layer's FFN input x at the request's (token, layer). */
static void look_gate(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		      const float *logits, uint32_t experts, const float *x, uint32_t hidden)
{
	struct bench_look *b = ctx;

	(void)logits;
	if (request >= b->nreq || experts != b->J || hidden != b->hidden ||
	    token >= b->need[request])
		return;
	memcpy(b->cur + ((size_t)token * b->L + layer) * b->hidden, x, hidden * sizeof(float));
}

static const struct mp_expert_source_ops look_ops = {
	.expert = look_expert,
	.gate = look_gate,
};

/*
 * Runs request r's tokens from position 0 up to the last one evaluated, as a
 * real run decodes them, keeping every gate: in xs[r] while the limit
 * allows, else in spill (the one before freed). Returns its layer inputs, or
 * NULL and *err.
 */
static const float *compute(struct bench_look *b, uint32_t r, int *err)
{
	uint32_t n = b->need[r], max = mp_store_geometry(b->store)->max_seq;
	struct mp_runner_config rc = { .source = &look_ops, .source_ctx = b, .trace = b->t,
				       .request = r, .max_seq = n + 2 < max ? n + 2 : max };
	uint64_t bytes = (uint64_t)n * b->L * b->hidden * sizeof(float);
	bool keep = b->held + bytes <= b->limit;
	struct mp_runner *run;

	*err = prepare(b);
	if (*err)
		return NULL;
	if (!keep) {
		free(b->spill);
		b->spill = NULL;
		b->spill_req = UINT32_MAX;
		if (!b->said)
			cli_say("speculative gates: request %u's layer inputs (%.1f MB) past "
				"--gates-memory (%.1f of %.1f MB held): computed again in every run",
				r, bytes / 1e6, b->held / 1e6, b->limit / 1e6);
		b->said = true;
	}
	b->cur = calloc((size_t)n * b->L * b->hidden, sizeof(float));
	if (!b->cur) {
		*err = -ENOMEM;
		return NULL;
	}
	rc.engine = b->e;
	*err = mp_runner_open(b->store, &rc, &run);
	if (!*err) {
		for (uint32_t tok = 0; !*err && tok < n; tok++)
			*err = mp_runner_step(run, bench_sem_token(b->sem, r, tok));
		mp_runner_close(run);
		b->ran += n;
	}
	if (*err) {
		cli_fail(*err, "speculative gates of request %u", r);
		free(b->cur);
		b->cur = NULL;
		return NULL;
	}
	if (keep) {
		b->xs[r] = b->cur;
		b->held += bytes;
	} else {
		b->spill = b->cur;
		b->spill_req = r;
	}
	b->cur = NULL;
	return keep ? b->xs[r] : b->spill;
}

/*
 * Layer target's router on layer's input through target's norm (x / w_layer
 * x w_target), as a softmax: what the prefetcher's speculate() computes.
 */
int bench_look_fn(void *arg, uint32_t request, uint32_t token, uint32_t layer, uint32_t target,
		  float *out)
{
	struct bench_look *b = arg;
	const float *x, *W, *wl, *wt;
	float max = -INFINITY;
	double sum = 0;
	int err = 0;

	/* Past the evaluated part: not run (the simulator asks for none there). */
	if (request >= b->nreq || token >= b->need[request] || target <= layer ||
	    target >= b->L)
		return -ERANGE;
	x = b->xs[request] ? b->xs[request] : b->spill_req == request ? b->spill :
	    compute(b, request, &err);
	if (!x)
		return err;
	x += ((size_t)token * b->L + layer) * b->hidden;
	W = b->routers + (size_t)target * b->J * b->hidden;
	wl = b->norms + (size_t)layer * b->hidden;
	wt = b->norms + (size_t)target * b->hidden;
	for (uint32_t j = 0; j < b->J; j++) {
		double acc = 0;

		for (uint32_t i = 0; i < b->hidden; i++)
			if (wl[i] != 0)
				acc += (double)W[(size_t)j * b->hidden + i] * (x[i] / wl[i] * wt[i]);
		out[j] = (float)acc;
		max = fmaxf(max, out[j]);
	}
	for (uint32_t j = 0; j < b->J; j++) {
		out[j] = expf(out[j] - max);
		sum += out[j];
	}
	for (uint32_t j = 0; j < b->J; j++)
		out[j] = (float)(out[j] / sum);
	return 0;
}
