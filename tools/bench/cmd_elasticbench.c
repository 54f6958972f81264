// SPDX-License-Identifier: MIT
/*
 * moepager bench-elastic: adding and removing an engine process over a shared
 * host tier (moepager pagerd) against a second full copy and a cold restart.
 */
#include <argp.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <moepager.h>

#include "bench/elastic.h"
#include "cli.h"

static struct eb_env {
	const char *path;
	const char *budget;
	bool json;
	struct el_config load;	/* --load: the setups under load (elastic_load.c) */
	uint32_t fit;		/* experts every engine touches: as many as the budget holds */
} env;

static const char doc[] =
	"Scale engine processes 1 -> 2 -> 1 over one model and compare three setups:\n"
	"  shared       a pager daemon (moepager pagerd) holds the experts; the second\n"
	"               engine attaches to it (the first keeps its mapping meanwhile);\n"
	"  second_copy  the second engine opens its own pager and reads every expert\n"
	"               again (twice the memory, the disk read again);\n"
	"  cold_restart the engine exits and a new one with its own pager starts.\n"
	"An engine is ready when it has touched every expert (each read as a fault).\n"
	"The page cache is dropped before each setup (the pagers read with O_DIRECT).\n"
	"Without --load no request is served: failed requests and throughput during\n"
	"scaling are not measured.\n"
	"\n"
	"--json prints one object: per setup scale_up_s (start of the new process to\n"
	"ready), scale_down_s (the command to the old process's exit), downtime_s (no\n"
	"engine ready: 0 when the old one stays until the new one is ready),\n"
	"peak_memory_bytes (while both engines run, the sum over processes of PSS\n"
	"without shared memory, plus the daemon's memfds whole: each page once),\n"
	"disk_bytes_read (by the new engine's start), and ratios to the cold restart.\n"
	"\n"
	"With --load RATE the engines are `moepager serve` processes under Poisson\n"
	"load (RATE requests/s of --prompt-ids random token ids, --max-tokens each)\n"
	"spread by loadgen over an epoch pool file: --phase S seconds with one\n"
	"server, then the change (shared, second_copy: a second server joins, and\n"
	"half a phase later the first drains and leaves; cold_restart: the server\n"
	"drains and leaves, then a new one starts), then a phase after. Each setup\n"
	"adds failed_requests, retried_requests (refused before a token, sent again),\n"
	"memory before/after, throughput and SLO attainment per window, and where the\n"
	"new server's start went (new_server; docs/elastic.md). --pages picks the\n"
	"shared setup's pages (hugetlb needs vm.nr_hugepages).\n"
	"\n"
	"With --load RATE --threads-to N one server on the shared tier changes its\n"
	"engine threads in place (POST /admin/threads): --threads -> N at the second\n"
	"phase, back at the third; setup fixed is the same load on a server whose\n"
	"threads never change. Each gives failed and retried requests, throughput and\n"
	"SLO attainment per phase, and in_place the changes (command_s: the POST's\n"
	"answer, which waits for the running step; threads_seen: from /metrics).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager bench-elastic --model mixtral-mini.mpk --budget 50% --json\n"
	"  moepager bench-elastic --model mm8.mpk --load 1 --phase 20 --json\n"
	"  moepager bench-elastic --model mm8.mpk --load 4 --threads-to 2 --json\n";

