// SPDX-License-Identifier: MIT
/* BPF trajectory recording: USDT routes, page faults, pager probes, pinned maps, drops. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "helpers.h"
#include "base/probes.h"

#define LAYERS		4
#define EXPERTS		8
#define TOPK		2

/* Fails under CI (or MOEPAGER_REQUIRE_BPF=1), else skips, when BPF cannot run here. */
static void require_bpf(int err)
{
	if (err != -EPERM && err != -EOPNOTSUPP && err != -EACCES)
		return;
	if (t_require_all())
		fail_msg("BPF unavailable (%s) but required: %s", strerror(-err), mp_last_error());
	skip();
}

/* A build without <sys/sdt.h> has no probes to record (meson -Dusdt=disabled). */
static void require_probes(void)
{
	if (MP_PROBES_ENABLED)
		return;
	if (t_require_all())
		fail_msg("built without <sys/sdt.h>: no probes to record");
	skip();
}

static int open_bpf(struct mp_traj_opts *o, struct mp_traj **t)
{
	int err;

	o->source = MP_TRAJ_SRC_BPF;
	err = mp_traj_open(o, t);
	require_bpf(err);
	assert_int_equal(err, 0);
	assert_int_equal(mp_traj_source(*t), MP_TRAJ_SRC_BPF);
	return 0;
}

/* A random routing trace of 2 requests (5 and 3 tokens), written as moe-trace v1. */
static const char *write_trace(void)
{
	const char *path = t_path("route.csv");
	FILE *f = fopen(path, "w");
	unsigned seed = 12345;

	assert_non_null(f);
	fprintf(f, "# moe-trace v1\n# layers=%d\n# experts=%d\n# topk=%d\n# requests=2\n"
		"request,token,layer,e0,e1,w0,w1\n", LAYERS, EXPERTS, TOPK);
	for (int r = 0; r < 2; r++)
		for (int tok = 0; tok < (r ? 3 : 5); tok++)
			for (int l = 0; l < LAYERS; l++) {
				int e0 = rand_r(&seed) % EXPERTS;
				int e1 = rand_r(&seed) % (EXPERTS - 1);
				float w0 = (float)(rand_r(&seed) % 1000000) / 1e6f;

				e1 += e1 >= e0;	/* distinct */
				fprintf(f, "%d,%d,%d,%d,%d,%.9g,%.9g\n", r, tok, l, e0, e1,
					(double)w0, (double)(1.0f - w0));
			}
	assert_int_equal(fclose(f), 0);
	return path;
}

struct recs {
	struct mp_traj_rec *r;
	size_t n, cap;
};

static int collect(const struct mp_traj_rec *r, void *arg)
{
	struct recs *c = arg;

	if (c->n == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 256;
		c->r = realloc(c->r, c->cap * sizeof(*c->r));
		assert_non_null(c->r);
	}
	c->r[c->n++] = *r;
	return 0;
}

static void drain(struct mp_traj *t, struct recs *c)
{
	int n;

	do {
		n = mp_traj_poll(t, 0, collect, c);
		assert_true(n >= 0);
	} while (n > 0);
}

/* Every route record matches the trace row of its (request, token, layer), each row once. */
static void assert_routes_equal_trace(const struct recs *c, const struct mp_trace *tr)
{
	uint32_t rows = 0;
	uint8_t seen[2][8][LAYERS] = { 0 };

	for (size_t i = 0; i < c->n; i++) {
		const struct mp_traj_rec *r = &c->r[i];
		const uint32_t *ids;
		const float *w;

		if (r->kind != MP_TRAJ_ROUTE)
			continue;
		assert_true(r->request < 2 && r->token < 8 && r->layer < LAYERS);
		assert_int_equal(mp_trace_route(tr, r->request, r->token, r->layer, &ids, &w), 0);
		assert_int_equal(r->k, TOPK);
		assert_int_equal(r->ids[0], ids[0]);
		assert_int_equal(r->ids[1], ids[1]);
		assert_true(r->flags & MP_TRAJ_F_WEIGHTS);
		assert_memory_equal(r->weights, w, TOPK * sizeof(float));
		assert_int_equal(seen[r->request][r->token][r->layer]++, 0);
		rows++;
	}
	assert_int_equal(rows, (5 + 3) * LAYERS);
}

