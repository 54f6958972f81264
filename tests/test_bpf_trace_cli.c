// SPDX-License-Identifier: MIT
/* moepager trace end to end: record a command or a pid through BPF, export, compare. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "helpers.h"
#include "base/probes.h"

static char moepager[1024], fire[1024], touch[1024], mixtral[1024];
/* Pins a test kept (--keep): removed by the teardown even when the test failed. */
static char kept_pin[256];

static void remove_pins(const char *dir)
{
	char path[512];

	for (const char *m = "expert_stats\0transitions\0fault_latency\0"; *m; m += strlen(m) + 1) {
		snprintf(path, sizeof(path), "%s/%s", dir, m);
		unlink(path);
	}
	rmdir(dir);
	rmdir("/sys/fs/bpf/moepager");
}

static int remove_kept_pins(void **state)
{
	(void)state;
	if (kept_pin[0])
		remove_pins(kept_pin);
	kept_pin[0] = 0;
	return 0;
}

static void paths(void)
{
	const char *b = getenv("MOEPAGER_BUILD_ROOT"), *s = getenv("MOEPAGER_SOURCE_ROOT");

	if (!b || !s)
		fail_msg("MOEPAGER_BUILD_ROOT/MOEPAGER_SOURCE_ROOT unset (meson test sets them)");
	snprintf(moepager, sizeof(moepager), "%s/tools/moepager", b);
	snprintf(fire, sizeof(fire), "%s/tests/traj_fire", b);
	snprintf(touch, sizeof(touch), "%s/tests/pager_touch", b);
	snprintf(mixtral, sizeof(mixtral), "%s/data/traces/mixtral-8x7b/gsm8k.csv", s);
}

/* A tmpdir path that outlives the next 4 t_path() calls (it recycles 4 buffers). */
static const char *own_path(const char *name)
{
	static char bufs[8][512];
	static unsigned slot;
	char *p = bufs[slot++ % 8];

	snprintf(p, 512, "%s", t_path(name));
	return p;
}

static char *slurp(const char *path)
{
	static char buf[1 << 20];
	FILE *f = fopen(path, "r");
	size_t n = 0;

	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = 0;
	return buf;
}