enum {
	OPT_BUDGET = 0x100, OPT_LOAD, OPT_PHASE, OPT_THREADS, OPT_MAX_TOKENS, OPT_PROMPT_IDS,
	OPT_SLO_TTFT, OPT_SLO_TPOT, OPT_RETRY, OPT_SEED, OPT_PAGES, OPT_THREADS_TO,
};

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model", 0 },
	{ "budget", OPT_BUDGET, "SIZE", 0, "Expert memory of each setup (default 100%)", 0 },
	{ "json", 'j', NULL, 0, "Print one JSON object on stdout", 0 },
	{ "load", OPT_LOAD, "RATE", 0, "Serve Poisson load of RATE requests/s while scaling", 0 },
	{ "phase", OPT_PHASE, "S", 0, "--load: seconds before, during and after (default 20)", 0 },
	{ "threads", OPT_THREADS, "N", 0, "--load: engine threads per server (default 1)", 0 },
	{ "threads-to", OPT_THREADS_TO, "N", 0,
	  "--load: change one server's threads to N and back in place, not the processes", 0 },
	{ "max-tokens", OPT_MAX_TOKENS, "N", 0, "--load: tokens per request (default 16)", 0 },
	{ "prompt-ids", OPT_PROMPT_IDS, "N", 0, "--load: prompt tokens per request (16)", 0 },
	{ "slo-ttft-ms", OPT_SLO_TTFT, "MS", 0, "--load: TTFT bound of the SLO (default 2000)", 0 },
	{ "slo-tpot-ms", OPT_SLO_TPOT, "MS", 0, "--load: TPOT bound of the SLO (default 500)", 0 },
	{ "retry-s", OPT_RETRY, "S", 0,
	  "--load: a refused request is sent again for up to S s (default 60)", 0 },
	{ "seed", OPT_SEED, "N", 0, "--load: arrivals and prompts from this seed (1)", 0 },
	{ "pages", OPT_PAGES, "KIND", 0,
	  "The shared setup's host tier: small (default), thp or hugetlb (moepager pagerd)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	int pages;

	switch (key) {
	case 'm':
		env.path = arg;
		break;
	case OPT_BUDGET:
		env.budget = arg;
		break;
	case 'j':
		env.json = true;
		break;
	case OPT_LOAD:
		cli_opt_double(state, "--load", arg, 1e-3, 1e4, &env.load.rate);
		break;
	case OPT_PHASE:
		cli_opt_double(state, "--phase", arg, 0.5, 3600, &env.load.phase);
		break;
	case OPT_THREADS:
		cli_opt_u32(state, "--threads", arg, 1, 1024, &env.load.threads);
		break;
	case OPT_THREADS_TO:
		cli_opt_u32(state, "--threads-to", arg, 1, 1024, &env.load.threads_to);
		break;
	case OPT_MAX_TOKENS:
		cli_opt_u32(state, "--max-tokens", arg, 1, 1u << 16, &env.load.max_tokens);
		break;
	case OPT_PROMPT_IDS:
		cli_opt_u32(state, "--prompt-ids", arg, 1, 1u << 16, &env.load.prompt_ids);
		break;
	case OPT_SLO_TTFT:
		cli_opt_double(state, "--slo-ttft-ms", arg, 0, 1e7, &env.load.slo_ttft_ms);
		break;
	case OPT_SLO_TPOT:
		cli_opt_double(state, "--slo-tpot-ms", arg, 0, 1e7, &env.load.slo_tpot_ms);
		break;
	case OPT_RETRY:
		cli_opt_double(state, "--retry-s", arg, 0, 86400, &env.load.retry_s);
		break;
	case OPT_SEED:
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.load.seed);
		break;
	case OPT_PAGES:
		cli_opt_pages(state, "--pages", arg, &pages);
		env.load.pages = arg;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.path)
			argp_error(state, "--model FILE is required");
		if (env.load.threads_to &&
		    (!env.load.rate || env.load.threads_to == env.load.threads))
			argp_error(state, "--threads-to %u needs --load RATE and a count other than "
				   "--threads (%u)", env.load.threads_to, env.load.threads);
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/*
 * Engine processes
 */

struct engine {
	pid_t pid;
	int from;	/* the child's report */
	int to;		/* one byte: detach and exit */
};

struct report {
	int err;
	double ready_s;		/* from the parent's start mark to every expert touched */
	uint64_t disk_bytes;	/* read from disk for this engine's start */
};

static int touch_all(void *arg)
{
	const volatile uint8_t *const *x = arg;
	unsigned sum = 0;

	for (size_t i = 0; x[i]; i++)
		sum += x[i][0];
	return (int)(sum & 0);
}

