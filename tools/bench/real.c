// SPDX-License-Identifier: MIT
/*
 * moepager bench, real runs: each policy or baseline decodes the evaluation
 * part of a trace in a child process (its own peak RSS; the mmap baseline
 * inside a memory cgroup), after the page cache was dropped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PROMPT_TOKEN 1u

/* The routing the runner reports goes to the real source, and trace positions to the prefetcher. */
struct feed {
	const struct mp_expert_source_ops *inner;
	void *inner_ctx;
	struct mp_prefetcher *pf;
	const struct mp_trace *t;
	uint32_t feed_from;
	/* The runner's last gate report: the layer input nextlayer speculates from. */
	float *x;
	uint32_t hidden;
	uint32_t x_layer, x_token;
	bool have_x;	/* first trace token fed to the prefetcher */
	bool semantic;	/* the token's embedding starts the prefetcher's iteration */
};

static const void *feed_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	struct feed *f = ctx;

	return f->inner->expert(f->inner_ctx, layer, expert);
}

static int feed_route(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		      const uint32_t *ids, const float *weights, uint32_t k)
{
	struct feed *f = ctx;
	int err = f->inner->route ? f->inner->route(f->inner_ctx, request, token, layer, ids,
						    weights, k) : 0;

	/* Decode steps report their trace token; the prompt reports MP_TOKEN_PROMPT. */
	if (err || !f->pf || token == MP_TOKEN_PROMPT || token < f->feed_from)
		return err;
	/*
	 * Never blocks: a full queue drops the event (counted by the prefetcher).
	 * The distribution is the trace's (the router's means nothing for forced
	 * routes); the layer input is the runner's.
	 */
	mp_prefetcher_gate(f->pf, request, token, layer, ids, weights, k,
			   mp_trace_probs(f->t, request, token, layer),
			   f->have_x && f->x_layer == layer && f->x_token == token ? f->x : NULL);
	f->have_x = false;
	return 0;
}

static void feed_gate(void *ctx, uint32_t request, uint32_t token, uint32_t layer,
		      const float *logits, uint32_t experts, const float *x, uint32_t hidden)
{
	struct feed *f = ctx;

	(void)request;
	(void)logits;
	(void)experts;
	if (!f->x || hidden != f->hidden)
		return;
	memcpy(f->x, x, hidden * sizeof(float));
	f->x_layer = layer;
	f->x_token = token;
	f->have_x = true;
}

static void feed_embed(void *ctx, uint32_t request, uint32_t token, const float *e,
		       uint32_t hidden)
{
	struct feed *f = ctx;

	(void)hidden;	/* the prefetcher was opened with the model's hidden size */
	if (f->pf && f->semantic && token >= f->feed_from)
		mp_prefetcher_begin(f->pf, request, token, e);	/* dropped: no prediction */
}

static int feed_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	struct feed *f = ctx;

	return f->inner->guard ? f->inner->guard(f->inner_ctx, fn, arg) : fn(arg);
}

