// SPDX-License-Identifier: MIT
/* moepager bench-preload: llama.cpp decoding a GGUF with libmoepager-preload.so, on its own mmap, and resident. */
#include <argp.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <moepager.h>

#include "bench.h"

#define MAX_REPEAT 32

static struct pb_env {
	const char *gguf;
	const char *llama_run;
	const char *backends;
	const char *preload;
	const char *budget;
	const char *prompt;
	const char *eviction;
	uint64_t limit;
	uint32_t tokens;
	uint32_t repeat;
	uint32_t threads;
	uint32_t prefetch;
} env;

static const char doc[] =
	"Decode greedily with an unmodified llama.cpp program (tests/llama/llama_run, built\n"
	"against the npm llama.cpp) three ways, in turns, and report decode tokens/s:\n"
	"  mmap     llama.cpp on its own mmap of the file, from a dropped page cache;\n"
	"  resident llama.cpp on its own mmap with the file already in the page cache;\n"
	"  preload  LD_PRELOAD=libmoepager-preload.so at --budget, from a dropped page cache;\n"
	"  warm     the preload at a 100% budget with every expert read at open\n"
	"           (MOEPAGER_WARM=1), against resident.\n"
	"--memory-limit puts the mmap and preload runs in a memory cgroup of that limit (the\n"
	"same for both; v1 memory controller where mounted, else v2). The page cache is\n"
	"dropped with /proc/sys/vm/drop_caches as root, else posix_fadvise(DONTNEED).\n"
	"\n"
	"Prints one JSON object: preload_tok_s, mmap_tok_s, resident_tok_s (medians over\n"
	"--repeat), preload_warm_tok_s, preload_to_mmap, preload_to_resident and\n"
	"preload_warm_to_resident (medians of per-repeat ratios),\n"
	"hit_rate (routed experts in memory when llama.cpp's eval callback saw them),\n"
	"tokens_identical (every run decoded the same tokens), the preload's bytes_read,\n"
	"faults, fills, evictions, peak RSS of each kind of run, and the parameters.\n"
	"\n"
	"EXAMPLE:\n"
	"  moepager bench-preload --gguf m.gguf --llama-run build/tests/llama/llama_run \\\n"
	"    --backends .cache/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 \\\n"
	"    --preload build/tools/preload/libmoepager-preload.so --budget 50%\n";

enum { OPT_LLAMA = 1000, OPT_BACKENDS, OPT_PRELOAD, OPT_LIMIT, OPT_PREFETCH, OPT_EVICT };

