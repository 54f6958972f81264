// SPDX-License-Identifier: MIT
/*
 * The shared host tier across real processes: `moepager pagerd` exec'd as
 * the daemon, engines forked, each attaching with userfaultfd, memfd and
 * SCM_RIGHTS, reading every expert under the guard and comparing it with
 * the file's bytes; the dense weights the daemon holds once, lent to a
 * runner that then reads nothing from the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <moepager/engine.h>
#include <moepager/runner.h>
#include <moepager/share.h>

#include "helpers.h"
#include "base/base.h"
#include "pager/share_priv.h"

#define EXIT_MISMATCH	3
#define EXIT_NO_UFFD	4

static const char *model;
static uint32_t layers, experts;
static uint64_t xbytes;

static int group_setup(void **state)
{
	struct mp_store *s;

	(void)state;
	model = strdup(t_path("tiny.mpk"));
	if (t_gen_tiny(model, MP_DTYPE_F32, 5) || mp_store_open(model, &s))
		return -1;
	layers = mp_store_geometry(s)->layers;
	experts = mp_store_geometry(s)->experts;
	xbytes = mp_store_expert_bytes(s);
	mp_store_close(s);
	return 0;
}

/* Daemons a test started and has not reaped: a failed test must not leave one running. */
static pid_t live[8];

static void forget(pid_t pid)
{
	for (size_t i = 0; i < MP_ARRAY_SIZE(live); i++)
		if (live[i] == pid)
			live[i] = 0;
}

static int kill_leftovers(void **state)
{
	(void)state;
	for (size_t i = 0; i < MP_ARRAY_SIZE(live); i++) {
		if (live[i] > 0) {
			kill(live[i], SIGKILL);
			waitpid(live[i], NULL, 0);
		}
		live[i] = 0;
	}
	return 0;
}

static int group_teardown(void **state)
{
	kill_leftovers(state);
	t_tmpdir_cleanup();
	return 0;
}

/*
 * The daemon: `moepager pagerd` in its own process; returns its pid once it
 * printed "ready".
 */
