// SPDX-License-Identifier: MIT
/* moepager import: converts a GGUF model file, or a directory of safetensors, into an .mpk. */
#include <argp.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <moepager.h>

#include "cli.h"

static struct import_env {
	const char *src;
	const char *out;
	const char *name;
	int dtype;
	uint32_t max_seq;
	bool quiet;
} env;

enum { OPT_DTYPE = 0x100, OPT_MAX_SEQ, OPT_NAME };

static const char doc[] =
	"Convert a GGUF file (llama.cpp), or a directory of Hugging Face safetensors\n"
	"(config.json and *.safetensors), into an .mpk. GGUF architectures: llama\n"
	"(Mixtral-style MoE; Q and K rows are permuted from adjacent-pair to rotate-half\n"
	"RoPE) and qwen3moe where its tensors fit the runner; safetensors model types:\n"
	"mixtral, and qwen3_moe where it fits. Models the runner cannot compute (shared\n"
	"experts, latent attention, Q/K norms, biases, dense layers) are refused naming\n"
	"the tensor or key, never dropped. The experts keep their type unless --dtype\n"
	"converts them; every other weight matrix takes the experts' type.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager import mixtral-8x7b-q8_0.gguf --out mixtral.mpk\n"
	"  moepager import Mixtral-8x7B-v0.1/ --out mixtral.mpk --dtype q8_0\n"
	"  moepager import tiny-real.gguf --out /tmp/tiny-real-q8.mpk --dtype q8_0\n";

static const struct argp_option opts[] = {
	{ "out", 'o', "FILE", 0, "The .mpk to write (required)", 0 },
	{ "dtype", OPT_DTYPE, "TYPE", 0, "Weight type of the .mpk: f32, f16, bf16, q8_0, q4_0 "
	  "(default: the experts')", 0 },
	{ "max-seq", OPT_MAX_SEQ, "N", 0, "Longest sequence (default: the file's context "
	  "length)", 0 },
	{ "name", OPT_NAME, "NAME", 0, "Model name (default: the file's general.name)", 0 },
	{ "quiet", 'q', NULL, 0, "No summary line", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	enum mp_dtype t;

	switch (key) {
	case 'o':
		env.out = arg;
		break;
	case OPT_DTYPE:
		cli_opt_dtype(state, arg, &t);
		env.dtype = (int)t;
		break;
	case OPT_MAX_SEQ:
		cli_opt_u32(state, "--max-seq", arg, 1, MP_MAX_SEQ, &env.max_seq);
		break;
	case OPT_NAME:
		env.name = arg;
		break;
	case 'q':
		env.quiet = true;
		break;
	case ARGP_KEY_END:
		if (!env.out)
			argp_error(state, "--out FILE is required");
		/* fall through */
	default:
		return cli_parse_one_path(key, arg, state, &env.src);
	}
	return 0;
}

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("import", done, total);
}

static void summary(uint64_t ns)
{
	struct mp_store *s;
	const struct mp_geometry *g;

	if (mp_store_open(env.out, &s))
		return;
	g = mp_store_geometry(s);
	printf("%s: %u layers x %u experts (top-%u), hidden %u, ffn %u, %s, %.2f GB of experts "
	       "in %.2f s\n", env.out, g->layers, g->experts, g->topk, g->hidden, g->ffn,
	       mp_dtype_name(g->dtype), mp_store_total_expert_bytes(s) / 1e9, ns / 1e9);
	mp_store_close(s);
}

int cmd_import(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "FILE.gguf|DIR", doc, NULL, NULL,
					  NULL };
	struct mp_import_config cfg = { 0 };
	struct stat st;
	uint64_t t0;
	int err;

	memset(&env, 0, sizeof(env));
	env.dtype = -1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	cfg.dtype = env.dtype;
	cfg.max_seq = env.max_seq;
	cfg.name = env.name;
	cfg.progress = cli_progress_enabled() ? on_progress : NULL;
	t0 = cli_now_ns();
	if (!stat(env.src, &st) && S_ISDIR(st.st_mode))
		err = mp_safetensors_import(env.src, env.out, &cfg);
	else
		err = mp_gguf_import(env.src, env.out, &cfg);
	cli_progress_end();
	if (err)
		return cli_fail(err, "%s", env.src);
	if (!env.quiet)
		summary(cli_now_ns() - t0);
	return 0;
}