static const struct argp_option opts[] = {
	{ "gguf", 'm', "FILE", 0, "The GGUF model", 0 },
	{ "llama-run", OPT_LLAMA, "FILE", 0, "The llama.cpp driver (tests/llama/llama_run)", 0 },
	{ "backends", OPT_BACKENDS, "DIR", 0, "llama.cpp's backend libraries", 0 },
	{ "preload", OPT_PRELOAD, "FILE", 0, "libmoepager-preload.so", 0 },
	{ "budget", 'b', "SIZE|N%", 0, "Expert budget of the preload (default 50%)", 0 },
	{ "eviction", OPT_EVICT, "NAME", 0, "Eviction policy of the preload (default lru)", 0 },
	{ "prefetch", OPT_PREFETCH, "N", 0, "Experts read ahead per use (default 0)", 0 },
	{ "memory-limit", OPT_LIMIT, "SIZE", 0, "Memory cgroup limit of mmap and preload runs",
	  0 },
	{ "prompt", 'p', "IDS", 0, "Prompt token ids (default 1,450,1200,33)", 0 },
	{ "tokens", 'n', "N", 0, "Tokens to generate (default 64)", 0 },
	{ "repeat", 'r', "N", 0, "Repeats (default 3)", 0 },
	{ "threads", 't', "N", 0, "llama.cpp threads (default 1)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'm': env.gguf = arg; break;
	case OPT_LLAMA: env.llama_run = arg; break;
	case OPT_BACKENDS: env.backends = arg; break;
	case OPT_PRELOAD: env.preload = arg; break;
	case 'b': env.budget = arg; break;
	case OPT_EVICT: env.eviction = arg; break;
	case 'p': env.prompt = arg; break;
	case OPT_PREFETCH:
		cli_opt_u32(state, "--prefetch", arg, 0, 64, &env.prefetch);
		break;
	case OPT_LIMIT:
		cli_opt_size(state, "--memory-limit", arg, &env.limit);
		break;
	case 'n':
		cli_opt_u32(state, "--tokens", arg, 2, 1u << 16, &env.tokens);
		break;
	case 'r':
		cli_opt_u32(state, "--repeat", arg, 1, MAX_REPEAT, &env.repeat);
		break;
	case 't':
		cli_opt_u32(state, "--threads", arg, 1, 1024, &env.threads);
		break;
	case ARGP_KEY_END:
		if (!env.gguf || !env.llama_run || !env.backends || !env.preload)
			argp_error(state, "--gguf, --llama-run, --backends and --preload are needed");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

enum run_kind { RUN_MMAP, RUN_RESIDENT, RUN_PRELOAD, RUN_PRELOAD_WARM };

struct run {
	char tokens[4096];
	double decode_s;
	uint32_t decode_tokens;
	uint64_t rss;
	json_t *stats;		/* the preload's statistics line */
};

/* The child: its cgroup, its environment, stdout into the pipe, then the driver. */
static void child(enum run_kind kind, int out, const char *stats)
{
	char n[16], t[16];
	struct memcg cg;
	int err = 0;

	if ((kind == RUN_MMAP || kind == RUN_PRELOAD) && env.limit &&
	    ((err = memcg_enter(&cg)) ||
	     (err = memcg_write(&cg, cg.v2 ? "memory.max" : "memory.limit_in_bytes", env.limit)))) {
		cli_error(0, "cannot limit memory (a memory cgroup): %s", strerror(-err));
		_exit(126);
	}
	if (kind == RUN_PRELOAD || kind == RUN_PRELOAD_WARM) {
		setenv("LD_PRELOAD", env.preload, 1);
		setenv("MOEPAGER_BUDGET", kind == RUN_PRELOAD ? env.budget : "100%", 1);
		setenv("MOEPAGER_WARM", kind == RUN_PRELOAD ? "0" : "1", 1);
		setenv("MOEPAGER_PRELOAD_STATS", stats, 1);
		snprintf(n, sizeof(n), "%u", env.prefetch);
		setenv("MOEPAGER_PREFETCH", n, 1);
		if (env.eviction)
			setenv("MOEPAGER_EVICTION", env.eviction, 1);
	}
	dup2(out, 1);
	snprintf(n, sizeof(n), "%u", env.tokens);
	snprintf(t, sizeof(t), "%u", env.threads);
	execl(env.llama_run, env.llama_run, "-m", env.gguf, "-B", env.backends, "-p", env.prompt,
	      "-n", n, "-t", t, (char *)NULL);
	cli_error(0, "%s: %s", env.llama_run, strerror(errno));
	_exit(127);
}

/* Reads the driver's "tokens:" and "time:" lines. */
static int parse_output(FILE *f, struct run *r)
{
	char line[sizeof(r->tokens)];
	bool tok = false, time = false;

	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "tokens:", 7)) {
			snprintf(r->tokens, sizeof(r->tokens), "%s", line + 7);
			tok = true;
		} else if (sscanf(line, "time: prompt_s %*f decode_s %lf decode_tokens %u",
				  &r->decode_s, &r->decode_tokens) == 2) {
			time = true;
		}
	}
	return tok && time && r->decode_s > 0 ? 0 : -EPROTO;
}

static int run_once(enum run_kind kind, const char *stats, struct run *r)
{
	struct rusage ru;
	int fds[2], status, err;
	pid_t pid;
	FILE *f;

	memset(r, 0, sizeof(*r));
	unlink(stats);
	if (pipe(fds))
		return -errno;
	pid = fork();
	if (pid == 0) {
		close(fds[0]);
		child(kind, fds[1], stats);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return -errno;
	}
	f = fdopen(fds[0], "r");
	err = f ? parse_output(f, r) : -errno;
	if (f)
		fclose(f);
	if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		err = -ECHILD;
	r->rss = (uint64_t)ru.ru_maxrss * 1024;
	if (kind >= RUN_PRELOAD && !err) {
		r->stats = json_load_file(stats, JSON_DISABLE_EOF_CHECK, NULL);
		if (!r->stats)
			err = -ENODATA;		/* no image: the preload passed the file through */
	}
	if ((kind == RUN_MMAP || kind == RUN_PRELOAD) && env.limit) {
		struct memcg base;
		char dir[PATH_MAX];

		if (!memcg_base(&base)) {
			memcg_child_dir(&base, pid, dir, sizeof(dir));
			rmdir(dir);
		}
	}
	return err;
}

static double tok_s(const struct run *r)
{
	return r->decode_tokens / r->decode_s;
}

static uint64_t stat_u(const struct run *r, const char *key)
{
	return (uint64_t)json_integer_value(json_object_get(r->stats, key));
}

struct results {
	double mmap[MAX_REPEAT], resident[MAX_REPEAT], preload[MAX_REPEAT], warm[MAX_REPEAT];
	double to_mmap[MAX_REPEAT], to_resident[MAX_REPEAT], warm_to_resident[MAX_REPEAT];
	double hit[MAX_REPEAT];
	uint64_t rss[4];
	bool identical;
	struct run last;
};

