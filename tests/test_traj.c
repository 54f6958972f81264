// SPDX-License-Identifier: MIT
/* The in-process trajectory recorder and trajectory files (no BPF needed). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

struct recs {
	struct mp_traj_rec r[256];
	size_t n;
};

static int collect(const struct mp_traj_rec *r, void *arg)
{
	struct recs *c = arg;

	if (c->n < 256)
		c->r[c->n] = *r;
	c->n++;
	return 0;
}

static int no_stats(const struct mp_traj_expert_stats *s, void *arg)
{
	(void)s;
	(void)arg;
	return 0;
}

static struct mp_traj *open_inproc(uint32_t queue)
{
	struct mp_traj_opts o = { .source = MP_TRAJ_SRC_INPROC, .queue_records = queue };
	struct mp_traj *t;

	assert_int_equal(mp_traj_open(&o, &t), 0);
	assert_int_equal(mp_traj_source(t), MP_TRAJ_SRC_INPROC);
	assert_string_equal(mp_traj_source_name(mp_traj_source(t)), "inproc");
	return t;
}

static void inproc_records_what_was_routed(void **state)
{
	const uint32_t ids[3] = { 7, 1, 4 };
	const float w[3] = { 0.5f, 0.25f, 0.125f };
	struct mp_traj *t = open_inproc(16);
	struct recs c = { 0 };

	(void)state;
	/* Before start nothing is queued. */
	assert_int_equal(mp_traj_route(t, 0, 0, 0, 3, ids, w), 0);
	assert_int_equal(mp_traj_start(t), 0);
	assert_int_equal(mp_traj_route(t, 2, 9, 5, 3, ids, w), 0);
	assert_int_equal(mp_traj_route(t, 2, 9, 6, 2, ids, NULL), 0);
	assert_int_equal(mp_traj_poll(t, 100, collect, &c), 2);
	assert_int_equal(c.n, 2);
	assert_int_equal(c.r[0].kind, MP_TRAJ_ROUTE);
	assert_int_equal(c.r[0].request, 2);
	assert_int_equal(c.r[0].token, 9);
	assert_int_equal(c.r[0].layer, 5);
	assert_int_equal(c.r[0].k, 3);
	assert_int_equal(c.r[0].expert, MP_TRAJ_NONE);
	assert_int_equal(c.r[0].tid, (uint32_t)gettid());
	assert_memory_equal(c.r[0].ids, ids, sizeof(ids));
	assert_memory_equal(c.r[0].weights, w, sizeof(w));
	assert_int_equal(c.r[0].flags, MP_TRAJ_F_WEIGHTS);
	assert_int_equal(c.r[1].flags, 0);
	assert_true(c.r[1].ts_ns >= c.r[0].ts_ns);
	/* An empty queue: a 0 ms poll returns at once, a short wait times out. */
	assert_int_equal(mp_traj_poll(t, 0, collect, &c), 0);
	assert_int_equal(mp_traj_poll(t, 5, collect, &c), 0);
	assert_int_equal(mp_traj_stop(t), 0);
	assert_int_equal(mp_traj_route(t, 2, 9, 7, 3, ids, w), 0);
	assert_int_equal(mp_traj_poll(t, 0, collect, &c), 0);
	/* Counts are BPF maps: the in-process recorder says so. */
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_traj_expert_stats(t, no_stats, NULL), -EOPNOTSUPP);
	assert_true(t_log_contains("keeps no count maps"));
	mp_traj_close(t);
}

static void full_queue_drops_and_counts_without_blocking(void **state)
{
	const uint32_t ids[2] = { 0, 1 };
	struct mp_traj *t = open_inproc(8);
	struct mp_traj_stats st;
	struct recs c = { 0 };

	(void)state;
	assert_int_equal(mp_traj_start(t), 0);
	for (uint32_t i = 0; i < 20; i++)
		assert_int_equal(mp_traj_route(t, 0, i, 0, 2, ids, NULL), i < 8 ? 0 : -ENOSPC);
	assert_int_equal(mp_traj_stats(t, &st), 0);
	assert_int_equal(st.dropped, 12);
	assert_int_equal(mp_traj_poll(t, 0, collect, &c), 8);
	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(c.r[i].token, i);
	assert_int_equal(mp_traj_stats(t, &st), 0);
	assert_int_equal(st.records, 8);
	mp_traj_close(t);
}

struct producer {
	struct mp_traj *t;
	uint32_t request;
	int pushed;
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	const uint32_t ids[1] = { 3 };

	for (uint32_t i = 0; i < 5000; i++)
		if (!mp_traj_route(p->t, p->request, i, 0, 1, ids, NULL))
			p->pushed++;
	return NULL;
}

