// SPDX-License-Identifier: MIT
/* moepager gen: writes a model with deterministic random weights from a preset geometry. */
#include <argp.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <moepager.h>

#include "cli.h"

static struct gen_env {
	const char *preset;
	const char *out;
	const char *name;
	uint64_t seed;
	uint32_t variant;
	double spread;
	bool quiet;
	/* geometry overrides: applied after the preset is loaded */
	struct mp_geometry g;
	bool set[16];
	enum mp_dtype dtype;
	bool set_dtype;
	bool set_spread;
} env;

enum {
	OPT_LAYERS = 0x100, OPT_EXPERTS, OPT_TOPK, OPT_HIDDEN, OPT_FFN, OPT_HEADS,
	OPT_KV_HEADS, OPT_HEAD_DIM, OPT_VOCAB, OPT_MAX_SEQ, OPT_DTYPE, OPT_NAME, OPT_VARIANT,
	OPT_SPREAD,
};

static const char doc[] =
	"Write an .mpk model with random weights (uniform, variance 1/fan_in; norms 1).\n"
	"The bytes depend only on the geometry and the seed. Geometry flags override\n"
	"the preset's values. Presets: tiny, mixtral-mini, deepseek-lite-mini,\n"
	"deepseek-v2-lite-mini, qwen3-moe-mini, olmoe-mini (README lists them).\n"
	"\n"
	"--variant V (V >= 1) writes a variant of the model --seed gives, as a fine-tune\n"
	"would be: every matrix value plus noise within --spread times its range\n"
	"(default 0.03), from the variant's own stream. Same-position experts of two\n"
	"variants are then --spread times as far apart as experts at different\n"
	"positions (docs/multi.md).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager gen --preset tiny --out /tmp/tiny.mpk\n"
	"  moepager gen --preset mixtral-mini --out mixtral-mini.mpk --seed 7\n"
	"  moepager gen --preset tiny --dtype bf16 --layers 2 --out /tmp/t2.mpk\n"
	"  moepager gen --preset qwen3-moe-mini --out qwen3-moe-mini.mpk\n"
	"  moepager gen --preset mixtral-mini --dtype q8_0 --out mixtral-q8.mpk\n"
	"  moepager gen --preset tiny --seed 7 --variant 2 --spread 0.03 --out v2.mpk\n";

static const struct argp_option opts[] = {
	{ "preset", 'p', "NAME", 0, "Preset geometry (default: tiny)", 0 },
	{ "out", 'o', "FILE", 0, "Output file (required)", 0 },
	{ "seed", 's', "N", 0, "Random seed (default: 1)", 0 },
	{ "name", OPT_NAME, "NAME", 0, "Model name recorded in the header (default: preset)", 0 },
	{ "quiet", 'q', NULL, 0, "No summary line", 0 },
	{ "variant", OPT_VARIANT, "V", 0, "Write variant V (>= 1) of the seed's model", 0 },
	{ "spread", OPT_SPREAD, "S", 0, "A variant's noise relative to the weights (default "
	  "0.03)", 0 },
	{ NULL, 0, NULL, 0, "Geometry overrides:", 1 },
	{ "layers", OPT_LAYERS, "N", 0, "MoE decoder layers", 1 },
	{ "experts", OPT_EXPERTS, "N", 0, "Experts per layer", 1 },
	{ "topk", OPT_TOPK, "N", 0, "Experts used per token", 1 },
	{ "hidden", OPT_HIDDEN, "N", 0, "Model width", 1 },
	{ "ffn", OPT_FFN, "N", 0, "Expert intermediate width", 1 },
	{ "heads", OPT_HEADS, "N", 0, "Attention query heads", 1 },
	{ "kv-heads", OPT_KV_HEADS, "N", 0, "Attention key/value heads", 1 },
	{ "head-dim", OPT_HEAD_DIM, "N", 0, "Width of one head", 1 },
	{ "vocab", OPT_VOCAB, "N", 0, "Vocabulary size", 1 },
	{ "max-seq", OPT_MAX_SEQ, "N", 0, "Longest sequence", 1 },
	{ "dtype", OPT_DTYPE, "TYPE", 0,
	  "Weight type: f32, f16, bf16, q8_0 or q4_0 (rows of 32-value blocks)", 1 },
	{ 0 },
};