/* Runs a shell command line; returns its exit status, stdout in out.txt, stderr in err.txt. */
static int run(const char *fmt, ...)
{
	char cmd[4096], line[4200];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	snprintf(line, sizeof(line), "%s >%s 2>%s", cmd, t_path("out.txt"), t_path("err.txt"));
	st = system(line);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* The last run failed for want of BPF (or of probes): a failure under CI, else a skip. */
static void skip_without_bpf(void)
{
	const char *err = slurp(t_path("err.txt"));

	if (strstr(err, "CAP_BPF") || strstr(err, "without BPF") || !MP_PROBES_ENABLED) {
		if (t_require_all())
			fail_msg("BPF required but unavailable: %s", err);
		skip();
	}
}

static void require_recorded(int status)
{
	if (!status)
		return;
	skip_without_bpf();
	fail_msg("moepager trace exited %d: %s", status, slurp(t_path("err.txt")));
}

/*
 * Runs cmd (a `moepager trace --pid target` line) in the background, waits
 * until it has attached (its maps are pinned, tries x 10 ms at most), then
 * lets the target go with a byte on go_fd, which it closes. Returns the
 * tracer's pid.
 */
static pid_t trace_then_release(const char *cmd, pid_t target, int go_fd, int tries)
{
	char pin[64];
	struct stat sb;
	pid_t tracer = fork();
	int st;

	assert_true(tracer >= 0);
	if (!tracer) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	snprintf(pin, sizeof(pin), "/sys/fs/bpf/moepager/%d", target);
	for (int i = 0; i < tries && stat(pin, &sb); i++) {
		if (waitpid(tracer, &st, WNOHANG) == tracer) {
			close(go_fd);
			waitpid(target, NULL, 0);
			require_recorded(WEXITSTATUS(st));
			fail_msg("moepager trace exited before attaching");
		}
		usleep(10000);
	}
	assert_int_equal(stat(pin, &sb), 0);
	assert_int_equal(write(go_fd, "g", 1), 1);
	close(go_fd);
	return tracer;
}

static void wait_mapped(pid_t pid)
{
	char maps[64], line[512];

	snprintf(maps, sizeof(maps), "/proc/%d/maps", pid);
	for (int i = 0; i < 500; i++) {
		FILE *f = fopen(maps, "r");
		bool mapped = false;

		while (f && fgets(line, sizeof(line), f))
			mapped |= strstr(line, "libmoepager.so") != NULL;
		if (f)
			fclose(f);
		if (mapped)
			return;
		usleep(10000);
	}
	fail_msg("pid %d never mapped libmoepager.so", pid);
}

/* The export of path is the source trace, row for row, weights bit for bit. */
static void assert_export_equals(const char *traj, const char *source)
{
	struct mp_trace *a, *b;

	assert_int_equal(run("%s trace --export %s", moepager, traj), 0);
	assert_int_equal(mp_trace_open(t_path("out.txt"), &a), 0);
	assert_int_equal(mp_trace_open(source, &b), 0);
	assert_int_equal(mp_trace_requests(a), mp_trace_requests(b));
	assert_int_equal(mp_trace_layers(a), mp_trace_layers(b));
	assert_int_equal(mp_trace_topk(a), mp_trace_topk(b));
	assert_true(mp_trace_has_weights(a));
	for (uint32_t r = 0; r < mp_trace_requests(b); r++) {
		assert_int_equal(mp_trace_tokens(a, r), mp_trace_tokens(b, r));
		for (uint32_t tok = 0; tok < mp_trace_tokens(b, r); tok++)
			for (uint32_t l = 0; l < mp_trace_layers(b); l++) {
				const uint32_t *ia, *ib;
				const float *wa, *wb;

				assert_int_equal(mp_trace_route(a, r, tok, l, &ia, &wa), 0);
				assert_int_equal(mp_trace_route(b, r, tok, l, &ib, &wb), 0);
				assert_memory_equal(ia, ib, mp_trace_topk(b) * sizeof(*ia));
				assert_memory_equal(wa, wb, mp_trace_topk(b) * sizeof(*wa));
			}
	}
	mp_trace_close(a);
	mp_trace_close(b);
}

static uint64_t trace_rows(const char *path)
{
	struct mp_trace *t;
	uint64_t n = 0;

	assert_int_equal(mp_trace_open(path, &t), 0);
	for (uint32_t r = 0; r < mp_trace_requests(t); r++)
		n += (uint64_t)mp_trace_tokens(t, r) * mp_trace_layers(t);
	mp_trace_close(t);
	return n;
}

static void trace_of_a_command_exports_the_routes_it_fired(void **state)
{
	const char *traj = own_path("cmd.mptraj");
	json_error_t jerr;
	json_t *j;

	(void)state;
	require_recorded(run("%s trace --json --out %s -- %s %s --token-us 100", moepager, traj,
			     fire, mixtral));
	j = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "routes")), trace_rows(mixtral));
	assert_int_equal(json_integer_value(json_object_get(j, "records")), trace_rows(mixtral));
	assert_int_equal(json_integer_value(json_object_get(j, "dropped")), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "exit_status")), 0);
	assert_true(json_integer_value(json_object_get(j, "probes_attached")) >= 1);
	assert_true(json_is_null(json_object_get(j, "pin_dir")));
	json_decref(j);
	assert_export_equals(traj, mixtral);
}

static void trace_of_a_running_pid_stops_when_it_exits(void **state)
{
	const char *traj = own_path("pid.mptraj");
	char cmd[4096], pin[64];
	struct stat sb;
	int go[2], st;
	pid_t target, tracer;

	(void)state;
	assert_int_equal(pipe(go), 0);
	target = fork();
	assert_true(target >= 0);
	if (!target) {
		dup2(go[0], 0);
		close(go[1]);
		if (!freopen("/dev/null", "w", stdout))
			_exit(126);
		execl(fire, fire, mixtral, "--wait", (char *)NULL);
		_exit(127);
	}
	close(go[0]);
	/* The target maps libmoepager.so before it blocks on the go byte. */
	wait_mapped(target);
	snprintf(cmd, sizeof(cmd), "exec %s trace --pid %d --out %s >%s 2>%s", moepager, target,
		 traj, t_path("out.txt"), t_path("err.txt"));
	tracer = trace_then_release(cmd, target, go[1], 500);
	assert_int_equal(waitpid(target, &st, 0), target);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(waitpid(tracer, &st, 0), tracer);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fail_msg("moepager trace --pid: %s", slurp(t_path("err.txt")));
	assert_non_null(strstr(slurp(t_path("err.txt")), " 0 dropped"));
	/* Pins are gone with the recording. */
	assert_int_equal(stat(pin, &sb), -1);
	assert_export_equals(traj, mixtral);
}

