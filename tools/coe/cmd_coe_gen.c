// SPDX-License-Identifier: MIT
/* moepager coe-gen: writes a Collaboration-of-Experts model (docs/coe.md). */
#include <argp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#include "cli.h"

static struct {
	const char *out;
	const char *preset;
	uint32_t components;
	double zipf, detector_share, clean;
	uint64_t seed;
} env;

enum { OPT_ZIPF = 0x100, OPT_DET, OPT_CLEAN, OPT_COMPONENTS };

static const char doc[] =
	"Write a CoE as CoServe's circuit-board inspection has it: one classifier per\n"
	"component type (frequencies Zipf-distributed), and shared detectors that run\n"
	"after a clean classification for a share of the components. Every model's\n"
	"experts go into DIR/experts.mpk (one pager range); DIR/trunk-ARCH.mpk holds each\n"
	"architecture's dense weights; DIR/coe.json lists the models, their start\n"
	"probabilities and the dependency graph.\n"
	"\n"
	"Presets: default (352 components over classifiers clf-s and clf-l, detectors\n"
	"det-m and det-l; bf16 experts of 1.5 MiB; 4.9 GiB), tiny (12 components, f32\n"
	"experts of 96 KiB: for tests).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager coe-gen --out /work/scratch/coe\n"
	"  moepager coe-gen --preset tiny --out /tmp/coe --components 8\n";

static const struct argp_option opts[] = {
	{ "out", 'o', "DIR", 0, "Output directory (required)", 0 },
	{ "preset", 'p', "NAME", 0, "default or tiny (default: default)", 0 },
	{ "components", OPT_COMPONENTS, "N", 0, "Component types (classifiers; default 352)", 0 },
	{ "zipf", OPT_ZIPF, "S", 0, "Skew of the component frequencies (default 1.0)", 0 },
	{ "detector-share", OPT_DET, "P", 0, "Components with a detector (default 0.5)", 0 },
	{ "clean", OPT_CLEAN, "P", 0, "P(clean classification): the detector runs (default 0.9)",
	  0 },
	{ "seed", 's', "N", 0, "Random seed (default 1)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'o':
		env.out = arg;
		break;
	case 'p':
		env.preset = arg;
		break;
	case 's':
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case OPT_COMPONENTS:
		cli_opt_u32(state, "--components", arg, 1, 60000, &env.components);
		break;
	case OPT_ZIPF:
		cli_opt_double(state, "--zipf", arg, 0, 100, &env.zipf);
		break;
	case OPT_DET:
		cli_opt_double(state, "--detector-share", arg, 0, 1, &env.detector_share);
		break;
	case OPT_CLEAN:
		cli_opt_double(state, "--clean", arg, 0, 1, &env.clean);
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.out)
			argp_error(state, "--out DIR is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

#define GEO(L, E, K, H, F, HEADS, KV, HD, V, S, DT) \
	{ .layers = L, .experts = E, .topk = K, .hidden = H, .ffn = F, .heads = HEADS, \
	  .kv_heads = KV, .head_dim = HD, .vocab = V, .max_seq = S, .dtype = DT, \
	  .rope_theta = 10000.0f, .norm_eps = 1e-5f }

/* Every expert of a preset has one size (hidden x ffn fixed): one container holds them all. */
static const struct mp_coe_gen_arch default_archs[] = {
	{ "clf-s", GEO(2, 4, 2, 512, 512, 8, 2, 64, 256, 64, MP_DTYPE_BF16), false, 2 },
	{ "clf-l", GEO(2, 6, 2, 256, 1024, 4, 2, 64, 256, 64, MP_DTYPE_BF16), false, 1 },
	{ "det-m", GEO(4, 4, 1, 512, 512, 8, 2, 64, 256, 64, MP_DTYPE_BF16), true, 0 },
	{ "det-l", GEO(4, 8, 2, 256, 1024, 4, 2, 64, 256, 64, MP_DTYPE_BF16), true, 0 },
};

static const struct mp_coe_gen_arch tiny_archs[] = {
	{ "clf-s", GEO(2, 4, 2, 64, 128, 2, 1, 32, 32, 16, MP_DTYPE_F32), false, 2 },
	{ "clf-l", GEO(3, 4, 2, 128, 64, 2, 1, 64, 32, 16, MP_DTYPE_F32), false, 1 },
	{ "det-m", GEO(2, 4, 1, 64, 128, 2, 1, 32, 32, 16, MP_DTYPE_F32), true, 0 },
	{ "det-l", GEO(4, 4, 2, 128, 64, 2, 1, 64, 32, 16, MP_DTYPE_F32), true, 0 },
};

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("coe-gen", done, total);
}

int cmd_coe_gen(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	struct mp_coe_gen_config cfg = { 0 };
	bool tiny;
	uint64_t t0;
	int err;

	memset(&env, 0, sizeof(env));
	env.preset = "default";
	env.zipf = 1.0;
	env.detector_share = 0.5;
	env.clean = 0.9;
	env.seed = 1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	tiny = !strcmp(env.preset, "tiny");
	if (!tiny && strcmp(env.preset, "default"))
		return cli_error(-EINVAL, "unknown preset '%s' (default, tiny)", env.preset);
	cfg.archs = tiny ? tiny_archs : default_archs;
	cfg.n_archs = 4;
	cfg.components = env.components ? env.components : tiny ? 12 : 352;
	cfg.zipf = env.zipf;
	cfg.detector_share = env.detector_share;
	cfg.clean = env.clean;
	cfg.seed = env.seed;
	t0 = cli_now_ns();
	err = mp_coe_gen(env.out, &cfg, cli_progress_enabled() ? on_progress : NULL, NULL);
	cli_progress_end();
	if (err) {
		cli_fail(err, "%s", env.out);
		return err;
	}
	printf("%s/coe.json: %u components, 4 architectures, in %.1f s\n", env.out,
	       cfg.components, (cli_now_ns() - t0) / 1e9);
	return 0;
}