struct order {
	uint32_t next[4];
	uint64_t n;
	bool ok;
};

static int check_order(const struct mp_traj_rec *r, void *arg)
{
	struct order *o = arg;

	/* Each producer's records arrive in its order (gaps are its drops). */
	if (r->request >= 4 || r->token < o->next[r->request])
		o->ok = false;
	else
		o->next[r->request] = r->token + 1;
	o->n++;
	return 0;
}

/* Four threads push while one polls: every record is delivered or counted as dropped. */
static void concurrent_producers_lose_nothing_uncounted(void **state)
{
	struct mp_traj *t = open_inproc(256);
	struct producer p[4];
	pthread_t th[4];
	struct order o = { .ok = true };
	bool joined[4] = { false };
	struct mp_traj_stats st;
	int pushed = 0, n;

	(void)state;
	assert_int_equal(mp_traj_start(t), 0);
	for (int i = 0; i < 4; i++) {
		p[i] = (struct producer){ t, (uint32_t)i, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, produce, &p[i]), 0);
	}
	for (int done = 0; done < 4;) {
		n = mp_traj_poll(t, 1, check_order, &o);
		assert_true(n >= 0);
		for (int i = 0; i < 4; i++)
			if (!joined[i] && !pthread_tryjoin_np(th[i], NULL)) {
				joined[i] = true;
				done++;
			}
	}
	while ((n = mp_traj_poll(t, 0, check_order, &o)) > 0)
		;
	for (int i = 0; i < 4; i++)
		pushed += p[i].pushed;
	assert_int_equal(mp_traj_stats(t, &st), 0);
	assert_true(o.ok);
	assert_int_equal(o.n, pushed);
	assert_int_equal(st.records, o.n);
	assert_int_equal(st.dropped + o.n, 4 * 5000);
	mp_traj_close(t);
}

static void bad_options_are_einval(void **state)
{
	struct mp_traj_opts o = { .source = MP_TRAJ_SRC_INPROC, .pid = 1 };
	struct mp_traj *t = NULL;
	const uint32_t ids[1] = { 0 };
	struct mp_traj_rec r = { .kind = 99 };

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_traj_open(&o, &t), -EINVAL);
	assert_true(t_log_contains("records only this process"));
	o = (struct mp_traj_opts){ .ring_bytes = 5000 };
	assert_int_equal(mp_traj_open(&o, &t), -EINVAL);
	assert_true(t_log_contains("not a power of two"));
	o = (struct mp_traj_opts){ .queue_records = 3, .source = MP_TRAJ_SRC_INPROC };
	assert_int_equal(mp_traj_open(&o, &t), -EINVAL);
	o = (struct mp_traj_opts){ .range = { 0, 1 << 20, 0, 4 } };
	assert_int_equal(mp_traj_open(&o, &t), -EINVAL);
	assert_true(t_log_contains("slots per layer"));
	o = (struct mp_traj_opts){ .range = { UINT64_MAX - (1 << 20), 1 << 20, 8, 4 } };
	assert_int_equal(mp_traj_open(&o, &t), -EINVAL);
	assert_true(t_log_contains("overflows"));
	assert_null(t);
	assert_int_equal(mp_traj_route(NULL, 0, 0, 0, 0, ids, NULL), -EINVAL);
	assert_int_equal(mp_traj_route(NULL, 0, 0, 0, MP_TRAJ_MAX_K + 1, ids, NULL), -EINVAL);
	assert_true(t_log_contains("k=65"));
	assert_int_equal(mp_traj_note(NULL, &r), -EINVAL);
}

/* AUTO falls back to the in-process recorder when BPF fails, and says so. */
static void auto_falls_back_to_inproc_with_a_log_line(void **state)
{
	struct mp_traj_opts o = { .binary = "/nonexistent/libmoepager.so" };
	struct mp_traj *t;

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_traj_open(&o, &t), 0);
	assert_int_equal(mp_traj_source(t), MP_TRAJ_SRC_INPROC);
	assert_true(t_log_contains("trajectory feed: in-process recorder (BPF unavailable"));
	/* The error that caused it was a warning, not this thread's last error. */
	assert_null(strstr(mp_last_error(), "nonexistent"));
	mp_traj_close(t);
}