static const struct mp_expert_source_ops feed_ops = {
	.expert = feed_expert,
	.route = feed_route,
	.guard = feed_guard,
	.gate = feed_gate,
	.embed = feed_embed,
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * The child
 */

struct child_ctx {
	const struct bench_opts *o;
	const struct bench_spec *spec;
	struct mp_store *store;
	const struct mp_trace *t;
	const struct bench_sem *sem;	/* the trace's tokens, or NULL */
	uint64_t budget;
	struct mp_replay_seg *train, *eval;
	uint32_t ntrain, neval;
};

/* The input of decode step tok: the trace's own token when it has them, else greedy. */
static uint32_t next_token(const struct child_ctx *c, const struct mp_runner *r,
			   uint32_t request, uint32_t tok)
{
	return c->sem ? bench_sem_token(c->sem, request, tok) : mp_runner_argmax(r);
}

/* Decodes one evaluation segment; the measured steps' wall time goes to *secs. */
static int decode_segment(struct child_ctx *c, struct mp_engine *e, struct feed *fd,
			  const struct mp_replay_seg *seg, uint32_t max_tokens,
			  void (*mark)(void *arg, bool start), void *arg, double *secs,
			  uint64_t *tokens)
{
	const struct mp_geometry *g = mp_store_geometry(c->store);
	struct mp_runner_config rc = { 0 };
	struct mp_runner *r = NULL;
	uint32_t prompt = PROMPT_TOKEN, end = seg->end;
	double t0;
	int err;

	if (max_tokens && end - seg->begin > max_tokens)
		end = seg->begin + max_tokens;
	rc.engine = e;
	rc.source = &feed_ops;
	rc.source_ctx = fd;
	rc.trace = c->t;
	rc.request = seg->request;
	rc.max_seq = end + 2 < g->max_seq ? end + 2 : g->max_seq;
	err = mp_runner_open(c->store, &rc, &r);
	if (err) {
		cli_fail(err, "runner");
		return err;
	}
	fd->feed_from = seg->begin;
	/* The trace's own tokens start at position 0, as they were recorded; else one prompt token. */
	err = c->sem ? 0 : mp_runner_prefill(r, &prompt, 1);
	/* Trace tokens before the segment (one-request traces) run unmeasured. */
	for (uint32_t tok = 0; !err && tok < seg->begin; tok++)
		err = mp_runner_step(r, next_token(c, r, seg->request, tok));
	if (fd->pf && !err)
		mp_prefetcher_flush(fd->pf, 10000);
	mark(arg, true);
	t0 = now_s();
	for (uint32_t tok = seg->begin; !err && tok < end; tok++) {
		err = mp_runner_step(r, next_token(c, r, seg->request, tok));
		if (!err)
			(*tokens)++;
	}
	*secs += now_s() - t0;
	mark(arg, false);
	if (err)
		cli_fail(err, "decode request %u", seg->request);
	mp_runner_close(r);
	return err;
}

struct pager_marks {
	struct mp_pager *p;
	struct mp_pager_stats before, sum;
};

static void pager_mark(void *arg, bool start)
{
	struct pager_marks *m = arg;
	struct mp_pager_stats now;

	if (start) {
		mp_pager_stats(m->p, &m->before);
		return;
	}
	mp_pager_stats(m->p, &now);
	m->sum.hits += now.hits - m->before.hits;
	m->sum.misses += now.misses - m->before.misses;
	m->sum.stall_ns += now.stall_ns - m->before.stall_ns;
	m->sum.caller_stall_ns += now.caller_stall_ns - m->before.caller_stall_ns;
	m->sum.prefetch_issued += now.prefetch_issued - m->before.prefetch_issued;
	m->sum.prefetch_used += now.prefetch_used - m->before.prefetch_used;
	m->sum.prefetch_wasted += now.prefetch_wasted - m->before.prefetch_wasted;
	m->sum.prefetch_late += now.prefetch_late - m->before.prefetch_late;
	m->sum.bytes_file += now.bytes_file - m->before.bytes_file;
	m->sum.fresh_bytes += now.fresh_bytes - m->before.fresh_bytes;
	m->sum.fill_cpu_ns += now.fill_cpu_ns - m->before.fill_cpu_ns;
}

static int child_policy(struct child_ctx *c, struct mp_engine *e, struct bench_result *res)
{
	bool truth = !strcmp(c->spec->prefetch, "oracle") || !strcmp(c->spec->evict, "belady");
	struct mp_pager_config pc;
	struct mp_prefetcher_config fc = { 0 };
	struct mp_prefetcher *pf = NULL;
	struct pager_marks marks = { 0 };
	struct mp_pager *p = NULL;
	struct feed fd = { 0 };
	int err;

	mp_pager_config_init(&pc);
	pc.budget_bytes = c->budget;
	pc.eviction = c->spec->evict;
	pc.fill_threads = c->o->fill_threads;
	err = mp_pager_open(c->store, &pc, &p);
	if (err) {
		cli_fail(err, "pager");
		return err;
	}
	fc.policy = c->spec->prefetch;
	fc.distance = c->o->distance;
	fc.emap_capacity = c->o->emap_capacity;
	fc.trace = truth ? c->t : NULL;
	fc.no_admit = c->o->no_admit;
	if (c->sem && !c->o->no_semantic) {
		fc.sem = (struct mp_sem_source){ bench_sem_dim(c->sem), bench_sem_fn,
						 (void *)c->sem };
		res->semantic = true;
	}
	err = mp_prefetcher_open(p, &fc, &pf);
	if (err) {
		cli_fail(err, "prefetcher");
		goto close_pager;
	}
	for (uint32_t i = 0; !err && i < c->ntrain; i++)
		err = mp_prefetcher_train(pf, c->t, c->train[i].request, c->train[i].begin,
					  c->train[i].end);
	if (!err && truth)
		err = mp_prefetcher_set_future(pf, c->eval, c->neval);
	if (err) {
		cli_fail(err, "prefetcher");
		goto close_pf;
	}
	fd = (struct feed){ .inner = mp_pager_source_ops(), .inner_ctx = p, .pf = pf, .t = c->t,
			    .semantic = res->semantic };
	fd.hidden = mp_store_geometry(c->store)->hidden;
	fd.x = calloc(fd.hidden, sizeof(float));
	if (!fd.x) {
		err = -ENOMEM;
		goto close_pf;
	}
	marks.p = p;
	for (uint32_t i = 0; !err && i < c->neval; i++)
		err = decode_segment(c, e, &fd, &c->eval[i], c->o->max_tokens, pager_mark, &marks,
				     &res->seconds, &res->tokens);
	res->uses = marks.sum.hits + marks.sum.misses;
	res->hits = marks.sum.hits;
	res->stall_seconds = cli_engine_stall_s(marks.sum.stall_ns, marks.sum.caller_stall_ns,
						e->threads);
	res->prefetch_issued = marks.sum.prefetch_issued;
	res->prefetch_used = marks.sum.prefetch_used;
	res->prefetch_wasted = marks.sum.prefetch_wasted;
	res->prefetch_late = marks.sum.prefetch_late;
	res->bytes_read = marks.sum.bytes_file;
	res->fresh_bytes = marks.sum.fresh_bytes;
	res->fill_cpu_ns = marks.sum.fill_cpu_ns;
	struct mp_prefetcher_stats ps;
	struct mp_pager_stats st;

	/* The pager's own count: --fill-threads is checked to have reached it. */
	mp_pager_stats(p, &st);
	res->fill_threads = (uint32_t)st.fill_threads;
	mp_prefetcher_stats(pf, &ps);
	res->events_dropped = ps.dropped;
	res->expired = ps.expired;
	res->policy_ns = ps.policy_ns;
	res->emap_bytes = ps.emap_bytes;
	res->emap_records = ps.emap_records;
	res->load_ratio = ps.load_ratio;
close_pf:
	free(fd.x);
	mp_prefetcher_close(pf);
close_pager:
	mp_pager_close(p);
	return err;
}

struct base_marks {
	void (*stats)(const void *src, struct bench_source_stats *out);
	const void *src;
	struct bench_source_stats before, sum;
};

static void base_mark(void *arg, bool start)
{
	struct base_marks *m = arg;
	struct bench_source_stats now;

	if (start) {
		m->stats(m->src, &m->before);
		return;
	}
	m->stats(m->src, &now);
	m->sum.uses += now.uses - m->before.uses;
	m->sum.hits += now.hits - m->before.hits;
	m->sum.bytes_read += now.bytes_read - m->before.bytes_read;
	m->sum.stall_ns += now.stall_ns - m->before.stall_ns;
}

static void mmap_stats(const void *src, struct bench_source_stats *out)
{
	bench_mmap_stats(src, out);
}

static void pread_stats(const void *src, struct bench_source_stats *out)
{
	bench_pread_stats(src, out);
}

static int child_baseline(struct child_ctx *c, struct mp_engine *e, struct bench_result *res)
{
	bool mm = c->spec->baseline == BENCH_MMAP;
	struct bench_mmap *bm = NULL;
	struct bench_pread *bp = NULL;
	struct base_marks marks = { 0 };
	struct feed fd = { 0 };
	struct memcg cg;
	int err;

	if (mm) {
		uint64_t used = 0;

		/*
		 * The budget covers expert pages only: the cgroup's limit is what
		 * the process holds once the runner has its non-expert tensors, KV
		 * cache and engine buffers (measured after a first runner open),
		 * plus the budget.
		 */
		err = memcg_enter(&cg);
		if (err)
			return cli_error(err, "mmap: cannot enter a memory cgroup: %s",
				strerror(-err));
		err = bench_mmap_open(c->store, &bm);
		if (err)
			goto out;
		struct mp_runner_config rc = { .engine = e, .source = bench_mmap_ops(),
					       .source_ctx = bm };
		struct mp_runner *r;

		err = mp_runner_open(c->store, &rc, &r);
		if (err) {
			cli_fail(err, "runner");
			goto out;
		}
		err = memcg_read(&cg, cg.v2 ? "memory.current" : "memory.usage_in_bytes", &used);
		mp_runner_close(r);
		if (!err)
			err = memcg_write(&cg, cg.v2 ? "memory.max" : "memory.limit_in_bytes",
					  used + c->budget);
		if (err) {
			cli_error(0, "mmap: cannot limit the cgroup %s: %s",
				cg.dir, strerror(-err));
			goto out;
		}
		snprintf(res->cache_note, sizeof(res->cache_note), "memcg %s limit %llu",
			 cg.v2 ? "v2" : "v1", (unsigned long long)(used + c->budget));
		fd = (struct feed){ .inner = bench_mmap_ops(), .inner_ctx = bm, .t = c->t };
		marks.stats = mmap_stats;
		marks.src = bm;
	} else {
		err = bench_pread_open(c->store, c->budget, &bp);
		if (err)
			return err;
		fd = (struct feed){ .inner = bench_pread_ops(), .inner_ctx = bp, .t = c->t };
		marks.stats = pread_stats;
		marks.src = bp;
	}
	for (uint32_t i = 0; !err && i < c->neval; i++)
		err = decode_segment(c, e, &fd, &c->eval[i], c->o->max_tokens, base_mark, &marks,
				     &res->seconds, &res->tokens);
	res->uses = marks.sum.uses;
	res->hits = marks.sum.hits;
	res->stall_seconds = marks.sum.stall_ns / 1e9;
	res->bytes_read = marks.sum.bytes_read;
out:
	bench_mmap_close(bm);
	bench_pread_close(bp);
	return err;
}

static int child_main(struct child_ctx *c, struct bench_result *res)
{
	struct mp_engine_config ec = { .threads = c->o->eng.threads };
	struct mp_engine *e;
	int err;

	err = mp_engine_open(c->o->eng.engine, &ec, &e);
	if (err) {
		cli_fail(err, "engine");
		return err;
	}
	err = c->spec->baseline == BENCH_POLICY ? child_policy(c, e, res) :
	      child_baseline(c, e, res);
	mp_engine_close(e);
	return err;
}

/* Drops clean page cache (root), so every run starts cold; says what happened. */
static void drop_caches(char *note, size_t len)
{
	int fd;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd >= 0 && write(fd, "3\n", 2) == 2) {
		snprintf(note, len, "dropped (echo 3 > /proc/sys/vm/drop_caches)");
	} else {
		snprintf(note, len, "not dropped (%s): reads may hit a warm page cache",
			 strerror(errno));
	}
	if (fd >= 0)
		close(fd);
}