static void keep_leaves_the_pinned_maps_dumpable(void **state)
{
	const char *traj = own_path("keep.mptraj");
	char path[512], *pin;
	json_error_t jerr;
	json_t *j;

	(void)state;
	require_recorded(run("%s trace --json --keep --out %s -- %s %s", moepager, traj, fire,
			     mixtral));
	j = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(j);
	assert_true(json_is_string(json_object_get(j, "pin_dir")));
	pin = strdup(json_string_value(json_object_get(j, "pin_dir")));
	snprintf(kept_pin, sizeof(kept_pin), "%s", pin);
	json_decref(j);
	snprintf(path, sizeof(path), "%s/expert_stats", pin);
	assert_int_equal(run("bpftool -j map dump pinned %s", path), 0);
	j = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(j);
	/* Mixtral's 32 layers x 8 experts were all routed to in gsm8k. */
	assert_int_equal(json_array_size(j), 32 * 8);
	assert_non_null(json_object_get(json_object_get(json_object_get(json_array_get(j, 0),
		"formatted"), "value"), "routed"));
	json_decref(j);
	for (const char *m = "expert_stats\0transitions\0fault_latency\0"; *m; m += strlen(m) + 1) {
		snprintf(path, sizeof(path), "%s/%s", pin, m);
		assert_int_equal(unlink(path), 0);
	}
	assert_int_equal(rmdir(pin), 0);
	rmdir("/sys/fs/bpf/moepager");
	free(pin);
}

static json_int_t jint(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		fail_msg("JSON has no integer %s", key);
	return json_integer_value(v);
}

/* A model of the Mixtral traces' geometry (8 experts, top-2), small: 24 KiB bf16 experts. */
static void gen_mixtral_shaped(const char *path, int layers)
{
	assert_int_equal(run("%s gen --preset tiny --layers %d --experts 8 --topk 2 --hidden 64 "
			     "--ffn 64 --vocab 256 --dtype bf16 --out %s", moepager, layers, path),
			 0);
}

/*
 * moepager run replays request 1 of the Mixtral trace on a model of the same
 * geometry: the recorded decode routes are the trace's, row for row, and the
 * counts agree with what the run reports.
 */