/* One repeat: mmap cold, a warm-up, resident, preload cold, preload warm at 100 %. */
static int one_repeat(uint32_t i, const char *stats, const char *first, struct results *res)
{
	static const char *const names[] = { "mmap", "resident", "preload", "warm preload" };
	struct run r[4] = { 0 }, warm;
	int err, k = 0;

	cli_drop_caches(-1);
	if ((err = run_once(RUN_MMAP, stats, &r[0])))
		goto fail;
	k = 1;
	if ((err = run_once(RUN_RESIDENT, stats, &warm)) ||
	    (err = run_once(RUN_RESIDENT, stats, &r[1])))
		goto fail;
	cli_drop_caches(-1);
	k = 2;
	if ((err = run_once(RUN_PRELOAD, stats, &r[2])))
		goto fail;
	k = 3;
	if ((err = run_once(RUN_PRELOAD_WARM, stats, &r[3])))
		goto fail;
	for (k = 0; k < 4; k++) {
		res->identical &= !strcmp(r[k].tokens, first[0] ? first : r[0].tokens);
		res->rss[k] = r[k].rss > res->rss[k] ? r[k].rss : res->rss[k];
	}
	res->mmap[i] = tok_s(&r[0]);
	res->resident[i] = tok_s(&r[1]);
	res->preload[i] = tok_s(&r[2]);
	res->warm[i] = tok_s(&r[3]);
	res->to_mmap[i] = res->preload[i] / res->mmap[i];
	res->to_resident[i] = res->preload[i] / res->resident[i];
	res->warm_to_resident[i] = res->warm[i] / res->resident[i];
	res->hit[i] = json_real_value(json_object_get(r[2].stats, "hit_rate"));
	json_decref(res->last.stats);
	json_decref(r[3].stats);
	res->last = r[2];
	fprintf(stderr, "repeat %u: mmap %.1f, resident %.1f, preload %.1f, warm preload %.1f "
		"tok/s\n", i + 1, res->mmap[i], res->resident[i], res->preload[i], res->warm[i]);
	return 0;
fail:
	cli_error(0, "the %s run failed: %s", names[k],
		err == -ENODATA ? "the preload made no image of the file" : strerror(-err));
	json_decref(r[2].stats);
	json_decref(r[3].stats);
	return err;
}

static void print_json(struct results *res)
{
	uint32_t R = env.repeat;
	const struct run *p = &res->last;
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "gguf", env.gguf,
			      "budget", env.budget, "prompt", env.prompt,
			      "tokens", (json_int_t)env.tokens, "repeat", (json_int_t)R,
			      "threads", (json_int_t)env.threads,
			      "memory_limit", (json_int_t)env.limit);

	json_object_set_new(o, "preload_tok_s", json_real(cli_median(res->preload, R)));
	json_object_set_new(o, "mmap_tok_s", json_real(cli_median(res->mmap, R)));
	json_object_set_new(o, "resident_tok_s", json_real(cli_median(res->resident, R)));
	json_object_set_new(o, "preload_to_mmap", json_real(cli_median(res->to_mmap, R)));
	json_object_set_new(o, "preload_to_resident", json_real(cli_median(res->to_resident, R)));
	json_object_set_new(o, "preload_warm_tok_s", json_real(cli_median(res->warm, R)));
	json_object_set_new(o, "preload_warm_to_resident",
			    json_real(cli_median(res->warm_to_resident, R)));
	json_object_set_new(o, "hit_rate", json_real(cli_median(res->hit, R)));
	json_object_set_new(o, "tokens_identical", json_boolean(res->identical));
	json_object_set_new(o, "cache_mode", json_string(cli_drop_caches(-1)));
	json_object_set_new(o, "budget_bytes", json_integer(stat_u(p, "budget_bytes")));
	json_object_set_new(o, "expert_bytes", json_integer(stat_u(p, "expert_bytes")));
	json_object_set_new(o, "bytes_read", json_integer(stat_u(p, "bytes_read")));
	json_object_set_new(o, "faults", json_integer(stat_u(p, "faults")));
	json_object_set_new(o, "fills", json_integer(stat_u(p, "fills")));
	json_object_set_new(o, "evictions", json_integer(stat_u(p, "evictions")));
	json_object_set_new(o, "mmap_rss", json_integer(res->rss[0]));
	json_object_set_new(o, "resident_rss", json_integer(res->rss[1]));
	json_object_set_new(o, "preload_rss", json_integer(res->rss[2]));
	json_object_set_new(o, "preload_warm_rss", json_integer(res->rss[3]));
	json_dumpf(o, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(o);
}

int cmd_preloadbench(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	char stats[PATH_MAX], first[sizeof(((struct run *)0)->tokens)] = "";
	struct results res = { .identical = true };
	int err = 0;

	memset(&env, 0, sizeof(env));
	env.budget = "50%";
	env.prompt = "1,450,1200,33";
	env.tokens = 64;
	env.repeat = 3;
	env.threads = 1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	snprintf(stats, sizeof(stats), "%s/moepager-bench-preload-%d.json",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
	for (uint32_t i = 0; i < env.repeat && !err; i++) {
		err = one_repeat(i, stats, first, &res);
		if (!err && !first[0])
			snprintf(first, sizeof(first), "%s", res.last.tokens);
	}
	unlink(stats);
	if (!err)
		print_json(&res);
	json_decref(res.last.stats);
	return err ? 1 : 0;
}
