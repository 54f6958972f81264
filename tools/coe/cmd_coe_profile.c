// SPDX-License-Identifier: MIT
/* moepager coe-profile: CoServe's offline profiler over a CoE (docs/coe.md). */
#include <argp.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"

static struct {
	const char *coe;
	const char *out;
	const char *threads;
	uint32_t max_batch, tokens, repeat;
	bool json, no_drop;
	struct cli_engine_opts eng;
	int container_fd;
} env;

enum { OPT_THREADS = 0x100, OPT_MAX_BATCH, OPT_TOKENS, OPT_REPEAT, OPT_NO_DROP };

static const char doc[] =
	"Profile a CoE on this machine, once per executor kind (engine threads) and\n"
	"architecture (one model stands for its architecture): the batch latency\n"
	"K n + B fitted by least squares over batches 1..--max-batch, the largest batch\n"
	"before the per-request latency stops improving by 5%, the time to load a whole\n"
	"model from the file tier (page cache dropped first: drop_caches as root, else\n"
	"fadvise; the pager reads with O_DIRECT) and from host memory, and the memory a\n"
	"model and a batch item hold. Each point is the fastest of --repeat runs (on a\n"
	"shared machine other work only adds). Writes the profile the scheduler reads (--out).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager coe-profile --coe /work/scratch/coe/coe.json --threads 1,2 \\\n"
	"      --out /work/scratch/coe/profile.json --json\n";

static const struct argp_option opts[] = {
	{ "coe", 'c', "FILE", 0, "The CoE manifest (coe.json; required)", 0 },
	{ "out", 'o', "FILE", 0, "Write the profile here", 0 },
	{ "threads", OPT_THREADS, "LIST", 0, "Executor kinds: engine threads, e.g. 1,2 (default 1)",
	  0 },
	{ "max-batch", OPT_MAX_BATCH, "N", 0, "Largest batch measured (default 16)", 0 },
	{ "tokens", OPT_TOKENS, "N", 0, "Tokens per request (default 4)", 0 },
	{ "repeat", OPT_REPEAT, "N", 0, "Runs per point, the fastest counts (default 5)", 0 },
	{ "no-drop", OPT_NO_DROP, NULL, 0, "Do not drop the page cache before file loads", 0 },
	{ "json", 'j', NULL, 0, "Print the profile as JSON", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case ARGP_KEY_INIT:
		state->child_inputs[0] = &env.eng;
		break;
	case 'c':
		env.coe = arg;
		break;
	case 'o':
		env.out = arg;
		break;
	case 'j':
		env.json = true;
		break;
	case OPT_THREADS:
		env.threads = arg;
		break;
	case OPT_NO_DROP:
		env.no_drop = true;
		break;
	case OPT_MAX_BATCH:
		cli_opt_u32(state, "--max-batch", arg, 2, 256, &env.max_batch);
		break;
	case OPT_TOKENS:
		cli_opt_u32(state, "--tokens", arg, 1, 4096, &env.tokens);
		break;
	case OPT_REPEAT:
		cli_opt_u32(state, "--repeat", arg, 1, 1000, &env.repeat);
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.coe)
			argp_error(state, "--coe FILE is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/* "1,2,4" into threads[]; returns the count or -EINVAL (printed). */
static int parse_threads(const char *s, uint32_t *out, uint32_t max)
{
	char buf[256], *save = NULL, *tok;
	int n = 0;

	snprintf(buf, sizeof(buf), "%s", s ? s : "1");
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if ((uint32_t)n == max || cli_parse_u32("--threads", tok, 1, 256, &out[n]))
			return -EINVAL;
		n++;
	}
	return n ? n : -EINVAL;
}

static void before_file_load(void *arg)
{
	(void)arg;
	if (!env.no_drop)
		cli_drop_caches(env.container_fd);
}

static void print_profile(const struct mp_coe *c, const struct mp_coe_profile *pr)
{
	for (uint32_t i = 0; i < pr->n; i++) {
		const struct mp_coe_perf *e = &pr->perf[i];
		struct mp_coe_arch_info a;

		mp_coe_arch(c, e->arch, &a);
		printf("threads %u %-6s K %7.1f us  B %7.1f us (r2 %.3f)  max batch %2u  load file "
		       "%6.2f ms host %5.2f ms  model %.1f MiB  item %.0f KiB\n", e->threads, a.name,
		       e->k_ns / 1e3, e->b_ns / 1e3, e->r2, e->max_batch, e->load_file_ns / 1e6,
		       e->load_host_ns / 1e6, e->model_bytes / 1048576.0, e->item_bytes / 1024.0);
	}
}

static int run_profile(struct mp_coe *c, const uint32_t *threads, uint32_t nt,
		       struct mp_coe_profile *pr)
{
	struct mp_store *cs = mp_coe_container(c);
	uint64_t largest = 0;
	struct mp_pager_config pc = { .eviction = "lru", .fill_threads = 4,
				      .slots_per_layer = mp_store_geometry(cs)->experts };
	struct mp_coe_profile_config cfg = {
		.threads = threads, .n_threads = nt, .max_batch = env.max_batch,
		.tokens = env.tokens, .repeat = env.repeat, .engine = env.eng.engine,
		.before_file_load = before_file_load,
	};
	struct mp_pager *p;
	int err;

	for (uint32_t m = 0; m < mp_coe_model_count(c); m++) {
		struct mp_coe_model_info mi;

		mp_coe_model(c, m, &mi);
		largest = mi.bytes > largest ? mi.bytes : largest;
	}
	/* Room for one model and its host-memory copy, nothing else to evict for. */
	pc.budget_bytes = 2 * largest;
	env.container_fd = mp_store_fd(cs);
	err = mp_pager_open(cs, &pc, &p);
	if (err) {
		cli_fail(err, NULL);
		return err;
	}
	err = mp_coe_profile_run(c, p, &cfg, pr);
	if (err)
		cli_fail(err, NULL);
	mp_pager_close(p);
	return err;
}

int cmd_coe_profile(int argc, char **argv)
{
	static const struct argp_child children[] = { { &cli_engine_argp, 0, NULL, 0 }, { 0 } };
	static const struct argp argp = { opts, parse_arg, NULL, doc, children, NULL, NULL };
	struct mp_coe_profile pr = { 0 };
	uint32_t threads[16];
	struct mp_coe *c;
	int nt, err;

	memset(&env, 0, sizeof(env));
	env.container_fd = -1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	nt = parse_threads(env.threads, threads, 16);
	if (nt < 0)
		return nt;
	err = mp_coe_open(env.coe, &c);
	if (err) {
		cli_fail(err, NULL);
		return err;
	}
	err = run_profile(c, threads, (uint32_t)nt, &pr);
	if (!err && env.out)
		err = mp_coe_profile_save(&pr, env.out);
	if (!err && env.json)
		err = mp_coe_profile_save(&pr, "/dev/stdout");
	else if (!err)
		print_profile(c, &pr);
	if (err)
		cli_fail(err, NULL);
	mp_coe_profile_free(&pr);
	mp_coe_close(c);
	return err;
}