static void trace_of_moepager_run_equals_the_replayed_trace(void **state)
{
	enum { PROMPT = 5, WARMUP = 2, DECODE = 20, LAYERS = 32 };
	char model[512], traj[512], runjson[512], pin[256], path[600];
	struct mp_trace *a, *b;
	json_error_t jerr;
	json_t *rj, *tr, *dump;
	json_int_t routed = 0;

	(void)state;
	/* t_path() reuses 4 buffers: keep copies. */
	snprintf(model, sizeof(model), "%s", t_path("mix.mpk"));
	snprintf(traj, sizeof(traj), "%s", t_path("run.mptraj"));
	snprintf(runjson, sizeof(runjson), "%s", t_path("run.json"));
	gen_mixtral_shaped(model, LAYERS);
	require_recorded(run("%s trace --json --keep --out %s -- sh -c 'exec %s run --model %s "
			     "--trace %s --request 1 --prompt-tokens %d --warmup %d --tokens %d "
			     "--threads 1 --json >%s'", moepager, traj, moepager, model, mixtral,
			     PROMPT, WARMUP, DECODE, runjson));
	tr = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(tr);
	rj = json_loads(slurp(runjson), 0, &jerr);
	assert_non_null(rj);

	/* Every token the run pushed through the model was routed once per layer. */
	assert_int_equal(jint(rj, "prompt_tokens"), PROMPT);
	assert_int_equal(jint(rj, "warmup_tokens") + jint(rj, "decode_tokens"), WARMUP + DECODE);
	assert_int_equal(jint(tr, "routes"), (PROMPT + WARMUP + DECODE) * LAYERS);
	assert_int_equal(jint(tr, "dropped"), 0);
	assert_int_equal(jint(tr, "exit_status"), 0);
	/* ... and the pinned per-expert counts add up to top-k per route. */
	snprintf(pin, sizeof(pin), "%s", json_string_value(json_object_get(tr, "pin_dir")));
	snprintf(kept_pin, sizeof(kept_pin), "%s", pin);
	snprintf(path, sizeof(path), "%s/expert_stats", pin);
	assert_int_equal(run("bpftool -j map dump pinned %s", path), 0);
	dump = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(dump);
	for (size_t i = 0; i < json_array_size(dump); i++)
		routed += json_integer_value(json_object_get(json_object_get(json_object_get(
			json_array_get(dump, i), "formatted"), "value"), "routed"));
	assert_int_equal(routed, 2 * jint(tr, "routes"));
	json_decref(dump);
	for (const char *m = "expert_stats\0transitions\0fault_latency\0"; *m; m += strlen(m) + 1) {
		snprintf(path, sizeof(path), "%s/%s", pin, m);
		assert_int_equal(unlink(path), 0);
	}
	assert_int_equal(rmdir(pin), 0);
	rmdir("/sys/fs/bpf/moepager");
	json_decref(rj);
	json_decref(tr);

	/* The export holds the decode steps only (the prefill is left out), numbered from 0. */
	assert_int_equal(run("%s trace --export %s", moepager, traj), 0);
	assert_int_equal(mp_trace_open(t_path("out.txt"), &a), 0);
	assert_int_equal(mp_trace_open(mixtral, &b), 0);
	assert_string_equal(mp_trace_meta(a, "recorded_requests"), "1");
	assert_int_equal(mp_trace_requests(a), 1);
	assert_int_equal(mp_trace_tokens(a, 0), WARMUP + DECODE);
	for (uint32_t tok = 0; tok < WARMUP + DECODE; tok++)
		for (uint32_t l = 0; l < LAYERS; l++) {
			const uint32_t *ia, *ib;
			const float *wa, *wb;

			assert_int_equal(mp_trace_route(a, 0, tok, l, &ia, &wa), 0);
			assert_int_equal(mp_trace_route(b, 1, tok, l, &ib, &wb), 0);
			assert_memory_equal(ia, ib, 2 * sizeof(*ia));
			assert_memory_equal(wa, wb, 2 * sizeof(*wa));
		}
	mp_trace_close(a);
	mp_trace_close(b);
}

struct decode_counts {
	bool decoding;		/* a generated token's route was seen: measuring has begun */
	uint64_t fault_begin, fault_done, evict, fault_err;
	uint64_t pgfault, pgfault_outside;	/* whole recording */
};

static int count_decode(const struct mp_traj_rec *r, void *arg)
{
	struct decode_counts *c = arg;

	c->decoding |= r->kind == MP_TRAJ_ROUTE && r->token != MP_TRAJ_NONE;
	c->pgfault += r->kind == MP_TRAJ_PGFAULT;
	c->pgfault_outside += r->kind == MP_TRAJ_PGFAULT && (r->layer >= 32 || r->expert >= 8);
	if (!c->decoding)
		return 0;
	c->fault_begin += r->kind == MP_TRAJ_FAULT_BEGIN;
	c->fault_done += r->kind == MP_TRAJ_FAULT_DONE;
	c->fault_err += r->kind == MP_TRAJ_FAULT_DONE && r->err;
	c->evict += r->kind == MP_TRAJ_EVICT;
	return 0;
}

/*
 * A paged run under a 30 % budget: the pager's probes, counted from the
 * first decode step (when the run starts measuring), agree with the run's
 * own demand faults and evictions.
 */
