// SPDX-License-Identifier: MIT
/* moepager export: writes an .mpk model as a GGUF file llama.cpp loads, with its tokenizer. */
#include <argp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager.h>

#include "cli.h"
#include "text.h"

static struct export_env {
	const char *model;
	const char *out;
	const char *tokenizer;
	int dtype;
	int dense_dtype;
	uint32_t alignment;
	bool quiet;
} env;

enum { OPT_GGUF = 0x100, OPT_DTYPE, OPT_DENSE_DTYPE, OPT_ALIGNMENT, OPT_TOKENIZER };

static const char doc[] =
	"Write MODEL.mpk as a GGUF file llama.cpp loads: architecture llama, experts as\n"
	"blk.N.ffn_{gate,up,down}_exps, Q and K rows permuted back to adjacent-pair RoPE,\n"
	"norms and routers f32. The vocabulary comes from the tokenizer beside the model\n"
	"(MODEL.tok, or --tokenizer), as a SentencePiece \"llama\" vocabulary; a model\n"
	"without one gets placeholder tokens. --dtype sets the type of the experts and,\n"
	"unless --dense-dtype says otherwise, of the embedding, attention and LM head.\n"
	"--alignment 4096 (the default) starts every tensor on a page, so an expert's\n"
	"slice is page-aligned when its size is a multiple of 4096 (docs/gguf.md).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager export build/data/models/tiny-real.mpk --gguf tiny-real.gguf\n"
	"  moepager export model.mpk --gguf model-q8.gguf --dtype q8_0 --alignment 32\n";

static const struct argp_option opts[] = {
	{ "gguf", OPT_GGUF, "FILE", 0, "The GGUF file to write (required)", 0 },
	{ "dtype", OPT_DTYPE, "TYPE", 0, "Experts (and dense matrices): f32, f16, bf16, q8_0, "
	  "q4_0 (default: the model's)", 0 },
	{ "dense-dtype", OPT_DENSE_DTYPE, "TYPE", 0, "Embedding, attention and LM head only", 0 },
	{ "alignment", OPT_ALIGNMENT, "N", 0, "general.alignment: 32 or a larger power of two "
	  "(default 4096)", 0 },
	{ "tokenizer", OPT_TOKENIZER, "FILE", 0, "Tokenizer vocabulary (default MODEL.tok if "
	  "it exists)", 0 },
	{ "quiet", 'q', NULL, 0, "No summary line", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	enum mp_dtype t;

	switch (key) {
	case OPT_GGUF:
		env.out = arg;
		break;
	case OPT_DTYPE:
	case OPT_DENSE_DTYPE:
		cli_opt_dtype(state, arg, &t);
		*(key == OPT_DTYPE ? &env.dtype : &env.dense_dtype) = (int)t;
		break;
	case OPT_ALIGNMENT:
		cli_opt_u32(state, "--alignment", arg, 32, 1u << 30, &env.alignment);
		if (env.alignment & (env.alignment - 1))
			argp_error(state, "--alignment: '%s' is not a power of two >= 32", arg);
		break;
	case OPT_TOKENIZER:
		env.tokenizer = arg;
		break;
	case 'q':
		env.quiet = true;
		break;
	case ARGP_KEY_END:
		if (!env.out)
			argp_error(state, "--gguf FILE is required");
		/* fall through */
	default:
		return cli_parse_one_path(key, arg, state, &env.model);
	}
	return 0;
}

/*
 * The tokenizer's pieces as GGUF tokens (NUL-terminated copies in *text).
 * Returns 0, 1 when there is no tokenizer to use (placeholders), or -errno.
 */
static int load_vocab(const struct mp_geometry *g, struct mp_export_config *cfg, char **text)
{
	char *guess = env.tokenizer ? NULL : text_tokenizer_beside(env.model);
	const char *path = env.tokenizer ? env.tokenizer : guess;
	struct mp_gguf_token *v = NULL;
	struct mp_tokenizer *tok = NULL;
	size_t used = 0, bytes = 0;
	int err;

	if (!path || (guess && access(guess, R_OK))) {
		free(guess);
		return 1;
	}
	err = mp_tokenizer_open(path, &tok);
	if (!err && mp_tokenizer_vocab(tok) != g->vocab)
		err = cli_error(-EINVAL, "tokenizer %s has %u pieces, the model %u", path,
				mp_tokenizer_vocab(tok), g->vocab);
	for (uint32_t i = 0; !err && i < g->vocab; i++) {
		struct mp_piece p;

		mp_tokenizer_piece(tok, i, &p);
		bytes += p.len + 1;
	}
	v = err ? NULL : calloc(g->vocab, sizeof(*v));
	*text = err ? NULL : malloc(bytes);
	if (!err && (!v || !*text))
		err = -ENOMEM;
	for (uint32_t i = 0; !err && i < g->vocab; i++) {
		struct mp_piece p;

		mp_tokenizer_piece(tok, i, &p);
		if (memchr(p.text, 0, p.len)) {
			err = cli_error(-EINVAL, "piece %u of %s holds a NUL byte", i, path);
			break;
		}
		memcpy(*text + used, p.text, p.len);
		(*text)[used + p.len] = '\0';
		v[i] = (struct mp_gguf_token){ *text + used, p.score, (int32_t)p.type };
		used += p.len + 1;
		if (p.type == MP_PIECE_UNKNOWN)
			cfg->unk = i;
	}
	if (!err) {
		cfg->vocab = v;
		cfg->vocab_n = g->vocab;
		cfg->bos = mp_tokenizer_bos(tok);
		cfg->eos = mp_tokenizer_eos(tok);
	} else {
		free(v);
		free(*text);
		*text = NULL;
	}
	mp_tokenizer_close(tok);
	free(guess);
	return err;
}

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("export", done, total);
}