static pid_t start_daemon(const char *sock, const char *budget)
{
	const char *root = getenv("MOEPAGER_BUILD_ROOT");
	char cli[4096], line[256] = "";
	struct pollfd pfd;
	int out[2];
	pid_t pid;

	assert_non_null(root);
	snprintf(cli, sizeof(cli), "%s/tools/moepager", root);
	assert_int_equal(pipe(out), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(out[1], STDOUT_FILENO);
		close(out[0]);
		execl(cli, cli, "pagerd", "--model", model, "--socket", sock, "--budget", budget,
		      (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	for (size_t i = 0; i < MP_ARRAY_SIZE(live); i++)
		if (!live[i]) {
			live[i] = pid;
			break;
		}
	pfd = (struct pollfd){ .fd = out[0], .events = POLLIN };
	assert_int_equal(poll(&pfd, 1, 20000), 1);
	assert_true(read(out[0], line, sizeof(line) - 1) > 0);
	close(out[0]);
	assert_non_null(strstr(line, "ready"));
	return pid;
}

static void stop_daemon(pid_t pid)
{
	int status;

	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	forget(pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* Waits for a child for at most secs; a child still running is killed: a hang fails. */
static int wait_child(pid_t pid, int secs)
{
	int status;

	for (int i = 0; i < secs * 100; i++) {
		pid_t got = waitpid(pid, &status, WNOHANG);

		if (got == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	fail_msg("child %d still running after %d s (hung)", (int)pid, secs);
	return -1;
}

static void no_uffd(int err)
{
	print_message("attach: %s\n", mp_last_error());
	if (err == -EPERM || err == -EOPNOTSUPP)
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
}

/* A child's exit code for one it expected 0 of: a missing userfaultfd skips (or fails in CI). */
static void assert_child_ok(int code)
{
	if (code == EXIT_NO_UFFD) {
		print_message("userfaultfd unavailable in the engine process\n");
		exit(t_require_all() ? 1 : T_EXIT_SKIP);
	}
	assert_int_equal(code, 0);
}

/*
 * The engine side, in a forked child
 */

struct cmp {
	struct mp_attach *a;
	struct mp_store *s;
	uint8_t *want;
	uint32_t layer, expert;
};

static int compare_expert(void *arg)
{
	struct cmp *c = arg;
	const uint8_t *got = mp_attach_expert(c->a, c->layer, c->expert);

	if (mp_store_read_expert(c->s, c->layer, c->expert, c->want))
		return -EIO;
	return memcmp(got, c->want, xbytes) ? -EBADMSG : 0;
}

static int attach_child(const char *sock, struct cmp *c)
{
	int err;

	alarm(60);	/* a hang kills the child: the parent sees a signal, not 0 */
	c->want = malloc(xbytes);
	if (!c->want || mp_store_open(model, &c->s))
		return 1;
	err = mp_attach_open(c->s, sock, &c->a);
	if (err)
		return err == -EPERM || err == -EOPNOTSUPP ? EXIT_NO_UFFD : 1;
	return 0;
}

/* attach_child() in the test's own process, without the alarm. */
static void attach_here(const char *sock, struct cmp *c)
{
	int err = attach_child(sock, c);

	alarm(0);
	assert_child_ok(err);
}

/* Detaches and frees what attach_child() set up. */
static void cmp_close(struct cmp *c)
{
	mp_attach_close(c->a);
	mp_store_close(c->s);
	free(c->want);
}

/* Reads every expert `rounds` times (order shifted by `shift`) and compares it with the file. */
static pid_t engine_reads_all(const char *sock, uint32_t rounds, uint32_t shift)
{
	pid_t pid = fork();
	struct cmp c = { 0 };
	uint32_t n = layers * experts;
	int err;

	assert_true(pid >= 0);
	if (pid)
		return pid;
	err = attach_child(sock, &c);
	if (err)
		_exit(err);
	for (uint32_t r = 0; r < rounds; r++) {
		for (uint32_t i = 0; i < n; i++) {
			uint32_t k = (i * (shift ? shift : 1) + r) % n;

			c.layer = k / experts;
			c.expert = k % experts;
			err = mp_attach_guard(c.a, compare_expert, &c);
			if (err)
				_exit(err == -EBADMSG ? EXIT_MISMATCH : 1);
		}
	}
	mp_attach_close(c.a);
	_exit(0);
}

static struct mp_pagerd_stats daemon_stats(const char *sock)
{
	struct mp_pagerd_stats st;
	struct mp_attach *a;
	struct mp_store *s;
	int err;

	assert_int_equal(mp_store_open(model, &s), 0);
	err = mp_attach_open(s, sock, &a);
	if (err)
		no_uffd(err);
	assert_int_equal(err, 0);
	assert_int_equal(mp_attach_daemon_stats(a, &st), 0);
	mp_attach_close(a);
	mp_store_close(s);
	return st;
}

/*
 * Tests
 */

static void two_engines_read_the_files_bytes_the_second_none_from_disk(void **state)
{
	const char *sock = t_path("two.sock");
	struct mp_pagerd_stats st0, st1, st2;
	pid_t d;

	(void)state;
	d = start_daemon(sock, "100%");
	st0 = daemon_stats(sock);
	assert_int_equal(st0.disk_bytes_read, 0);
	assert_child_ok(wait_child(engine_reads_all(sock, 1, 0), 60));
	st1 = daemon_stats(sock);
	assert_int_equal(st1.disk_bytes_read, (uint64_t)layers * experts * xbytes);
	assert_int_equal(st1.fills, layers * experts);
	assert_child_ok(wait_child(engine_reads_all(sock, 1, 3), 60));
	st2 = daemon_stats(sock);
	/* The second engine found every expert in the memfd: not one byte from disk. */
	assert_int_equal(st2.disk_bytes_read, st1.disk_bytes_read);
	assert_int_equal(st2.fills, st1.fills);
	assert_true(st2.continues >= st1.continues + layers * experts);
	/* One copy in memory for both processes. */
	assert_true(st2.memfd_bytes <= st2.budget_bytes);
	assert_true(st2.memfd_bytes >= (uint64_t)layers * experts * xbytes);
	stop_daemon(d);
}

static void budget_holds_across_two_engines_reading_at_once(void **state)
{
	const char *sock = t_path("budget.sock");
	struct mp_pagerd_stats st;
	char budget[32];
	pid_t d, a, b;

	(void)state;
	/* A quarter of the experts: both engines keep evicting each other's experts. */
	snprintf(budget, sizeof(budget), "%llu", (unsigned long long)(layers * experts / 4 * xbytes));
	d = start_daemon(sock, budget);
	a = engine_reads_all(sock, 3, 1);
	b = engine_reads_all(sock, 3, 5);
	assert_child_ok(wait_child(a, 120));
	assert_child_ok(wait_child(b, 120));
	st = daemon_stats(sock);
	assert_true(st.evictions > 0);
	assert_true(st.resident_peak_bytes <= st.budget_bytes);
	assert_true(st.memfd_bytes <= st.budget_bytes);
	assert_true(st.budget_bytes < (uint64_t)layers * experts * xbytes);
	assert_int_equal(st.fill_failures, 0);
	stop_daemon(d);
}

/* Every dense tensor the attachment lends equals the file's bytes. */
static bool same_dense(struct mp_attach *a, struct mp_store *s)
{
	bool same = true;

	for (uint32_t i = 0; same && i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);
		const void *got = mp_attach_tensor(a, t);
		void *want = malloc(t->bytes);

		same = got && want && !mp_store_read_tensor(s, t, want) &&
		       !memcmp(got, want, t->bytes);
		free(want);
	}
	return same;
}

/* Child: attach, say ready on `ready`, wait for `go`, then touch an expert never read. */
static pid_t engine_touching_after_go(const char *sock, int ready, int go)
{
	pid_t pid = fork();
	struct cmp c = { 0 };
	char byte = 1;
	int err;

	assert_true(pid >= 0);
	if (pid)
		return pid;
	t_log_capture();
	err = attach_child(sock, &c);
	if (err)
		_exit(err);
	c.layer = 0;
	c.expert = 0;
	if (mp_attach_guard(c.a, compare_expert, &c))	/* read while the daemon lives */
		_exit(1);
	if (write(ready, &byte, 1) != 1 || read(go, &byte, 1) != 1)
		_exit(1);
	c.layer = layers - 1;
	c.expert = experts - 1;
	err = mp_attach_guard(c.a, compare_expert, &c);
	if (err != -ENOTCONN || !t_log_contains("pager daemon is gone"))
		_exit(5);
	/* What was mapped before stays readable: the memfd outlives the daemon. */
	c.layer = 0;
	c.expert = 0;
	if (mp_attach_guard(c.a, compare_expert, &c))
		_exit(6);
	/* So do the dense weights, read without a guard: they never fault to the daemon. */
	if (!same_dense(c.a, c.s))
		_exit(7);
	mp_attach_close(c.a);
	_exit(0);
}

static void daemon_death_fails_a_waiting_fault_with_a_message_not_a_hang(void **state)
{
	const char *sock = t_path("death.sock");
	int ready[2], go[2], status;
	char byte = 1;
	pid_t d, e;

	(void)state;
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	d = start_daemon(sock, "100%");
	e = engine_touching_after_go(sock, ready[1], go[0]);
	if (read(ready[0], &byte, 1) != 1)
		assert_child_ok(wait_child(e, 10));
	/* Stopped, the daemon leaves the fault unanswered; then it dies with it. */
	assert_int_equal(kill(d, SIGSTOP), 0);
	assert_int_equal(write(go[1], &byte, 1), 1);
	usleep(200000);
	assert_int_equal(kill(d, SIGKILL), 0);
	assert_int_equal(waitpid(d, &status, 0), d);
	forget(d);
	assert_child_ok(wait_child(e, 20));
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

/* Child: attach, say ready, then fault on experts forever (until killed). */
static pid_t engine_faulting_forever(const char *sock, int ready)
{
	pid_t pid = fork();
	struct cmp c = { 0 };
	char byte = 1;
	int err;

	assert_true(pid >= 0);
	if (pid)
		return pid;
	err = attach_child(sock, &c);
	if (err || write(ready, &byte, 1) != 1)
		_exit(err ? err : 1);
	for (uint32_t k = 0;; k++) {
		c.layer = (k / experts) % layers;
		c.expert = k % experts;
		mp_attach_guard(c.a, compare_expert, &c);
	}
}

static void engine_dying_mid_fault_leaves_daemon_and_other_engines_working(void **state)
{
	const char *sock = t_path("engine.sock");
	struct mp_pagerd_stats st;
	char budget[32], byte;
	int ready[2], status;
	pid_t d, e;

	(void)state;
	snprintf(budget, sizeof(budget), "%llu", (unsigned long long)(4 * xbytes));
	assert_int_equal(pipe(ready), 0);
	d = start_daemon(sock, budget);
	e = engine_faulting_forever(sock, ready[1]);
	if (read(ready[0], &byte, 1) != 1)
		assert_child_ok(wait_child(e, 10));
	/* The engine faults while the daemon is stopped, and dies with its fault unanswered. */
	assert_int_equal(kill(d, SIGSTOP), 0);
	usleep(100000);
	assert_int_equal(kill(e, SIGKILL), 0);
	assert_int_equal(waitpid(e, &status, 0), e);
	assert_int_equal(kill(d, SIGCONT), 0);
	assert_child_ok(wait_child(engine_reads_all(sock, 2, 3), 60));
	st = daemon_stats(sock);
	/* The dead engine is gone from the books: only the asking client remains. */
	assert_int_equal(st.clients, 1);
	assert_true(st.dropped >= 2);
	assert_int_equal(waitpid(d, &status, WNOHANG), 0);	/* still serving */
	stop_daemon(d);
	close(ready[0]);
	close(ready[1]);
}

static void pages_an_engine_drops_itself_are_mapped_again(void **state)
{
	const char *sock = t_path("zap.sock");
	struct mp_pagerd_stats st0, st1;
	struct cmp c = { 0 };
	uint64_t len = (xbytes + 4095) & ~4095ull;
	pid_t d;

	(void)state;
	d = start_daemon(sock, "100%");
	attach_here(sock, &c);
	c.layer = 1;
	c.expert = 2;
	assert_int_equal(mp_attach_guard(c.a, compare_expert, &c), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st0), 0);
	/* The engine's own mapping loses the pages; the memfd keeps them. */
	assert_int_equal(madvise((void *)mp_attach_expert(c.a, 1, 2), len, MADV_DONTNEED), 0);
	assert_int_equal(mp_attach_guard(c.a, compare_expert, &c), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st1), 0);
	assert_int_equal(st1.fills, st0.fills);
	assert_int_equal(st1.continues, st0.continues + 1);
	cmp_close(&c);
	stop_daemon(d);
}

static void failed_fill_is_an_error_naming_the_expert_and_is_retried(void **state)
{
	const char *sock = t_path("bad.sock"), *bad = t_path("bad.mpk");
	const struct mp_expert_info *x;
	struct mp_pagerd_stats st;
	struct cmp c = { 0 };
	const char *keep = model;
	pid_t d;

	(void)state;
	assert_int_equal(t_gen_tiny(bad, MP_DTYPE_F32, 5), 0);
	assert_int_equal(mp_store_open(bad, &c.s), 0);
	x = mp_store_expert(c.s, 0, 1);
	assert_int_equal(t_flip_byte(bad, x->offset + 100), 0);
	mp_store_close(c.s);
	/* The daemon serves the corrupt copy; the engine opened the good file. */
	model = bad;
	d = start_daemon(sock, "100%");
	model = keep;
	attach_here(sock, &c);
	t_log_capture();
	for (int round = 0; round < 2; round++) {
		t_log_reset();
		c.layer = 0;
		c.expert = 1;
		assert_int_equal(mp_attach_guard(c.a, compare_expert, &c), -EIO);
		assert_true(t_log_contains("could not read layer 0 expert 1"));
		c.expert = 2;
		assert_int_equal(mp_attach_guard(c.a, compare_expert, &c), 0);
	}
	assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
	assert_int_equal(st.fill_failures, 2);	/* the second access asked again */
	cmp_close(&c);
	stop_daemon(d);
}

/* Reads every expert through an attachment, comparing each with the file; the first error. */
static int read_all(struct cmp *c)
{
	for (uint32_t k = 0; k < layers * experts; k++) {
		int err;

		c->layer = k / experts;
		c->expert = k % experts;
		err = mp_attach_guard(c->a, compare_expert, c);
		if (err)
			return err;
	}
	return 0;
}

static void budget_changes_while_attached_evict_down_and_grow_back(void **state)
{
	const char *sock = t_path("resize.sock");
	uint64_t all = (uint64_t)layers * experts * xbytes, small = 4 * xbytes;
	struct mp_pagerd_stats st;
	struct cmp c = { 0 };
	pid_t d;

	(void)state;
	d = start_daemon(sock, "100%");
	attach_here(sock, &c);
	assert_int_equal(read_all(&c), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
	assert_true(st.resident_bytes >= all);
	/* Down: the daemon evicts to the new budget before it answers. */
	assert_int_equal(mp_attach_set_budget(c.a, small), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
	assert_true(st.budget_bytes <= small + 4096);
	assert_true(st.resident_bytes <= st.budget_bytes);
	assert_true(st.memfd_bytes <= st.budget_bytes);
	assert_int_equal(read_all(&c), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
	assert_true(st.resident_peak_bytes >= all);	/* the peak of before */
	assert_true(st.memfd_bytes <= st.budget_bytes);
	/* Up again: everything fits, the second pass reads nothing. */
	assert_int_equal(mp_attach_set_budget(c.a, all), 0);
	assert_int_equal(read_all(&c), 0);
	assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
	{
		uint64_t disk = st.disk_bytes_read;

		assert_int_equal(read_all(&c), 0);
		assert_int_equal(mp_attach_daemon_stats(c.a, &st), 0);
		assert_int_equal(st.disk_bytes_read, disk);
	}
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_attach_set_budget(c.a, xbytes / 2), -EINVAL);
	assert_true(t_log_contains("below one expert"));
	cmp_close(&c);
	stop_daemon(d);
}

/* Bytes the calling thread (or, pid > 0, a process) read with read(2) and friends. */
static uint64_t rchar_of(pid_t pid)
{
	char path[64], line[128];
	unsigned long long v = 0;
	FILE *f;

	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%d/io", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/thread-self/io");
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "rchar: %llu", &v) == 1)
			break;
	fclose(f);
	return v;
}

/*
 * A runner over src (an attachment, or the resident experts): the logits of
 * four tokens. With swap (a second model's store), its dense weights are
 * added and swapped in, then the runner's own swapped back (its lent
 * weights read where they are) before the tokens run.
 */
static void runner_logits(struct mp_store *s, const struct mp_expert_source_ops *ops, void *ctx,
			  struct mp_store *swap, float *logits, struct mp_runner_stats *st,
			  uint64_t *read)
{
	static const uint32_t prompt[] = { 1, 7, 42, 3 };
	struct mp_engine *e;
	struct mp_runner *r;
	uint64_t r0;

	assert_int_equal(mp_engine_open("ref", &(struct mp_engine_config){ .threads = 1 }, &e), 0);
	r0 = rchar_of(0);
	assert_int_equal(mp_runner_open(s, &(struct mp_runner_config){ .engine = e, .source = ops,
								     .source_ctx = ctx }, &r), 0);
	*read = rchar_of(0) - r0;
	if (swap) {
		assert_int_equal(mp_runner_add_model(r, swap), 1);
		assert_int_equal(mp_runner_activate(r, 1), 0);
		assert_int_equal(mp_runner_activate(r, 0), 0);
	}
	assert_int_equal(mp_runner_prefill(r, prompt, MP_ARRAY_SIZE(prompt)), 0);
	memcpy(logits, mp_runner_logits(r), mp_store_geometry(s)->vocab * sizeof(float));
	mp_runner_stats(r, st);
	mp_runner_close(r);
	mp_engine_close(e);
}

static void dense_weights_are_the_files_lent_to_the_runner_and_read_once(void **state)
{
	const char *sock = t_path("dense.sock");
	struct mp_runner_stats st_a, st_r;
	struct mp_pagerd_stats ds;
	struct mp_resident *res;
	struct mp_store *other;
	struct cmp c = { 0 };
	uint64_t all = 0, read_a, read_r, d0;
	float *la, *lr;
	char *page;
	pid_t d;

	(void)state;
	d = start_daemon(sock, "100%");
	attach_here(sock, &c);
	for (uint32_t i = 0; i < mp_store_tensor_count(c.s); i++)
		all += mp_store_tensor_at(c.s, i)->bytes;
	assert_int_equal(mp_attach_daemon_stats(c.a, &ds), 0);
	assert_int_equal(ds.dense_bytes, mp_share_dense_layout(c.s, NULL));
	assert_true(ds.dense_bytes >= all && all > 64 * 1024);
	assert_true(same_dense(c.a, c.s));
	/* Sealed: nobody, this process included, can make the pages writable. */
	page = (char *)mp_attach_tensor(c.a, mp_store_tensor_at(c.s, 0));
	assert_int_equal((uintptr_t)page % 4096, 0);
	assert_int_equal(mprotect(page, 4096, PROT_READ | PROT_WRITE), -1);
	/* Another store's tensor (the same file opened again) is not lent. */
	assert_int_equal(mp_store_open(model, &other), 0);
	assert_null(mp_attach_tensor(c.a, mp_store_tensor_at(other, 0)));
	mp_store_close(other);

	/* A runner over the attachment reads every dense byte in the daemon's memfd, none from
	 * the file, and computes what a runner over its own copy computes, bit for bit. */
	la = malloc(mp_store_geometry(c.s)->vocab * sizeof(float));
	lr = malloc(mp_store_geometry(c.s)->vocab * sizeof(float));
	assert_true(la && lr);
	d0 = rchar_of(d);
	runner_logits(c.s, mp_attach_source_ops(), c.a, NULL, la, &st_a, &read_a);
	assert_int_equal(st_a.dense_lent_bytes, all);
	assert_int_equal(st_a.dense_read_bytes, 0);
	assert_true(read_a < 4096);		/* this thread's reads: the /proc file only */
	assert_true(rchar_of(d) - d0 < all);	/* nor did the daemon read them again */
	assert_int_equal(mp_resident_open(c.s, NULL, NULL, &res), 0);
	runner_logits(c.s, mp_resident_source_ops(), res, NULL, lr, &st_r, &read_r);
	assert_int_equal(st_r.dense_lent_bytes, 0);
	assert_int_equal(st_r.dense_read_bytes, all);
	assert_true(read_r >= all);
	assert_memory_equal(la, lr, mp_store_geometry(c.s)->vocab * sizeof(float));
	/* Swapping models in and out keeps the lent weights (another model's are read). */
	assert_int_equal(t_gen_tiny(t_path("swap.mpk"), MP_DTYPE_F32, 9), 0);
	assert_int_equal(mp_store_open(t_path("swap.mpk"), &other), 0);
	runner_logits(c.s, mp_attach_source_ops(), c.a, other, lr, &st_r, &read_r);
	assert_int_equal(st_r.dense_lent_bytes, all);
	assert_int_equal(st_r.dense_read_bytes, all);
	assert_memory_equal(la, lr, mp_store_geometry(c.s)->vocab * sizeof(float));
	mp_store_close(other);
	mp_resident_close(res);
	free(la);
	free(lr);
	cmp_close(&c);
	stop_daemon(d);
}

static void corrupt_dense_tensor_keeps_the_daemon_from_starting(void **state)
{
	const char *sock = t_path("corrupt.sock"), *bad = t_path("bad-dense.mpk");
	struct mp_pagerd_config cfg = { .socket_path = sock };
	const struct mp_tensor_info *t;
	struct mp_pagerd *d = NULL;
	struct mp_store *s;

	(void)state;
	assert_int_equal(t_gen_tiny(bad, MP_DTYPE_F32, 5), 0);
	assert_int_equal(mp_store_open(bad, &s), 0);
	t = mp_store_tensor(s, "blk.1.attn_k");
	assert_non_null(t);
	assert_int_equal(t_flip_byte(bad, t->offset + 8), 0);
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_pagerd_open(s, &cfg, &d), -EBADMSG);
	assert_null(d);
	assert_true(t_log_contains("blk.1.attn_k"));
	assert_int_equal(access(sock, F_OK), -1);	/* the socket went with it */
	mp_store_close(s);
}

/*
 * A daemon that answers the handshake as the real one does, then hands out
 * dense weights that are not sealed (or, short, one page too few).
 */
static pid_t fake_daemon(const char *sock, bool short_dense)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct mp_share_hello h;
	struct mp_store *s;
	uint64_t slot, want;
	int lfd, c, fd, xfd;
	pid_t pid;

	strcpy(sa.sun_path, sock);
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid) {
		close(lfd);
		return pid;
	}
	alarm(30);
	c = accept(lfd, NULL, NULL);
	if (c < 0 || mp_store_open(model, &s) || mp_share_recv(c, &h, sizeof(h), &fd) <= 0)
		_exit(1);
	slot = MP_ALIGN_UP(xbytes, MP_EXPERT_ALIGN);
	want = mp_share_dense_layout(s, NULL) - (short_dense ? 4096 : 0);
	xfd = memfd_create("fake-tier", MFD_CLOEXEC);
	fd = memfd_create("fake-dense", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (xfd < 0 || fd < 0 || ftruncate(xfd, (off_t)(slot * layers * experts)) ||
	    ftruncate(fd, (off_t)want) ||
	    (short_dense && fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)))
		_exit(1);
	mp_share_send(c, &(struct mp_share_reply){
		.magic = MP_SHARE_MAGIC, .layers = layers, .experts = experts,
		.nslots = layers * experts, .slot_bytes = slot,
		.data_bytes = MP_ALIGN_UP(xbytes, 4096), .memfd_bytes = slot * layers * experts,
		.page_bytes = 4096 }, sizeof(struct mp_share_reply), xfd);
	if (mp_share_recv(c, &h, sizeof(h), &xfd) <= 0 || h.op != MP_SHARE_DENSE)
		_exit(2);
	mp_share_send(c, &(struct mp_share_reply){ .magic = MP_SHARE_MAGIC, .dense_bytes = want },
		      sizeof(struct mp_share_reply), fd);
	/* The client hangs up after refusing. */
	_exit(mp_share_recv(c, &h, sizeof(h), &xfd) == -ENOTCONN ? 0 : 3);
}

static void dense_weights_not_sealed_or_short_are_refused(void **state)
{
	struct mp_attach *a = NULL;
	struct mp_store *s;

	(void)state;
	assert_int_equal(mp_store_open(model, &s), 0);
	t_log_capture();
	for (int short_dense = 0; short_dense < 2; short_dense++) {
		const char *sock = t_path(short_dense ? "short.sock" : "unsealed.sock");
		pid_t f = fake_daemon(sock, short_dense);
		int err;

		t_log_reset();
		err = mp_attach_open(s, sock, &a);
		if (err == -EPERM || err == -EOPNOTSUPP) {
			kill(f, SIGKILL);
			waitpid(f, NULL, 0);
			no_uffd(err);
		}
		assert_int_equal(err, -EPROTO);
		assert_null(a);
		assert_true(t_log_contains("sealed bytes this model's take"));
		assert_int_equal(wait_child(f, 20), 0);
	}
	mp_store_close(s);
}

static int touch_every_expert(void *arg)
{
	struct mp_attach *a = arg;
	volatile const char *p;
	unsigned sum = 0;

	for (uint32_t k = 0; k < layers * experts; k++) {
		p = mp_attach_expert(a, k / experts, k % experts);
		sum += (unsigned)p[0];
	}
	return (int)(sum & 0);
}

static void full_budget_holds_every_expert_whose_bytes_are_no_page_multiple(void **state)
{
	const char *sock = t_path("odd.sock"), *odd = t_path("odd.mpk"), *keep = model;
	struct mp_pagerd_stats st;
	struct mp_geometry g;
	struct mp_attach *a;
	struct mp_store *s;
	int err;
	pid_t d;

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.ffn = 100;		/* 3 x 128 x 100 f32: 37.5 pages an expert */
	assert_int_equal(mp_gen_model(odd, &g, 5, "odd", NULL, NULL), 0);
	assert_int_equal(mp_store_open(odd, &s), 0);
	assert_true(mp_store_expert_bytes(s) % 4096);
	model = odd;
	d = start_daemon(sock, "100%");
	model = keep;
	err = mp_attach_open(s, sock, &a);
	if (err)
		no_uffd(err);
	assert_int_equal(err, 0);
	for (int round = 0; round < 2; round++)
		assert_int_equal(mp_attach_guard(a, touch_every_expert, a), 0);
	assert_int_equal(mp_attach_daemon_stats(a, &st), 0);
	/* Charged its bytes, not its rounded tail: all fit, nothing is read twice. */
	assert_int_equal(st.fills, layers * experts);
	assert_int_equal(st.evictions, 0);
	assert_int_equal(st.resident_bytes, (uint64_t)layers * experts * mp_store_expert_bytes(s));
	mp_attach_close(a);
	mp_store_close(s);
	stop_daemon(d);
}

/* Sends a hello with the wrong version over a raw socket and returns the daemon's answer. */
static struct mp_share_reply hello_raw(const char *sock, uint32_t major)
{
	struct mp_share_hello h = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_HELLO,
				    .proto = MP_SHARE_PROTO, .version_major = major,
				    .version_minor = (uint32_t)mp_version_minor() };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct mp_share_reply rep = { 0 };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	strcpy(sa.sun_path, sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(send(fd, &h, sizeof(h), 0), sizeof(h));
	assert_true(recv(fd, &rep, sizeof(rep), 0) > 0);
	close(fd);
	return rep;
}

static void another_model_or_version_is_refused_with_a_message(void **state)
{
	const char *sock = t_path("refuse.sock"), *other = t_path("other.mpk");
	struct mp_share_reply rep;
	struct mp_attach *a = NULL;
	struct mp_store *s;
	pid_t d;

	(void)state;
	assert_int_equal(t_gen_tiny(other, MP_DTYPE_F32, 6), 0);
	d = start_daemon(sock, "100%");
	assert_int_equal(mp_store_open(other, &s), 0);
	t_log_capture();
	t_log_reset();
	assert_int_equal(mp_attach_open(s, sock, &a), -ESTALE);
	assert_null(a);
	assert_true(t_log_contains("the client opened another model"));
	mp_store_close(s);
	rep = hello_raw(sock, (uint32_t)mp_version_major() + 1);
	assert_int_equal(rep.status, -EPROTO);
	assert_non_null(strstr(rep.message, "moepager"));
	assert_true(daemon_stats(sock).refused >= 2);
	/* A daemon already answering on the socket is not replaced by a second one. */
	{
		struct mp_pagerd_config cfg = { .socket_path = sock };
		struct mp_pagerd *d2 = NULL;

		assert_int_equal(mp_store_open(model, &s), 0);
		assert_int_equal(mp_pagerd_open(s, &cfg, &d2), -EADDRINUSE);
		mp_store_close(s);
	}
	stop_daemon(d);
}

int main(void)
{
#define T(f) cmocka_unit_test_teardown(f, kill_leftovers)
	static const struct CMUnitTest tests[] = {
		T(two_engines_read_the_files_bytes_the_second_none_from_disk),
		T(budget_holds_across_two_engines_reading_at_once),
		T(daemon_death_fails_a_waiting_fault_with_a_message_not_a_hang),
		T(engine_dying_mid_fault_leaves_daemon_and_other_engines_working),
		T(pages_an_engine_drops_itself_are_mapped_again),
		T(failed_fill_is_an_error_naming_the_expert_and_is_retried),
		T(budget_changes_while_attached_evict_down_and_grow_back),
		T(another_model_or_version_is_refused_with_a_message),
		T(dense_weights_are_the_files_lent_to_the_runner_and_read_once),
		T(corrupt_dense_tensor_keeps_the_daemon_from_starting),
		T(dense_weights_not_sealed_or_short_are_refused),
		T(full_budget_holds_every_expert_whose_bytes_are_no_page_multiple),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