static bool is_bpffs(const char *path)
{
	struct statfs st;

	/* 0xcafe4a11: BPF_FS_MAGIC */
	return !statfs(path, &st) && (unsigned long)st.f_type == 0xcafe4a11;
}

static pid_t spawn_fire(const char *trace, int *go_fd)
{
	const char *root = getenv("MOEPAGER_BUILD_ROOT");
	char exe[1024];
	int p[2];
	pid_t pid;

	assert_non_null(root);
	snprintf(exe, sizeof(exe), "%s/tests/traj_fire", root);
	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		dup2(p[0], 0);
		close(p[1]);
		if (!freopen("/dev/null", "w", stdout))
			_exit(126);
		execl(exe, exe, trace, "--wait", (char *)NULL);
		_exit(127);
	}
	close(p[0]);
	*go_fd = p[1];
	return pid;
}

static void wait_exit0(pid_t pid)
{
	int st;

	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

struct count_sums {
	uint64_t routed[LAYERS][EXPERTS];
	uint64_t trans[LAYERS][EXPERTS][EXPERTS];
	uint64_t page_faults[LAYERS][EXPERTS];
	uint64_t faulted[LAYERS][EXPERTS][EXPERTS];
	uint64_t demand[LAYERS][EXPERTS], prefetches[LAYERS][EXPERTS], evictions[LAYERS][EXPERTS];
};

static int sum_expert(const struct mp_traj_expert_stats *s, void *arg)
{
	struct count_sums *c = arg;

	assert_true(s->layer < LAYERS && s->expert < EXPERTS);
	c->routed[s->layer][s->expert] = s->routed;
	c->page_faults[s->layer][s->expert] = s->page_faults;
	c->demand[s->layer][s->expert] = s->demand_faults;
	c->prefetches[s->layer][s->expert] = s->prefetches;
	c->evictions[s->layer][s->expert] = s->evictions;
	return 0;
}

static int sum_trans(const struct mp_traj_transition *t, void *arg)
{
	struct count_sums *c = arg;

	assert_true(t->layer + 1 < LAYERS && t->from < EXPERTS && t->to < EXPERTS);
	c->trans[t->layer][t->from][t->to] = t->routed;
	c->faulted[t->layer][t->from][t->to] = t->faulted;
	return 0;
}

/* What the maps must hold after replaying the trace once. */
static void expected_from_trace(const struct mp_trace *tr, struct count_sums *want)
{
	memset(want, 0, sizeof(*want));
	for (uint32_t r = 0; r < mp_trace_requests(tr); r++)
		for (uint32_t tok = 0; tok < mp_trace_tokens(tr, r); tok++)
			for (uint32_t l = 0; l < LAYERS; l++) {
				const uint32_t *ids, *next;
				const float *w;

				assert_int_equal(mp_trace_route(tr, r, tok, l, &ids, &w), 0);
				for (int i = 0; i < TOPK; i++)
					want->routed[l][ids[i]]++;
				if (l + 1 == LAYERS)
					continue;
				assert_int_equal(mp_trace_route(tr, r, tok, l + 1, &next, &w), 0);
				for (int i = 0; i < TOPK; i++)
					for (int j = 0; j < TOPK; j++)
						want->trans[l][ids[i]][next[j]]++;
			}
}

static json_t *bpftool_dump(const char *pin)
{
	char cmd[1024], buf[1 << 16];
	json_error_t jerr;
	size_t n;
	json_t *j;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "bpftool -j map dump pinned %s 2>&1", pin);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = 0;
	assert_int_equal(pclose(p), 0);
	j = json_loads(buf, 0, &jerr);
	if (!j)
		fail_msg("bpftool output is not JSON (%s): %.200s", jerr.text, buf);
	assert_true(json_is_array(j));
	return j;
}

/* The field of a bpftool entry's BTF-formatted key or value, by name. */
static json_int_t field(json_t *entry, const char *part, const char *name)
{
	json_t *v = json_object_get(json_object_get(json_object_get(entry, "formatted"), part),
				    name);

	if (!json_is_integer(v))
		fail_msg("bpftool entry has no formatted %s.%s", part, name);
	return json_integer_value(v);
}