/* A trajectory file of routes (2 requests x 3 tokens x 2 layers), faults and pager events. */
static const char *write_file(uint32_t skip_request, uint32_t skip_token, uint32_t skip_layer,
			      bool dup)
{
	const char *path = t_path("t.mptraj");
	struct mp_traj_file_info info = { .pid = 42, .source = MP_TRAJ_SRC_BPF, .layers = 2,
					  .experts = 6 };
	struct mp_traj_writer *w;

	unlink(path);
	assert_int_equal(mp_traj_writer_create(path, &info, &w), 0);
	/* Prompt tokens (token MP_TRAJ_NONE) are recorded but not exported. */
	for (uint32_t l = 0; l < 2; l++) {
		struct mp_traj_rec p = { .kind = MP_TRAJ_ROUTE, .request = 0,
					 .token = MP_TRAJ_NONE, .layer = l, .k = 2,
					 .flags = MP_TRAJ_F_WEIGHTS, .ids = { 5, 5 } };

		assert_int_equal(mp_traj_writer_put(w, &p), 0);
	}
	/* Out of order on purpose: the export sorts. */
	for (int r = 1; r >= 0; r--)
		for (uint32_t tok = 0; tok < 3; tok++)
			for (uint32_t l = 0; l < 2; l++) {
				struct mp_traj_rec rec = { .kind = MP_TRAJ_ROUTE, .request = r,
							   .token = tok, .layer = l, .k = 2,
							   .flags = MP_TRAJ_F_WEIGHTS,
							   .expert = MP_TRAJ_NONE };

				if ((uint32_t)r == skip_request && tok == skip_token &&
				    l == skip_layer)
					continue;
				rec.ids[0] = (r + tok + l) % 6;
				rec.ids[1] = (r + tok + l + 1) % 6;
				rec.weights[0] = 0.1f * (float)(tok + 1);
				rec.weights[1] = 1.0f - rec.weights[0];
				assert_int_equal(mp_traj_writer_put(w, &rec), 0);
				if (dup && r == 0 && tok == 1 && l == 1)
					assert_int_equal(mp_traj_writer_put(w, &rec), 0);
			}
	struct mp_traj_rec pf = { .kind = MP_TRAJ_PGFAULT, .layer = 1, .expert = 4,
				  .value = 0x7f0000001000ull, .request = MP_TRAJ_NONE };

	assert_int_equal(mp_traj_writer_put(w, &pf), 0);
	pf.k = 3;
	assert_int_equal(mp_traj_writer_put(w, &pf), -EINVAL);
	mp_traj_writer_set_dropped(w, 7);
	assert_int_equal(mp_traj_writer_finish(w), 0);
	return path;
}

static int count_kinds(const struct mp_traj_rec *r, void *arg)
{
	uint64_t *n = arg;

	n[r->kind]++;
	return 0;
}

static void trajectory_file_round_trip(void **state)
{
	struct mp_traj_file_info info;
	uint64_t kinds[MP_TRAJ_PREFILL + 1] = { 0 };
	const char *path = write_file(UINT32_MAX, 0, 0, false);

	(void)state;
	assert_int_equal(mp_traj_file_read(path, &info, count_kinds, kinds), 15);
	assert_int_equal(kinds[MP_TRAJ_ROUTE], 14);
	assert_int_equal(kinds[MP_TRAJ_PGFAULT], 1);
	assert_int_equal(info.pid, 42);
	assert_int_equal(info.records, 15);
	assert_int_equal(info.dropped, 7);
	assert_int_equal(info.layers, 2);
	assert_int_equal(info.experts, 6);
}

static char *slurp(FILE *f, size_t *len)
{
	char *buf = malloc(1 << 16);

	assert_non_null(buf);
	rewind(f);
	*len = fread(buf, 1, (1 << 16) - 1, f);
	buf[*len] = 0;
	return buf;
}

static void export_is_moe_trace_equal_to_the_records(void **state)
{
	const char *path = write_file(UINT32_MAX, 0, 0, false);
	FILE *f = tmpfile();
	struct mp_trace *tr;
	size_t len;
	char *buf;

	(void)state;
	assert_non_null(f);
	assert_int_equal(mp_traj_export_moe_trace(path, 0, f), 12);
	buf = slurp(f, &len);
	assert_int_equal(mp_trace_parse(buf, len, "export", &tr), 0);
	assert_int_equal(mp_trace_requests(tr), 2);
	assert_int_equal(mp_trace_layers(tr), 2);
	assert_int_equal(mp_trace_experts(tr), 6);
	assert_int_equal(mp_trace_topk(tr), 2);
	assert_true(mp_trace_has_weights(tr));
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t tok = 0; tok < 3; tok++)
			for (uint32_t l = 0; l < 2; l++) {
				const uint32_t *ids;
				const float *w;
				float w0 = 0.1f * (float)(tok + 1);

				assert_int_equal(mp_trace_route(tr, r, tok, l, &ids, &w), 0);
				assert_int_equal(ids[0], (r + tok + l) % 6);
				assert_int_equal(ids[1], (r + tok + l + 1) % 6);
				/* %.9g round-trips f32 exactly. */
				assert_true(w[0] == w0 && w[1] == 1.0f - w0);
			}
	mp_trace_close(tr);
	free(buf);
	fclose(f);
}