/* The child: attach (sock) or open its own pager (budget), touch every expert, report, wait. */
static int engine_main(const char *sock, uint64_t budget, uint64_t t0, int out, int in)
{
	struct report r = { 0 };
	struct mp_pagerd_stats st0, st1;
	struct mp_pager_config pc;
	struct mp_attach *a = NULL;
	struct mp_pager *p = NULL;
	struct mp_store *s;
	const void **x;
	char cmd;
	uint32_t n;

	r.err = mp_store_open(env.path, &s);
	if (r.err)
		goto report;
	n = env.fit;
	x = calloc(n + 1, sizeof(*x));
	if (!x) {
		r.err = -ENOMEM;
		goto report;
	}
	mp_pager_config_init(&pc);
	pc.budget_bytes = budget;
	r.err = sock ? mp_attach_open(s, sock, &a) : mp_pager_open(s, &pc, &p);
	if (!r.err && a)
		r.err = mp_attach_daemon_stats(a, &st0);
	for (uint32_t i = 0; !r.err && i < n; i++) {
		uint32_t l = i / mp_store_geometry(s)->experts, e = i % mp_store_geometry(s)->experts;

		x[i] = a ? mp_attach_expert(a, l, e) : mp_pager_expert(p, l, e);
	}
	if (!r.err)
		r.err = a ? mp_attach_guard(a, touch_all, x) : mp_pager_guard(p, touch_all, x);
	r.ready_s = (double)(cli_now_ns() - t0) / 1e9;
	if (!r.err && a && !mp_attach_daemon_stats(a, &st1))
		r.disk_bytes = st1.disk_bytes_read - st0.disk_bytes_read;
	if (!r.err && p) {
		struct mp_pager_stats ps;

		mp_pager_stats(p, &ps);
		r.disk_bytes = ps.bytes_file;
	}
report:
	if (write(out, &r, sizeof(r)) != sizeof(r) || read(in, &cmd, 1) < 0)
		r.err = r.err ? r.err : -EPIPE;
	mp_attach_close(a);
	mp_pager_close(p);
	return r.err ? 1 : 0;
}

static int engine_start(struct engine *e, const char *sock, uint64_t budget, struct report *r)
{
	uint64_t t0 = cli_now_ns();
	int up[2], down[2];

	if (pipe(up) || pipe(down))
		return -errno;
	e->pid = fork();
	if (e->pid == 0) {
		close(up[0]);
		close(down[1]);
		_exit(engine_main(sock, budget, t0, up[1], down[0]));
	}
	close(up[1]);
	close(down[0]);
	e->from = up[0];
	e->to = down[1];
	if (e->pid < 0 || read(e->from, r, sizeof(*r)) != sizeof(*r))
		return -ECHILD;
	if (r->err)
		cli_error(0, "an engine failed: %s", strerror(-r->err));
	return r->err;
}

/* Tells the engine to leave and waits for its exit. Returns the seconds it took. */
static double engine_stop(struct engine *e)
{
	uint64_t t0 = cli_now_ns();
	char cmd = 'x';

	if (e->pid <= 0)
		return 0;
	if (write(e->to, &cmd, 1) != 1)
		kill(e->pid, SIGKILL);
	waitpid(e->pid, NULL, 0);
	close(e->from);
	close(e->to);
	e->pid = 0;
	return (double)(cli_now_ns() - t0) / 1e9;
}

uint64_t eb_proc_number(pid_t pid, const char *file, const char *fmt)
{
	char path[64], line[256];
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, fmt, &v) == 1)
			break;
	fclose(f);
	return v;
}

/* Bytes backing the memfds a process holds open (the daemon's host tier and dense weights). */
static uint64_t memfd_bytes_of(pid_t pid)
{
	char dir[32], path[300], link[64];
	uint64_t sum = 0;
	struct dirent *e;
	struct stat sb;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	while (d && (e = readdir(d))) {
		ssize_t n;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n > 7 && !strncmp(link, "/memfd:", 7) && !stat(path, &sb))
			sum += (uint64_t)sb.st_blocks * 512;
	}
	if (d)
		closedir(d);
	return sum;
}