static void route_probes_in_libmoepager_recorded_exactly(void **state)
{
	struct mp_traj_opts o = { .pin = true };
	struct count_sums got = { 0 }, want;
	struct recs c = { 0 };
	struct mp_trace *tr;
	struct mp_traj_stats st;
	struct mp_traj *t;
	char pin[256], path[300];
	struct stat sb;
	int go, n;
	bool mounted;
	json_t *j;
	pid_t pid;

	(void)state;
	t_log_capture();
	t_log_reset();
	mounted = is_bpffs("/sys/fs/bpf");
	assert_int_equal(mp_trace_open(write_trace(), &tr), 0);
	pid = spawn_fire(t_path("route.csv"), &go);
	/* The child is blocked before its first probe: libmoepager.so is mapped by then. */
	o.pid = pid;
	for (int i = 0; i < 200; i++) {
		char maps[64], line[512];
		bool mapped = false;
		FILE *f;

		snprintf(maps, sizeof(maps), "/proc/%d/maps", pid);
		f = fopen(maps, "r");
		while (f && fgets(line, sizeof(line), f))
			mapped |= strstr(line, "libmoepager.so") != NULL;
		if (f)
			fclose(f);
		if (mapped)
			break;
		usleep(10000);
	}
	open_bpf(&o, &t);
	require_probes();
	assert_int_equal(mp_traj_start(t), 0);
	assert_non_null(strstr(mp_traj_binary(t), "libmoepager.so"));
	snprintf(pin, sizeof(pin), "/sys/fs/bpf/moepager/%d", pid);
	assert_string_equal(mp_traj_pin_dir(t), pin);
	assert_int_equal(stat(pin, &sb), 0);
	/* bpffs is not mounted at boot here: the recorder mounts it and says so. */
	assert_true(is_bpffs("/sys/fs/bpf"));
	if (!mounted)
		assert_true(t_log_contains("mounted bpffs on /sys/fs/bpf (it was not mounted)"));

	assert_int_equal(write(go, "g", 1), 1);
	close(go);
	wait_exit0(pid);
	drain(t, &c);
	assert_routes_equal_trace(&c, tr);
	assert_int_equal(mp_traj_stats(t, &st), 0);
	assert_int_equal(st.dropped, 0);
	assert_int_equal(st.bad_args, 0);
	assert_int_equal(st.records, c.n);
	assert_true(st.probes_attached >= 1);

	/* The counts the BPF side keeps agree with the trace. */
	expected_from_trace(tr, &want);
	assert_true(mp_traj_expert_stats(t, sum_expert, &got) > 0);
	assert_true(mp_traj_transitions(t, sum_trans, &got) > 0);
	assert_memory_equal(got.routed, want.routed, sizeof(want.routed));
	assert_memory_equal(got.trans, want.trans, sizeof(want.trans));

	/* bpftool prints the pinned maps with named fields, and the same numbers. */
	snprintf(path, sizeof(path), "%s/expert_stats", pin);
	j = bpftool_dump(path);
	n = 0;
	for (size_t i = 0; i < json_array_size(j); i++) {
		json_t *e = json_array_get(j, i);
		json_int_t l = field(e, "key", "layer"), x = field(e, "key", "expert");

		assert_true(l >= 0 && l < LAYERS && x >= 0 && x < EXPERTS);
		assert_int_equal(field(e, "value", "routed"), want.routed[l][x]);
		assert_int_equal(field(e, "value", "page_faults"), 0);
		n++;
	}
	json_decref(j);
	assert_true(n > 0);
	snprintf(path, sizeof(path), "%s/transitions", pin);
	j = bpftool_dump(path);
	for (size_t i = 0; i < json_array_size(j); i++) {
		json_t *e = json_array_get(j, i);

		assert_int_equal(field(e, "value", "routed"),
				 want.trans[field(e, "key", "layer")][field(e, "key", "from")]
					   [field(e, "key", "to")]);
	}
	json_decref(j);

	/* Pins go when recording ends. */
	assert_int_equal(mp_traj_stop(t), 0);
	assert_int_equal(stat(pin, &sb), -1);
	assert_int_equal(errno, ENOENT);
	assert_null(mp_traj_pin_dir(t));
	mp_traj_close(t);
	mp_trace_close(tr);
	free(c.r);
}