static uint32_t *geom_field(struct mp_geometry *g, int key)
{
	switch (key) {
	case OPT_LAYERS: return &g->layers;
	case OPT_EXPERTS: return &g->experts;
	case OPT_TOPK: return &g->topk;
	case OPT_HIDDEN: return &g->hidden;
	case OPT_FFN: return &g->ffn;
	case OPT_HEADS: return &g->heads;
	case OPT_KV_HEADS: return &g->kv_heads;
	case OPT_HEAD_DIM: return &g->head_dim;
	case OPT_VOCAB: return &g->vocab;
	case OPT_MAX_SEQ: return &g->max_seq;
	default: return NULL;
	}
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	const struct argp_option *o;
	uint32_t *field;
	char name[32];

	switch (key) {
	case 'p':
		env.preset = arg;
		break;
	case 'o':
		env.out = arg;
		break;
	case 's':
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case 'q':
		env.quiet = true;
		break;
	case OPT_NAME:
		env.name = arg;
		break;
	case OPT_VARIANT:
		cli_opt_u32(state, "--variant", arg, 1, UINT32_MAX, &env.variant);
		break;
	case OPT_SPREAD:
		cli_opt_double(state, "--spread", arg, 1e-6, 1, &env.spread);
		env.set_spread = true;
		break;
	case OPT_DTYPE:
		cli_opt_dtype(state, arg, &env.dtype);
		env.set_dtype = true;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.out)
			argp_error(state, "--out FILE is required");
		if (env.set_spread && !env.variant)
			argp_error(state, "--spread sets a variant's noise: it needs --variant V");
		break;
	default:
		field = geom_field(&env.g, key);
		if (!field)
			return ARGP_ERR_UNKNOWN;
		/* the option's name for the message; the table ends with an all-zero entry */
		for (o = opts; o->key != key && (o->name || o->doc); o++)
			;
		snprintf(name, sizeof(name), "--%s", o->name ? o->name : "geometry");
		/* the range check proper is mp_geometry_check(); this only rejects non-numbers */
		cli_opt_u32(state, name, arg, 0, UINT32_MAX, field);
		env.set[key - OPT_LAYERS] = true;
		break;
	}
	return 0;
}

static void apply_overrides(struct mp_geometry *g)
{
	for (int key = OPT_LAYERS; key <= OPT_MAX_SEQ; key++)
		if (env.set[key - OPT_LAYERS])
			*geom_field(g, key) = *geom_field(&env.g, key);
	if (env.set_dtype)
		g->dtype = env.dtype;
}

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("gen", done, total);
}

int cmd_gen(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	struct mp_geometry g;
	uint64_t t0, ns;
	int err;

	memset(&env, 0, sizeof(env));
	env.preset = "tiny";
	env.seed = 1;
	env.spread = 0.03;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_gen_preset(env.preset, &g);
	if (err)
		return cli_fail(err, "--preset %s", env.preset);
	apply_overrides(&g);
	t0 = cli_now_ns();
	err = mp_gen_variant(env.out, &g, env.seed, env.variant, (float)env.spread,
			     env.name ? env.name : env.preset,
			     cli_progress_enabled() ? on_progress : NULL, NULL);
	cli_progress_end();
	if (err)
		return cli_fail(err, "%s", env.out);
	ns = cli_now_ns() - t0;
	if (!env.quiet) {
		uint64_t data = (uint64_t)g.layers * g.experts * mp_geometry_expert_bytes(&g);
		struct stat sb = { 0 };

		/* Experts start on 2 MiB boundaries: small ones leave holes, so say both sizes. */
		stat(env.out, &sb);
		printf("%s: %u layers x %u experts, %s, %.1f MB of experts in %.2f s "
		       "(%.0f MB/s of experts); file %.1f MB, %.1f MB on disk\n", env.out,
		       g.layers, g.experts, mp_dtype_name(g.dtype), data / 1e6, ns / 1e9,
		       data / 1e6 / (ns / 1e9), sb.st_size / 1e6, sb.st_blocks * 512 / 1e6);
	}
	return 0;
}