uint64_t eb_memory_of(pid_t pid)
{
	uint64_t pss = eb_proc_number(pid, "smaps_rollup", "Pss: %llu kB");
	uint64_t shmem = eb_proc_number(pid, "smaps_rollup", "Pss_Shmem: %llu kB");

	return (pss > shmem ? pss - shmem : 0) * 1024 + memfd_bytes_of(pid);
}

int eb_warm_tier(const char *sock)
{
	struct engine e = { 0 };
	struct report r;
	int err = engine_start(&e, sock, 0, &r);

	engine_stop(&e);
	return err;
}

/*
 * The setups
 */

struct setup {
	double scale_up_s, scale_down_s, downtime_s;
	uint64_t peak_memory, disk_bytes;
};

/* 1 -> 2 -> 1 engines over a pager daemon: the first warms the tier, the second attaches. */
static int run_shared(uint64_t budget, int fd, struct setup *o)
{
	struct engine e1 = { 0 }, e2 = { 0 };
	struct report r1, r2;
	char sock[64];
	pid_t d;
	int err;

	snprintf(sock, sizeof(sock), "/tmp/moepager-elastic-%d.sock", (int)getpid());
	cli_drop_caches(fd);
	d = cli_start_pagerd(env.path, sock, budget, env.load.pages);
	if (d < 0)
		return (int)d;
	err = engine_start(&e1, sock, 0, &r1);
	if (!err)
		err = engine_start(&e2, sock, 0, &r2);
	if (!err) {
		o->scale_up_s = r2.ready_s;
		o->disk_bytes = r2.disk_bytes;
		o->peak_memory = eb_memory_of(d) + eb_memory_of(e1.pid) + eb_memory_of(e2.pid);
		o->downtime_s = 0;	/* e1 stays mapped until e2 is ready */
	}
	o->scale_down_s = engine_stop(&e1);
	engine_stop(&e2);
	cli_child_stop(d);
	return err;
}

/* The same with a second full copy: the new engine opens its own pager and reads again. */
static int run_copy(uint64_t budget, int fd, struct setup *o)
{
	struct engine e1 = { 0 }, e2 = { 0 };
	struct report r1, r2;
	int err;

	cli_drop_caches(fd);
	err = engine_start(&e1, NULL, budget, &r1);
	if (!err)
		err = engine_start(&e2, NULL, budget, &r2);
	if (!err) {
		o->scale_up_s = r2.ready_s;
		o->disk_bytes = r2.disk_bytes;
		o->peak_memory = eb_memory_of(e1.pid) + eb_memory_of(e2.pid);
		o->downtime_s = 0;
	}
	o->scale_down_s = engine_stop(&e1);
	engine_stop(&e2);
	return err;
}

/* A cold restart: the engine leaves, then a new one starts from the file. */
static int run_restart(uint64_t budget, int fd, struct setup *o)
{
	struct engine e1 = { 0 }, e2 = { 0 };
	struct report r1, r2;
	uint64_t peak;
	int err;

	cli_drop_caches(fd);
	err = engine_start(&e1, NULL, budget, &r1);
	if (err) {
		engine_stop(&e1);
		return err;
	}
	peak = eb_memory_of(e1.pid);
	o->scale_down_s = engine_stop(&e1);
	cli_drop_caches(fd);
	err = engine_start(&e2, NULL, budget, &r2);
	if (!err) {
		o->scale_up_s = r2.ready_s;
		o->downtime_s = o->scale_down_s + r2.ready_s;
		o->disk_bytes = r2.disk_bytes;
		o->peak_memory = (peak > eb_memory_of(e2.pid) ? peak : eb_memory_of(e2.pid));
	}
	engine_stop(&e2);
	return err;
}

static json_t *setup_json(const struct setup *o, const struct setup *cold)
{
	return json_pack("{s:f, s:f, s:f, s:I, s:I, s:f, s:f}", "scale_up_s", o->scale_up_s,
			 "scale_down_s", o->scale_down_s, "downtime_s", o->downtime_s,
			 "peak_memory_bytes", (json_int_t)o->peak_memory,
			 "disk_bytes_read", (json_int_t)o->disk_bytes,
			 "scale_up_to_cold_restart", o->scale_up_s / cold->scale_up_s,
			 "peak_memory_to_cold_restart",
			 (double)o->peak_memory / (double)cold->peak_memory);
}