static void trace_of_a_paged_run_counts_its_faults_and_evictions(void **state)
{
	enum { PROMPT = 4, DECODE = 20, LAYERS = 32 };
	char model[512], traj[512], runjson[512];
	struct decode_counts c = { 0 };
	json_error_t jerr;
	json_t *rj, *tr;

	(void)state;
	snprintf(model, sizeof(model), "%s", t_path("paged.mpk"));
	snprintf(traj, sizeof(traj), "%s", t_path("paged.mptraj"));
	snprintf(runjson, sizeof(runjson), "%s", t_path("paged.json"));
	gen_mixtral_shaped(model, LAYERS);
	/* Resolved by faults: experts this small are otherwise read on the asking thread. */
	require_recorded(run("%s trace --json --out %s -- sh -c 'MOEPAGER_RESOLVE=fault exec %s "
			     "run --model %s --budget 30%% --trace %s --request 1 --prompt-tokens %d "
			     "--tokens %d --threads 1 --json >%s'", moepager, traj, moepager, model, mixtral,
			     PROMPT, DECODE, runjson));
	tr = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(tr);
	rj = json_loads(slurp(runjson), 0, &jerr);
	assert_non_null(rj);
	assert_string_equal(json_string_value(json_object_get(rj, "mode")), "paged");
	assert_int_equal(jint(tr, "routes"), (PROMPT + DECODE) * LAYERS);
	assert_int_equal(jint(tr, "dropped"), 0);
	assert_true(mp_traj_file_read(traj, NULL, count_decode, &c) > 0);
	assert_true(jint(rj, "demand_faults") > 0);
	assert_int_equal(c.fault_begin, jint(rj, "demand_faults"));
	assert_int_equal(c.fault_done, jint(rj, "demand_faults"));
	assert_int_equal(c.fault_err, 0);
	assert_int_equal(c.evict, jint(rj, "evictions"));
	/* The run's pager opened its range after the tracer attached: the region probe. */
	assert_true(c.pgfault > 0);
	assert_int_equal(c.pgfault, jint(tr, "page_faults"));
	assert_int_equal(c.pgfault_outside, 0);
	/* Every demand fault followed the engine's page fault on its expert. */
	assert_int_equal(jint(tr, "caller_faults"), 0);
	json_decref(rj);
	json_decref(tr);
}

/*
 * The same paged run with the pager's own choice of who resolves a miss:
 * these experts are below 2 MiB, so the engine thread asking for one reads
 * it and no page fault happens in the range (page_faults 0 with the
 * page-fault program attached); the trace says each demand fault was
 * resolved so (caller_faults). `trace --json -- CMD` prints one object on
 * stdout, the command's own stdout (the run's JSON) going to stderr.
 */
static void trace_json_of_a_run_resolving_on_the_asking_thread(void **state)
{
	enum { PROMPT = 4, DECODE = 20, LAYERS = 32 };
	char model[512], traj[512], *run_line;
	json_error_t jerr;
	json_t *rj, *tr;

	(void)state;
	snprintf(model, sizeof(model), "%s", t_path("caller.mpk"));
	snprintf(traj, sizeof(traj), "%s", t_path("caller.mptraj"));
	gen_mixtral_shaped(model, LAYERS);
	require_recorded(run("env -u MOEPAGER_RESOLVE %s trace --json --out %s -- %s run "
			     "--model %s --budget 30%% --trace %s --request 1 --prompt-tokens %d "
			     "--tokens %d --threads 1 --json", moepager, traj, moepager, model,
			     mixtral, PROMPT, DECODE));
	/* Strict: one object and nothing after it (jansson refuses trailing data). */
	tr = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	if (!tr)
		fail_msg("trace --json stdout is not one JSON object (%s): %s", jerr.text,
			 slurp(t_path("out.txt")));
	run_line = strstr(slurp(t_path("err.txt")), "{\"model\"");
	assert_non_null(run_line);
	rj = json_loads(run_line, JSON_DISABLE_EOF_CHECK, &jerr);
	assert_non_null(rj);
	assert_string_equal(json_string_value(json_object_get(rj, "mode")), "paged");
	assert_int_equal(jint(tr, "routes"), (PROMPT + DECODE) * LAYERS);
	assert_true(json_is_true(json_object_get(tr, "pgfault")));
	assert_true(jint(rj, "demand_faults") > 0);
	assert_true(jint(tr, "faults") >= jint(rj, "demand_faults"));
	assert_int_equal(jint(tr, "page_faults"), 0);
	assert_int_equal(jint(tr, "caller_faults"), jint(tr, "faults"));
	json_decref(rj);
	json_decref(tr);
}