/* The test binary links the library statically: the probes are in /proc/self/exe. */
static void route_probes_in_own_executable_recorded(void **state)
{
	struct mp_traj_opts o = { 0 };
	struct recs c = { 0 };
	struct mp_trace *tr;
	struct mp_traj *t;
	char exe[4096];
	ssize_t n;

	(void)state;
	assert_int_equal(mp_trace_open(write_trace(), &tr), 0);
	open_bpf(&o, &t);
	require_probes();
	assert_int_equal(mp_traj_start(t), 0);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	assert_true(n > 0);
	exe[n] = 0;
	assert_string_equal(mp_traj_binary(t), exe);
	assert_null(mp_traj_pin_dir(t));
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t tok = 0; tok < mp_trace_tokens(tr, r); tok++)
			for (uint32_t l = 0; l < LAYERS; l++) {
				const uint32_t *ids;
				const float *w;

				assert_int_equal(mp_trace_route(tr, r, tok, l, &ids, &w), 0);
				assert_int_equal(mp_traj_route(NULL, r, tok, l, TOPK, ids, w), 0);
			}
	drain(t, &c);
	assert_routes_equal_trace(&c, tr);
	mp_traj_close(t);
	mp_trace_close(tr);
	free(c.r);
}

/*
 * A plain anonymous mapping described as 3 layers x 4 slots of 64 KiB:
 * each written page faults once, and the program attributes it.
 */