static int report(struct mp_store *s, uint64_t budget, const struct setup *sh,
		  const struct setup *cp, const struct setup *cold)
{
	json_t *o;
	int err = 0;

	if (!env.json) {
		const struct { const char *name; const struct setup *o; } rows[] = {
			{ "shared", sh }, { "second_copy", cp }, { "cold_restart", cold },
		};

		printf("bench-elastic %s: %u experts touched per engine, budget %llu bytes\n",
		       mp_store_path(s), env.fit, (unsigned long long)budget);
		printf("  %-13s %12s %14s %12s %14s %14s\n", "setup", "scale_up_s", "scale_down_s",
		       "downtime_s", "peak_MiB", "disk_MiB");
		for (size_t i = 0; i < 3; i++)
			printf("  %-13s %12.3f %14.3f %12.3f %14.1f %14.1f\n", rows[i].name,
			       rows[i].o->scale_up_s, rows[i].o->scale_down_s, rows[i].o->downtime_s,
			       rows[i].o->peak_memory / 1048576.0, rows[i].o->disk_bytes / 1048576.0);
		return 0;
	}
	o = json_pack("{s:s, s:I, s:I, s:I, s:s, s:o, s:o, s:o}", "model", mp_store_path(s),
		      "budget_bytes", (json_int_t)budget, "experts_touched", (json_int_t)env.fit,
		      "expert_bytes", (json_int_t)mp_store_expert_bytes(s),
		      "load", "none: requests and throughput during scaling are not measured",
		      "shared", setup_json(sh, cold), "second_copy", setup_json(cp, cold),
		      "cold_restart", setup_json(cold, cold));
	if (!o || json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6)))
		err = -EIO;
	putchar('\n');
	json_decref(o);
	return err;
}

int cmd_elasticbench(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	struct setup sh = { 0 }, cp = { 0 }, cold = { 0 };
	uint64_t total, budget, stride;
	struct mp_store *s;
	int fd, err;

	memset(&env, 0, sizeof(env));
	env.load = (struct el_config){ .phase = 20, .threads = 1, .max_tokens = 16,
				       .prompt_ids = 16, .slo_ttft_ms = 2000, .slo_tpot_ms = 500,
				       .retry_s = 60, .seed = 1, .pages = "small" };
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.path, &s);
	if (err)
		return cli_fail(err, "%s", env.path);
	total = mp_store_total_expert_bytes(s);
	err = mp_budget_parse(env.budget ? env.budget : "100%", total, &budget);
	stride = (mp_store_expert_bytes(s) + 4095) & ~4095ull;
	env.fit = (uint32_t)(budget / stride);
	if (!err && !env.fit)
		err = -EINVAL;
	fd = open(env.path, O_RDONLY | O_CLOEXEC);
	/* Children are forked: nothing buffered may be written twice. */
	fflush(NULL);
	if (!err && env.load.rate > 0) {
		json_t *o = NULL;

		env.load.model = env.path;
		env.load.budget = budget;
		env.load.fd = fd;
		err = env.load.threads_to ? el_run_threads(&env.load, &o) :
					    el_run_loaded(&env.load, &o);
		if (!err) {
			json_object_set_new(o, "model", json_string(mp_store_path(s)));
			json_object_set_new(o, "budget_bytes", json_integer((json_int_t)budget));
			json_object_set_new(o, "experts_warmed", json_integer((json_int_t)env.fit));
			if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6)))
				err = -EIO;
			putchar('\n');
		}
		json_decref(o);
		goto done;
	}
	if (!err)
		err = run_shared(budget, fd, &sh);
	if (!err)
		err = run_copy(budget, fd, &cp);
	if (!err)
		err = run_restart(budget, fd, &cold);
	if (!err)
		err = report(s, budget, &sh, &cp, &cold);
done:
	if (err)
		cli_fail(err, NULL);
	if (fd >= 0)
		close(fd);
	mp_store_close(s);
	return err;
}