/*
 * The one-liner of docs/probes.md, with a BEGIN line to know when it is
 * attached: its per-(layer, first expert) counts are the trace's.
 */
static void bpftrace_one_liner_counts_routes(void **state)
{
	const char *out = own_path("bpftrace.txt");
	char lib[4096], prog[4400], arg[16], line[256], *b = getenv("MOEPAGER_BUILD_ROOT");
	static uint64_t want[32][8], got[32][8];
	struct mp_trace *tr;
	int go[2], st, ready = 0;
	pid_t target, bt;
	FILE *f;

	(void)state;
	if (!MP_PROBES_ENABLED) {
		if (t_require_all())
			fail_msg("built without <sys/sdt.h>: no probes for bpftrace");
		skip();
	}
	if (run("command -v bpftrace")) {
		if (t_require_all())
			fail_msg("bpftrace is not installed (Debian package bpftrace)");
		skip();
	}
	snprintf(line, sizeof(line), "%s/libmoepager.so", b);
	assert_non_null(realpath(line, lib));
	snprintf(prog, sizeof(prog), "BEGIN { printf(\"ready\\n\"); } "
		 "usdt:%s:moepager:route { @uses[arg2, *(uint32 *)arg4] = count(); }", lib);

	assert_int_equal(pipe(go), 0);
	target = fork();
	assert_true(target >= 0);
	if (!target) {
		dup2(go[0], 0);
		close(go[1]);
		execl(fire, fire, mixtral, "--wait", (char *)NULL);
		_exit(127);
	}
	close(go[0]);
	wait_mapped(target);
	snprintf(arg, sizeof(arg), "%d", target);
	bt = fork();
	assert_true(bt >= 0);
	if (!bt) {
		if (!freopen(out, "w", stdout) || !freopen("/dev/null", "w", stderr))
			_exit(126);
		execlp("bpftrace", "bpftrace", "-p", arg, "-e", prog, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 600 && !ready; i++) {
		usleep(50000);
		ready = strstr(slurp(out), "ready") != NULL;
		if (!ready && waitpid(bt, &st, WNOHANG) == bt)
			break;
	}
	if (!ready) {
		kill(bt, SIGKILL);
		close(go[1]);
		waitpid(target, NULL, 0);
		skip_without_bpf();
		fail_msg("bpftrace did not attach: %s", slurp(out));
	}
	assert_int_equal(write(go[1], "g", 1), 1);
	close(go[1]);
	assert_int_equal(waitpid(target, &st, 0), target);
	assert_int_equal(WEXITSTATUS(st), 0);
	kill(bt, SIGINT);	/* bpftrace prints its maps on Ctrl-C */
	assert_int_equal(waitpid(bt, &st, 0), bt);

	assert_int_equal(mp_trace_open(mixtral, &tr), 0);
	for (uint32_t r = 0; r < mp_trace_requests(tr); r++)
		for (uint32_t tok = 0; tok < mp_trace_tokens(tr, r); tok++)
			for (uint32_t l = 0; l < 32; l++) {
				const uint32_t *ids;
				const float *w;

				assert_int_equal(mp_trace_route(tr, r, tok, l, &ids, &w), 0);
				want[l][ids[0]]++;
			}
	mp_trace_close(tr);
	f = fopen(out, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned l, e;
		unsigned long long n;

		if (sscanf(line, "@uses[%u, %u]: %llu", &l, &e, &n) == 3) {
			assert_true(l < 32 && e < 8);
			got[l][e] = n;
		}
	}
	fclose(f);
	assert_memory_equal(got, want, sizeof(want));
}

/* What a recording of pager_touch must hold: its range, as the process printed it. */
struct touch_check {
	uint64_t base, slot_bytes, slots_per_layer;
	uint32_t layers, experts;
	uint32_t seq[1024];	/* slots of the page-fault records, repeats collapsed */
	uint32_t nseq;
	uint64_t pgfaults, fault_begins, outside, disagree;
	uint32_t last_slot;	/* of the last page-fault record, UINT32_MAX before one */
};

static int check_touch(const struct mp_traj_rec *r, void *arg)
{
	struct touch_check *c = arg;
	uint64_t slot = (uint64_t)r->layer * c->slots_per_layer + r->expert;
	uint64_t lo = c->base + slot * c->slot_bytes;

	if (r->kind != MP_TRAJ_PGFAULT && r->kind != MP_TRAJ_FAULT_BEGIN)
		return 0;
	/* The fault's address is inside the slot the record names, and the expert exists. */
	if (r->layer >= c->layers || r->expert >= c->experts || r->value < lo ||
	    r->value >= lo + c->slot_bytes)
		c->outside++;
	if (r->kind == MP_TRAJ_FAULT_BEGIN) {
		/* One reading thread: the pager serves the fault the program just saw. */
		c->fault_begins++;
		c->disagree += c->last_slot != slot;
		return 0;
	}
	c->pgfaults++;
	if (c->last_slot != slot && c->nseq < sizeof(c->seq) / sizeof(c->seq[0]))
		c->seq[c->nseq++] = (uint32_t)slot;
	c->last_slot = (uint32_t)slot;
	return 0;
}

/* Waits for line in the file path; fails when pid exits first. */
static void wait_line(const char *path, const char *line, pid_t pid)
{
	int st;

	for (int i = 0; i < 1000; i++) {
		if (strstr(slurp(path), line))
			return;
		if (waitpid(pid, &st, WNOHANG) == pid)
			fail_msg("pager_touch exited (status 0x%x) before '%s': %s", st, line,
				 slurp(path));
		usleep(10000);
	}
	fail_msg("pager_touch never printed '%s'", line);
}

/*
 * `moepager trace --pid` of a process whose pager opened before the tracer
 * attached (open_late false: the range comes from the process's list) or
 * after (the moepager:region probe), with no --range (or with the range
 * given explicitly): every expert read faults once under a 2-expert budget,
 * and the page-fault records name exactly the experts read, in order, at
 * addresses inside their slots.
 */
static void trace_pid_attributes_pager_faults(bool open_late, bool explicit_range)
{
	enum { ROUNDS = 2, LAYERS = 4, EXPERTS = 8 };
	char model[512], traj[512], outp[512], cmd[4096], range[128] = "";
	struct touch_check c = { .layers = LAYERS, .experts = EXPERTS, .last_slot = UINT32_MAX };
	unsigned long long base, slot, spl;
	unsigned layers;
	json_error_t jerr;
	const char *r;
	int go[2], st, out;
	pid_t target, tracer;
	json_t *j;

	snprintf(model, sizeof(model), "%s", t_path("touch.mpk"));
	snprintf(traj, sizeof(traj), "%s", t_path(open_late ? "late.mptraj" : "early.mptraj"));
	snprintf(outp, sizeof(outp), "%s", t_path("touch.txt"));
	assert_int_equal(run("%s gen --preset tiny --out %s", moepager, model), 0);
	assert_int_equal(pipe(go), 0);
	out = open(outp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(out >= 0);
	target = fork();
	assert_true(target >= 0);
	if (!target) {
		dup2(go[0], 0);
		dup2(out, 1);
		close(go[1]);
		execl(touch, touch, model, "2", "2", open_late ? "--open-late" : (char *)NULL,
		      (char *)NULL);
		_exit(127);
	}
	close(go[0]);
	close(out);
	/* Early: the pager is open (range printed) and the process waits. */
	wait_line(outp, "ready", target);
	if (explicit_range) {
		r = strstr(slurp(outp), "range ");
		assert_non_null(r);
		assert_int_equal(sscanf(r, "range %llx %llu %llu %u", &base, &slot, &spl,
					&layers), 4);
		snprintf(range, sizeof(range), "--range 0x%llx,%llu,%llu,%u", base, slot, spl,
			 layers);
	}
	snprintf(cmd, sizeof(cmd), "exec %s trace --pid %d %s --json --out %s >%s 2>%s",
		 moepager, target, range, traj, t_path("out.txt"), t_path("err.txt"));
	tracer = trace_then_release(cmd, target, go[1], 1000);
	assert_int_equal(waitpid(target, &st, 0), target);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail_msg("pager_touch failed (status 0x%x): %s", st, slurp(outp));
	assert_int_equal(waitpid(tracer, &st, 0), tracer);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fail_msg("moepager trace --pid: %s", slurp(t_path("err.txt")));

	r = strstr(slurp(outp), "range ");
	assert_non_null(r);
	assert_int_equal(sscanf(r, "range %llx %llu %llu %u", &base, &slot, &spl, &layers), 4);
	assert_int_equal(layers, LAYERS);
	c.base = base;
	c.slot_bytes = slot;
	c.slots_per_layer = spl;
	assert_true(mp_traj_file_read(traj, NULL, check_touch, &c) > 0);
	assert_int_equal(c.outside, 0);
	assert_int_equal(c.disagree, 0);
	assert_true(c.fault_begins >= ROUNDS * LAYERS * EXPERTS);
	assert_int_equal(c.nseq, ROUNDS * LAYERS * EXPERTS);
	for (uint32_t i = 0; i < c.nseq; i++) {
		uint32_t n = i % (LAYERS * EXPERTS);

		if (c.seq[i] != (n / EXPERTS) * spl + n % EXPERTS)
			fail_msg("page fault %u: slot %u, want layer %u expert %u", i, c.seq[i],
				 n / EXPERTS, n % EXPERTS);
	}
	j = json_loads(slurp(t_path("out.txt")), 0, &jerr);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "page_faults")), c.pgfaults);
	assert_true(json_is_true(json_object_get(j, "pgfault")));
	assert_int_equal(json_integer_value(json_object_get(j, "dropped")), 0);
	json_decref(j);
}