static void export_refuses_gaps_and_duplicates_naming_them(void **state)
{
	FILE *f = tmpfile();
	struct mp_trace *tr;
	size_t len;
	char *buf;

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_traj_export_moe_trace(write_file(0, 1, 0, false), 0, f), -EINVAL);
	assert_true(t_log_contains("request 0 token 1 has no layer 0"));
	t_log_reset();
	assert_int_equal(mp_traj_export_moe_trace(write_file(UINT32_MAX, 0, 0, true), 0, f),
			 -EINVAL);
	assert_true(t_log_contains("request 0 token 1 layer 1 is recorded twice"));
	t_log_reset();
	assert_int_equal(mp_traj_export_moe_trace(write_file(1, 0, 1, false), 0, f), -EINVAL);
	assert_true(t_log_contains("request 1 token 0 has no layer 1"));
	/* The last token of a request cut short (recording stopped) is left out, with a warning. */
	t_log_reset();
	rewind(f);
	assert_int_equal(mp_traj_export_moe_trace(write_file(1, 2, 1, false), 0, f), 10);
	assert_true(t_log_contains("request 1 token 2 has 1 of 2 layers"));
	buf = slurp(f, &len);
	assert_int_equal(mp_trace_parse(buf, len, "export", &tr), 0);
	assert_int_equal(mp_trace_tokens(tr, 1), 2);
	mp_trace_close(tr);
	free(buf);
	fclose(f);
}

static void fault_only_recording_has_nothing_to_export(void **state)
{
	const char *path = t_path("faults.mptraj");
	struct mp_traj_file_info info = { .pid = 1 };
	struct mp_traj_rec pf = { .kind = MP_TRAJ_PGFAULT, .layer = 0, .expert = 1 };
	struct mp_traj_writer *w;

	(void)state;
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_traj_writer_create(path, &info, &w), 0);
	assert_int_equal(mp_traj_writer_put(w, &pf), 0);
	assert_int_equal(mp_traj_writer_finish(w), 0);
	assert_int_equal(mp_traj_export_moe_trace(path, 0, stdout), -ENODATA);
	assert_true(t_log_contains("no route records"));
}

static void corrupt_files_are_refused_with_the_offset(void **state)
{
	const char *path;
	int64_t ret;

	(void)state;
	t_log_capture();
	path = write_file(UINT32_MAX, 0, 0, false);
	/* Header byte: the checksum catches it. */
	assert_int_equal(t_flip_byte(path, 20), 0);
	t_log_reset();
	assert_int_equal(mp_traj_file_read(path, NULL, NULL, NULL), -EBADMSG);
	assert_true(t_log_contains("corrupt header"));
	/* The kind of the first record (offset 128 + 16). */
	path = write_file(UINT32_MAX, 0, 0, false);
	assert_int_equal(t_flip_byte(path, 128 + 16), 0);
	t_log_reset();
	assert_int_equal(mp_traj_file_read(path, NULL, NULL, NULL), -EBADMSG);
	assert_true(t_log_contains("record 0 at offset 128 is corrupt"));
	/* Truncated inside the last record. */
	path = write_file(UINT32_MAX, 0, 0, false);
	assert_int_equal(truncate(path, 128 + 14 * (56 + 16) + 20), 0);
	t_log_reset();
	ret = mp_traj_file_read(path, NULL, NULL, NULL);
	assert_int_equal(ret, -ENODATA);
	assert_true(t_log_contains("truncated record at offset 1136"));
	/* Not a trajectory file at all. */
	assert_int_equal(mp_traj_file_read("/etc/passwd", NULL, NULL, NULL), -EPROTO);
	assert_int_equal(mp_traj_file_read(t_path("missing"), NULL, NULL, NULL), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(inproc_records_what_was_routed),
		cmocka_unit_test(full_queue_drops_and_counts_without_blocking),
		cmocka_unit_test(concurrent_producers_lose_nothing_uncounted),
		cmocka_unit_test(bad_options_are_einval),
		cmocka_unit_test(auto_falls_back_to_inproc_with_a_log_line),
		cmocka_unit_test(trajectory_file_round_trip),
		cmocka_unit_test(export_is_moe_trace_equal_to_the_records),
		cmocka_unit_test(export_refuses_gaps_and_duplicates_naming_them),
		cmocka_unit_test(fault_only_recording_has_nothing_to_export),
		cmocka_unit_test(corrupt_files_are_refused_with_the_offset),
	};
	int ret = cmocka_run_group_tests_name("traj", tests, NULL, NULL);

	t_tmpdir_cleanup();
	return ret;
}