static void page_faults_attributed_to_layer_and_expert(void **state)
{
	enum { PF_LAYERS = 3, PF_SLOTS = 4, SLOT = 64 << 10 };
	static const struct { int layer, expert, pages; } touch[] = {
		{ 0, 1, 3 }, { 1, 2, 1 }, { 2, 3, 16 }, { 0, 0, 5 }, { 1, 3, 2 },
	};
	long page = sysconf(_SC_PAGESIZE);
	struct mp_traj_opts o = { .pin = true };
	uint64_t want[PF_LAYERS][PF_SLOTS] = { 0 }, seen[PF_LAYERS][PF_SLOTS] = { 0 };
	struct count_sums got = { 0 };
	struct recs c = { 0 };
	struct mp_traj *t;
	char *range, *outside;
	char path[300];
	json_t *j;

	(void)state;
	range = mmap(NULL, (size_t)PF_LAYERS * PF_SLOTS * SLOT, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	outside = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(range != MAP_FAILED && outside != MAP_FAILED);
	/* One fault per 4 KiB page: no transparent huge page may fill a slot at once. */
	assert_int_equal(madvise(range, (size_t)PF_LAYERS * PF_SLOTS * SLOT, MADV_NOHUGEPAGE), 0);
	o.range = (struct mp_traj_range){ (uintptr_t)range, SLOT, PF_SLOTS, PF_LAYERS };
	open_bpf(&o, &t);
	assert_int_equal(mp_traj_start(t), 0);

	for (size_t i = 0; i < sizeof(touch) / sizeof(touch[0]); i++) {
		char *slot = range + ((size_t)touch[i].layer * PF_SLOTS + touch[i].expert) * SLOT;

		for (int p = 0; p < touch[i].pages; p++)
			*(volatile char *)(slot + (size_t)p * page) = 1;
		want[touch[i].layer][touch[i].expert] += touch[i].pages;
	}
	for (int p = 0; p < 4; p++)
		*(volatile char *)(outside + (size_t)p * page) = 1;
	/* Touched again: present pages do not fault. */
	*(volatile char *)(range + SLOT) = 2;

	drain(t, &c);
	for (size_t i = 0; i < c.n; i++) {
		const struct mp_traj_rec *r = &c.r[i];
		uint64_t slot;

		assert_int_equal(r->kind, MP_TRAJ_PGFAULT);
		assert_int_equal(r->request, MP_TRAJ_NONE);
		assert_int_equal(r->tid, (uint32_t)gettid());
		assert_true(r->value >= (uintptr_t)range);
		slot = (r->value - (uintptr_t)range) / SLOT;
		assert_int_equal(r->layer, slot / PF_SLOTS);
		assert_int_equal(r->expert, slot % PF_SLOTS);
		seen[r->layer][r->expert]++;
	}
	assert_memory_equal(seen, want, sizeof(want));

	assert_true(mp_traj_expert_stats(t, sum_expert, &got) > 0);
	for (int l = 0; l < PF_LAYERS; l++)
		for (int e = 0; e < PF_SLOTS; e++) {
			assert_int_equal(got.page_faults[l][e], want[l][e]);
			assert_int_equal(got.routed[l][e], 0);
		}
	/* Same thread: (0,1) -> (1,2) -> (2,3), then (0,0) -> (1,3). */
	assert_true(mp_traj_transitions(t, sum_trans, &got) > 0);
	assert_int_equal(got.faulted[0][1][2], 1);
	assert_int_equal(got.faulted[1][2][3], 1);
	assert_int_equal(got.faulted[0][0][3], 1);
	{
		uint64_t total = 0;

		for (int l = 0; l < LAYERS; l++)
			for (int a = 0; a < EXPERTS; a++)
				for (int b = 0; b < EXPERTS; b++)
					total += got.faulted[l][a][b];
		assert_int_equal(total, 3);
	}

	snprintf(path, sizeof(path), "%s/expert_stats", mp_traj_pin_dir(t));
	j = bpftool_dump(path);
	assert_int_equal(json_array_size(j), 5);
	for (size_t i = 0; i < json_array_size(j); i++) {
		json_t *e = json_array_get(j, i);

		assert_int_equal(field(e, "value", "page_faults"),
				 want[field(e, "key", "layer")][field(e, "key", "expert")]);
	}
	json_decref(j);
	mp_traj_close(t);
	munmap(range, (size_t)PF_LAYERS * PF_SLOTS * SLOT);
	munmap(outside, 4 * page);
	free(c.r);
}

static int hist_get(const struct mp_traj_hist *h, void *arg)
{
	struct mp_traj_hist *out = arg;

	if (h->tier < 2)
		out[h->tier] = *h;
	return 0;
}

/* fault_done fills the per-tier log2 histogram; prefetch and evict count per expert. */
static void pager_probes_fill_histogram_and_counts(void **state)
{
	static const uint64_t lat[] = { 1, 1000, 1023, 1024, 150000, 150000, 3000000000ull };
	struct mp_traj_hist h[2] = { 0 };
	struct mp_traj_opts o = { 0 };
	struct count_sums got = { 0 };
	struct recs c = { 0 };
	struct mp_traj *t;
	uint64_t sum = 0;

	(void)state;
	open_bpf(&o, &t);
	require_probes();
	assert_int_equal(mp_traj_start(t), 0);
	for (size_t i = 0; i < sizeof(lat) / sizeof(lat[0]); i++) {
		MP_PROBE(fault_begin, 2, 5, 1, 0x1000 * i);
		MP_PROBE(fault_done, 2, 5, 1, lat[i], 0);
		sum += lat[i];
	}
	MP_PROBE(fault_done, 3, 7, 0, 2000, -EIO);
	MP_PROBE(prefetch_issue, 1, 4, 0);
	MP_PROBE(prefetch_done, 1, 4, 0, 5000, 0);
	MP_PROBE(prefetch_done, 1, 4, 0, 5000, -EIO);
	MP_PROBE(evict, 1, 4, 1 << 21);
	drain(t, &c);

	assert_int_equal(mp_traj_fault_latency(t, hist_get, h), 2);
	assert_int_equal(h[1].count, 7);
	assert_int_equal(h[1].sum_ns, sum);
	assert_int_equal(h[1].slots[0], 1);	/* 1 ns */
	assert_int_equal(h[1].slots[9], 2);	/* 1000, 1023 */
	assert_int_equal(h[1].slots[10], 1);	/* 1024 */
	assert_int_equal(h[1].slots[17], 2);	/* 150000 in [131072, 262144) */
	assert_int_equal(h[1].slots[31], 1);	/* 3e9 in [2^31, 2^32) */
	assert_int_equal(h[0].count, 1);
	assert_int_equal(h[0].slots[10], 1);

	assert_true(mp_traj_expert_stats(t, sum_expert, &got) > 0);
	assert_int_equal(got.demand[2][5], 7);
	assert_int_equal(got.demand[3][7], 1);
	assert_int_equal(got.prefetches[1][4], 1);	/* the failed one is not counted */
	assert_int_equal(got.evictions[1][4], 1);

	/* Records: 7 begin + 8 done + issue + 2 prefetch done + evict, in firing order. */
	assert_int_equal(c.n, 19);
	assert_int_equal(c.r[0].kind, MP_TRAJ_FAULT_BEGIN);
	assert_int_equal(c.r[0].layer, 2);
	assert_int_equal(c.r[0].expert, 5);
	assert_int_equal(c.r[0].tier, 1);
	assert_int_equal(c.r[2].value, 0x1000);
	assert_int_equal(c.r[1].kind, MP_TRAJ_FAULT_DONE);
	assert_int_equal(c.r[1].value, 1);
	assert_int_equal(c.r[14].kind, MP_TRAJ_FAULT_DONE);
	assert_int_equal(c.r[14].err, -EIO);
	assert_int_equal(c.r[15].kind, MP_TRAJ_PREFETCH_ISSUE);
	assert_int_equal(c.r[17].err, -EIO);
	assert_int_equal(c.r[18].kind, MP_TRAJ_EVICT);
	assert_int_equal(c.r[18].value, 1 << 21);
	mp_traj_close(t);
	free(c.r);
}

/* A full ring loses records, never counts: drops are reported exactly. */
static void full_ring_drops_are_counted_and_counts_stay_exact(void **state)
{
	struct mp_traj_opts o = { .ring_bytes = 4096 };
	const uint32_t ids[TOPK] = { 3, 6 };
	struct count_sums got = { 0 };
	struct mp_traj_stats st;
	struct recs c = { 0 };
	struct mp_traj *t;

	(void)state;
	open_bpf(&o, &t);
	require_probes();
	assert_int_equal(mp_traj_start(t), 0);
	for (uint32_t i = 0; i < 100; i++)
		assert_int_equal(mp_traj_route(NULL, 0, i, 0, TOPK, ids, NULL), 0);
	drain(t, &c);
	assert_int_equal(mp_traj_stats(t, &st), 0);
	assert_true(c.n > 0 && c.n < 100);
	assert_int_equal(st.dropped + c.n, 100);
	assert_false(c.r[0].flags & MP_TRAJ_F_WEIGHTS);
	assert_true(mp_traj_expert_stats(t, sum_expert, &got) > 0);
	assert_int_equal(got.routed[0][3], 100);
	assert_int_equal(got.routed[0][6], 100);
	mp_traj_close(t);
	free(c.r);
}

/* Pins a test kept: removed by the teardown even when the test failed. */
static char kept_pin[256];

static int remove_kept_pins(void **state)
{
	char path[512];

	(void)state;
	if (!kept_pin[0])
		return 0;
	for (const char *m = "expert_stats\0transitions\0fault_latency\0"; *m; m += strlen(m) + 1) {
		snprintf(path, sizeof(path), "%s/%s", kept_pin, m);
		unlink(path);
	}
	rmdir(kept_pin);
	rmdir("/sys/fs/bpf/moepager");
	kept_pin[0] = 0;
	return 0;
}

static void keep_pins_leaves_maps_and_busy_dir_is_eexist(void **state)
{
	struct mp_traj_opts o = { .pin = true, .keep_pins = true };
	struct mp_traj *t, *t2;
	char pin[256], path[300];
	struct stat sb;

	(void)state;
	t_log_capture();
	open_bpf(&o, &t);
	require_probes();
	assert_int_equal(mp_traj_start(t), 0);
	snprintf(pin, sizeof(pin), "%s", mp_traj_pin_dir(t));
	snprintf(kept_pin, sizeof(kept_pin), "%s", pin);
	/* A second recorder of the same pid must not take over the pins. */
	o.keep_pins = false;
	open_bpf(&o, &t2);
	t_log_reset();
	assert_int_equal(mp_traj_start(t2), -EEXIST);
	assert_true(t_log_contains("is in use"));
	mp_traj_close(t2);
	mp_traj_close(t);
	snprintf(path, sizeof(path), "%s/transitions", pin);
	assert_int_equal(stat(path, &sb), 0);
	json_decref(bpftool_dump(path));
	/* Clean up what --keep left. */
	for (const char *m = "expert_stats\0transitions\0fault_latency\0"; *m; m += strlen(m) + 1) {
		snprintf(path, sizeof(path), "%s/%s", pin, m);
		assert_int_equal(unlink(path), 0);
	}
	assert_int_equal(rmdir(pin), 0);
	rmdir("/sys/fs/bpf/moepager");
}

/*
 * Without privileges (a child turned into nobody): BPF says -EPERM and what
 * is missing, and AUTO falls back to the in-process recorder.
 */
static void unprivileged_bpf_is_eperm_and_auto_falls_back(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	if (geteuid() != 0)
		skip();		/* needs root to drop it */
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		struct mp_traj_opts o = { .source = MP_TRAJ_SRC_BPF };
		struct mp_traj *t = NULL;

		if (setgid(65534) || setuid(65534))
			_exit(10);
		t_log_capture();
		t_log_reset();
		if (mp_traj_open(&o, &t) != -EPERM)
			_exit(11);
		if (!t_log_contains("needs root, or CAP_BPF and CAP_PERFMON"))
			_exit(12);
		o.source = MP_TRAJ_SRC_AUTO;
		if (mp_traj_open(&o, &t) || mp_traj_source(t) != MP_TRAJ_SRC_INPROC)
			_exit(13);
		if (!t_log_contains("trajectory feed: in-process recorder (BPF unavailable: "
				    "Operation not permitted)"))
			_exit(14);
		mp_traj_close(t);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void missing_pid_is_esrch(void **state)
{
	struct mp_traj_opts o = { .source = MP_TRAJ_SRC_BPF, .pid = 0x3ffffff0 };
	struct mp_traj *t = NULL;
	int err;

	(void)state;
	t_log_capture();
	t_log_reset();
	err = mp_traj_open(&o, &t);
	if (err == -EOPNOTSUPP)
		require_bpf(err);
	assert_int_equal(err, -ESRCH);
	assert_true(t_log_contains("no process"));
	assert_null(t);
}

/* Exits 77 (meson: SKIP) when BPF cannot load here at all, unless it is required (CI). */
static void skip_binary_without_bpf(const char *name)
{
	struct mp_traj_opts o = { .source = MP_TRAJ_SRC_BPF };
	struct mp_traj *t;
	int err = mp_traj_open(&o, &t);

	if (!err) {
		mp_traj_close(t);
		return;
	}
	if ((err == -EPERM || err == -EOPNOTSUPP) && !t_require_all()) {
		fprintf(stderr, "%s: skipped: %s\n", name, mp_last_error());
		exit(T_EXIT_SKIP);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(route_probes_in_libmoepager_recorded_exactly),
		cmocka_unit_test(route_probes_in_own_executable_recorded),
		cmocka_unit_test(page_faults_attributed_to_layer_and_expert),
		cmocka_unit_test(pager_probes_fill_histogram_and_counts),
		cmocka_unit_test(full_ring_drops_are_counted_and_counts_stay_exact),
		cmocka_unit_test_teardown(keep_pins_leaves_maps_and_busy_dir_is_eexist,
					  remove_kept_pins),
		cmocka_unit_test(unprivileged_bpf_is_eperm_and_auto_falls_back),
		cmocka_unit_test(missing_pid_is_esrch),
	};
	int ret;

	if (geteuid() != 0 && t_require_all()) {
		fprintf(stderr, "test_bpf_traj: BPF tests must run as root here\n");
		return 1;
	}
	skip_binary_without_bpf("test_bpf_traj");
	ret = cmocka_run_group_tests_name("bpf_traj", tests, NULL, NULL);
	t_tmpdir_cleanup();
	return ret;
}