static ssize_t read_full(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : (ssize_t)got;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

int bench_run_real(const struct bench_opts *o, const struct bench_spec *spec,
		   struct mp_store *store, const struct mp_trace *t, const char *trace_path,
		   const struct bench_sem *sem, uint64_t budget_bytes, struct bench_result *out)
{
	uint32_t nreq = mp_trace_requests(t);
	struct child_ctx c = { o, spec, store, t, sem, budget_bytes, NULL, NULL, 0, 0 };
	char note[96];
	struct rusage ru;
	int pipefd[2], status, err;
	pid_t pid = -1;
	ssize_t n;

	memset(out, 0, sizeof(*out));
	c.train = calloc(nreq + 1, sizeof(*c.train));
	c.eval = calloc(nreq + 1, sizeof(*c.eval));
	if (!c.train || !c.eval) {
		err = -ENOMEM;
		goto out;
	}
	err = mp_replay_split(t, o->train_fraction, c.train, &c.ntrain, c.eval, &c.neval);
	if (err) {
		cli_fail(err, "%s", trace_path);
		goto out;
	}
	/* --max-tokens shortens every evaluated segment (the future the oracle sees too). */
	for (uint32_t i = 0; o->max_tokens && i < c.neval; i++)
		if (c.eval[i].end - c.eval[i].begin > o->max_tokens)
			c.eval[i].end = c.eval[i].begin + o->max_tokens;
	if (!o->no_drop)
		drop_caches(note, sizeof(note));
	else
		snprintf(note, sizeof(note), "not dropped (--no-drop-caches)");
	if (pipe2(pipefd, O_CLOEXEC)) {
		err = -errno;
		goto out;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		err = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		goto out;
	}
	if (pid == 0) {
		struct bench_result r = { 0 };
		int e;

		close(pipefd[0]);
		e = child_main(&c, &r);
		if (!e && write(pipefd[1], &r, sizeof(r)) != sizeof(r))
			e = -EIO;
		_exit(e ? 1 : 0);
	}
	close(pipefd[1]);
	n = read_full(pipefd[0], out, sizeof(*out));
	close(pipefd[0]);
	while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)sizeof(*out) || !WIFEXITED(status) || WEXITSTATUS(status)) {
		err = cli_error(-EIO, "%s with %s: the run failed (%s)", spec->prefetch, trace_path,
				WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "error");
		goto out;
	}
	out->peak_rss = (uint64_t)ru.ru_maxrss * 1024;
	if (spec->baseline == BENCH_MMAP && out->cache_note[0]) {
		char both[sizeof(out->cache_note)];

		snprintf(both, sizeof(both), "%.40s; %.50s", note, out->cache_note);
		memcpy(out->cache_note, both, sizeof(both));
	} else {
		snprintf(out->cache_note, sizeof(out->cache_note), "%s", note);
	}
out:
	/* The mmap child's cgroup is empty once it exited: remove it. */
	if (spec->baseline == BENCH_MMAP && pid > 0) {
		char dir[PATH_MAX];
		struct memcg base;

		if (!memcg_base(&base)) {
			memcg_child_dir(&base, pid, dir, sizeof(dir));
			rmdir(dir);
		}
	}
	free(c.train);
	free(c.eval);
	return err;
}