static void summary(const struct mp_store *s, const struct mp_export_config *cfg, uint64_t ns)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	enum mp_dtype e = cfg->dtype >= 0 ? (enum mp_dtype)cfg->dtype : g->dtype;
	uint64_t slice = mp_dtype_bytes(e, (uint64_t)g->hidden * g->ffn);
	struct stat st = { 0 };

	stat(env.out, &st);
	printf("%s: llama GGUF, %u layers x %u experts, experts %s, alignment %u, %s "
	       "vocabulary, %.2f MB in %.2f s; expert slices of %llu bytes are %spage-aligned\n",
	       env.out, g->layers, g->experts, mp_dtype_name(e), cfg->alignment,
	       cfg->vocab ? "SentencePiece" : "placeholder", st.st_size / 1e6, ns / 1e9,
	       (unsigned long long)slice, slice % 4096 || cfg->alignment < 4096 ? "not " : "");
}

int cmd_export(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "MODEL", doc, NULL, NULL, NULL };
	struct mp_export_config cfg = { 0 };
	struct mp_store *s = NULL;
	char *text = NULL;
	uint64_t t0;
	int err;

	memset(&env, 0, sizeof(env));
	env.dtype = env.dense_dtype = -1;
	env.alignment = 4096;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.model, &s);
	if (err)
		return cli_fail(err, "%s", env.model);
	cfg.dtype = env.dtype;
	cfg.dense_dtype = env.dense_dtype;
	cfg.alignment = env.alignment;
	cfg.progress = cli_progress_enabled() ? on_progress : NULL;
	err = load_vocab(mp_store_geometry(s), &cfg, &text);
	if (err < 0)
		goto close_store;
	t0 = cli_now_ns();
	err = mp_gguf_export(s, env.out, &cfg);
	cli_progress_end();
	if (err)
		cli_fail(err, "%s", env.out);
	else if (!env.quiet)
		summary(s, &cfg, cli_now_ns() - t0);
close_store:
	free((void *)cfg.vocab);
	free(text);
	mp_store_close(s);
	return err;
}