static void trace_pid_attributes_faults_of_a_pager_opened_before(void **state)
{
	(void)state;
	trace_pid_attributes_pager_faults(false, false);
}

static void trace_pid_attributes_faults_of_a_pager_opened_after(void **state)
{
	(void)state;
	trace_pid_attributes_pager_faults(true, false);
}

static void trace_pid_with_range_attributes_faults_in_that_range(void **state)
{
	(void)state;
	trace_pid_attributes_pager_faults(false, true);
}

static void bad_targets_fail_with_a_message(void **state)
{
	(void)state;
	assert_int_equal(run("%s trace --pid 1073741808 --out %s", moepager, t_path("x.mptraj")),
			 1);
	skip_without_bpf();
	assert_non_null(strstr(slurp(t_path("err.txt")), "no process 1073741808"));
	assert_int_equal(run("%s trace --out %s -- /nonexistent/cmd", moepager,
			     t_path("y.mptraj")), 1);
	skip_without_bpf();
	assert_non_null(strstr(slurp(t_path("err.txt")), "cannot run /nonexistent/cmd"));
	assert_int_equal(access(t_path("y.mptraj"), F_OK), -1);
	assert_int_equal(run("%s trace --export /etc/passwd", moepager), 1);
	assert_non_null(strstr(slurp(t_path("err.txt")), "not a moepager trajectory file"));
	assert_int_equal(run("%s trace --pid 1 -- true", moepager), 64);
	assert_non_null(strstr(slurp(t_path("err.txt")), "either --pid PID or -- COMMAND"));
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
		cmocka_unit_test(trace_of_a_command_exports_the_routes_it_fired),
		cmocka_unit_test(trace_of_a_running_pid_stops_when_it_exits),
		cmocka_unit_test_teardown(keep_leaves_the_pinned_maps_dumpable, remove_kept_pins),
		cmocka_unit_test_teardown(trace_of_moepager_run_equals_the_replayed_trace,
					  remove_kept_pins),
		cmocka_unit_test(trace_of_a_paged_run_counts_its_faults_and_evictions),
		cmocka_unit_test(trace_json_of_a_run_resolving_on_the_asking_thread),
		cmocka_unit_test(bpftrace_one_liner_counts_routes),
		cmocka_unit_test(trace_pid_attributes_faults_of_a_pager_opened_before),
		cmocka_unit_test(trace_pid_attributes_faults_of_a_pager_opened_after),
		cmocka_unit_test(trace_pid_with_range_attributes_faults_in_that_range),
		cmocka_unit_test(bad_targets_fail_with_a_message),
	};
	int ret;

	paths();
	skip_binary_without_bpf("test_bpf_trace_cli");
	ret = cmocka_run_group_tests_name("bpf_trace_cli", tests, NULL, NULL);
	t_tmpdir_cleanup();
	return ret;
}
