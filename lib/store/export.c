// SPDX-License-Identifier: MIT
/* .mpk to GGUF: a llama-architecture file llama.cpp loads, with its vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/convert.h"
#include "store/gguf.h"

#define DEFAULT_ALIGNMENT	4096u

/* llama.cpp's token types (SentencePiece's numbering). */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

struct exp {
	struct mp_store *s;
	const struct mp_geometry *g;
	const struct mp_export_config *cfg;
	const char *path;
	struct gguf_writer *w;
	enum mp_dtype edt;		/* experts */
	enum mp_dtype ddt;		/* token embedding, attention, LM head */
	int *tensor_idx;		/* GGUF tensor of each .mpk tensor */
	int (*expert_idx)[3];		/* GGUF tensors of each layer's gate, up, down */
	uint64_t done, total;
};

static void progress(struct exp *x, uint64_t bytes)
{
	x->done += bytes;
	if (x->cfg && x->cfg->progress)
		x->cfg->progress(x->done, x->total, x->cfg->arg);
}

/* The types to write; both must fill the rows (hidden, ffn, heads x head_dim) with blocks. */
static int choose_types(struct exp *x)
{
	const struct mp_export_config *c = x->cfg;
	struct mp_geometry g = *x->g;

	x->edt = c && c->dtype >= 0 ? (enum mp_dtype)c->dtype : x->g->dtype;
	x->ddt = c && c->dense_dtype >= 0 ? (enum mp_dtype)c->dense_dtype :
		 c && c->dtype >= 0 ? x->edt : x->g->dtype;
	for (int i = 0; i < 2; i++) {
		g.dtype = i ? x->ddt : x->edt;
		if ((unsigned)g.dtype >= MP_DTYPE_COUNT)
			return mp_err(-EINVAL, "%s: unknown weight type %d", x->path, (int)g.dtype);
		if (mp_geometry_check(&g))
			return mp_err(-EINVAL, "%s: the model's rows cannot be written as %s: %s",
				      x->path, mp_dtype_name(g.dtype), mp_last_error());
	}
	return 0;
}

static int put_hparams(struct exp *x)
{
	const struct mp_geometry *g = x->g;
	struct gguf_writer *w = x->w;
	const char *name = mp_store_name(x->s);

	gguf_writer_str(w, "general.architecture", "llama");
	gguf_writer_str(w, "general.name", *name ? name : "moepager");
	if (mp_dtype_block(x->edt) > 1 || mp_dtype_block(x->ddt) > 1)
		gguf_writer_u32(w, "general.quantization_version", 2);
	gguf_writer_u32(w, "llama.context_length", g->max_seq);
	gguf_writer_u32(w, "llama.embedding_length", g->hidden);
	gguf_writer_u32(w, "llama.block_count", g->layers);
	gguf_writer_u32(w, "llama.feed_forward_length", g->ffn);
	gguf_writer_u32(w, "llama.attention.head_count", g->heads);
	gguf_writer_u32(w, "llama.attention.head_count_kv", g->kv_heads);
	gguf_writer_u32(w, "llama.attention.key_length", g->head_dim);
	gguf_writer_u32(w, "llama.attention.value_length", g->head_dim);
	gguf_writer_f32(w, "llama.attention.layer_norm_rms_epsilon", g->norm_eps);
	gguf_writer_u32(w, "llama.rope.dimension_count", g->head_dim);
	gguf_writer_f32(w, "llama.rope.freq_base", g->rope_theta);
	gguf_writer_u32(w, "llama.expert_count", g->experts);
	gguf_writer_u32(w, "llama.expert_used_count", g->topk);
	return gguf_writer_u32(w, "llama.vocab_size", g->vocab);
}

/*
 * A model without a tokenizer gets placeholders llama.cpp accepts: <unk>,
 * <s>, </s>, the 256 byte tokens when they fit (llama.cpp looks for <0x0A>),
 * then "t<id>".
 */
static struct mp_gguf_token *placeholder_vocab(uint32_t n, char **text)
{
	struct mp_gguf_token *v = calloc(n, sizeof(*v));
	const bool bytes = n >= 3 + 256;
	char *p = *text = malloc((size_t)n * 16);

	if (!v || !p) {
		free(v);
		free(p);
		*text = NULL;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++) {
		v[i].text = p;
		v[i].type = TOK_NORMAL;
		if (i < 3 && n >= 3) {
			p += sprintf(p, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>") + 1;
			v[i].type = i ? TOK_CONTROL : TOK_UNKNOWN;
		} else if (bytes && i < 3 + 256) {
			p += sprintf(p, "<0x%02X>", i - 3) + 1;
			v[i].type = TOK_BYTE;
		} else {
			p += sprintf(p, "t%u", i) + 1;
		}
	}
	return v;
}

static int put_vocab(struct exp *x)
{
	const struct mp_export_config *c = x->cfg;
	const uint32_t n = x->g->vocab;
	const struct mp_gguf_token *v = c ? c->vocab : NULL;
	struct mp_gguf_token *made = NULL;
	const char **text = calloc(n, sizeof(*text));
	float *score = calloc(n, sizeof(*score));
	int32_t *type = calloc(n, sizeof(*type));
	char *buf = NULL;
	int err;

	if (v && c->vocab_n != n) {
		err = mp_err(-EINVAL, "%s: the vocabulary has %u tokens, the model %u", x->path,
			     c->vocab_n, n);
		goto free_arrays;
	}
	if (!v)
		v = made = placeholder_vocab(n, &buf);
	if (!text || !score || !type || !v) {
		err = mp_err(-ENOMEM, "%s: out of memory for a vocabulary of %u", x->path, n);
		goto free_arrays;
	}
	for (uint32_t i = 0; i < n; i++) {
		text[i] = v[i].text ? v[i].text : "";
		score[i] = v[i].score;
		type[i] = v[i].type;
	}
	gguf_writer_str(x->w, "tokenizer.ggml.model", "llama");
	gguf_writer_strs(x->w, "tokenizer.ggml.tokens", text, n);
	gguf_writer_f32s(x->w, "tokenizer.ggml.scores", score, n);
	gguf_writer_i32s(x->w, "tokenizer.ggml.token_type", type, n);
	if (c && c->vocab) {
		gguf_writer_u32(x->w, "tokenizer.ggml.bos_token_id", c->bos);
		gguf_writer_u32(x->w, "tokenizer.ggml.eos_token_id", c->eos);
		gguf_writer_u32(x->w, "tokenizer.ggml.unknown_token_id", c->unk);
	}
	gguf_writer_bool(x->w, "tokenizer.ggml.add_bos_token", true);
	err = gguf_writer_bool(x->w, "tokenizer.ggml.add_eos_token", false);
free_arrays:
	free(made);
	free(buf);
	free(text);
	free(score);
	free(type);
	return err;
}

/* The GGUF type of an .mpk tensor: norms and routers keep f32, matrices take the dense type. */
static enum mp_dtype out_type(const struct exp *x, const struct mp_tensor_info *t)
{
	return t->ndim == 1 || strstr(t->name, ".router") ? MP_DTYPE_F32 : x->ddt;
}

/* Declares every tensor: the .mpk's in its order, each layer's experts after its router. */
static int declare_tensors(struct exp *x)
{
	const struct mp_geometry *g = x->g;
	static const char *const parts[] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };
	char name[GGUF_NAME_MAX + 8];
	uint32_t layer;

	for (uint32_t i = 0; i < mp_store_tensor_count(x->s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(x->s, i);
		uint64_t ne[2] = { t->ndim > 1 ? t->dims[1] : t->dims[0], t->dims[0] };
		int k;

		mpk_gguf_name(t->name, name, sizeof(name));
		k = gguf_writer_tensor(x->w, name, ggml_from_dtype(out_type(x, t)), t->ndim, ne);
		if (k < 0)
			return k;
		x->tensor_idx[i] = k;
		if (!strstr(t->name, ".router") || sscanf(t->name, "blk.%u.", &layer) != 1)
			continue;
		for (int p = 0; p < 3; p++) {
			uint64_t ex[3] = { p < 2 ? g->hidden : g->ffn, p < 2 ? g->ffn : g->hidden,
					   g->experts };

			snprintf(name, sizeof(name), "blk.%u.%s.weight", layer, parts[p]);
			k = gguf_writer_tensor(x->w, name, ggml_from_dtype(x->edt), 3, ex);
			if (k < 0)
				return k;
			x->expert_idx[layer][p] = k;
		}
	}
	return 0;
}

/* Q and K back to adjacent-pair RoPE, the order llama.cpp's "llama" rotates. */
static int to_pairs(const struct exp *x, const struct mp_tensor_info *t, enum mp_dtype dt,
		    void *buf)
{
	const char *dot = strrchr(t->name, '.');

	if (!dot || (strcmp(dot, ".attn_q") && strcmp(dot, ".attn_k")))
		return 0;
	return mpk_rope_permute(buf, !strcmp(dot, ".attn_q") ? x->g->heads : x->g->kv_heads,
				x->g->head_dim, mp_dtype_bytes(dt, t->dims[1]), true);
}

static int write_tensors(struct exp *x)
{
	uint64_t max_in = 0, max_out = 0;
	void *in, *out;
	int err = 0;

	for (uint32_t i = 0; i < mp_store_tensor_count(x->s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(x->s, i);

		max_in = MP_MAX(max_in, t->bytes);
		max_out = MP_MAX(max_out, mp_dtype_bytes(out_type(x, t),
							 mp_dtype_elems(t->dtype, t->bytes)));
	}
	in = malloc(max_in);
	out = malloc(max_out);
	if (!in || !out) {
		err = mp_err(-ENOMEM, "%s: out of memory for a %llu-byte tensor", x->path,
			     (unsigned long long)max_out);
		goto free_bufs;
	}
	for (uint32_t i = 0; i < mp_store_tensor_count(x->s) && !err; i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(x->s, i);
		const enum mp_dtype dt = out_type(x, t);
		const uint64_t n = mp_dtype_elems(t->dtype, t->bytes);
		const int k = x->tensor_idx[i];

		err = mp_store_read_tensor(x->s, t, in);
		if (!err)
			err = mpk_convert(t->dtype, in, dt, out, n);
		if (!err)
			err = to_pairs(x, t, dt, out);
		if (!err)
			err = gguf_writer_data(x->w, k, 0, out, gguf_writer_tensor_bytes(x->w, k));
		progress(x, t->bytes);
	}
free_bufs:
	free(in);
	free(out);
	return err;
}

/* Each expert read once (checksum checked) and written as slice e of its layer's three tensors. */
static int write_experts(struct exp *x)
{
	const struct mp_geometry *g = x->g;
	const uint64_t n = (uint64_t)g->hidden * g->ffn;
	const uint64_t in_part = mp_dtype_bytes(g->dtype, n), out_part = mp_dtype_bytes(x->edt, n);
	void *in = malloc(3 * in_part), *out = malloc(out_part);
	int err = 0;

	if (!in || !out) {
		err = mp_err(-ENOMEM, "%s: out of memory for an expert", x->path);
		goto free_bufs;
	}
	for (uint32_t l = 0; l < g->layers && !err; l++) {
		for (uint32_t e = 0; e < g->experts && !err; e++) {
			err = mp_store_read_expert(x->s, l, e, in);
			for (int p = 0; p < 3 && !err; p++) {
				err = mpk_convert(g->dtype, (char *)in + p * in_part, x->edt, out, n);
				if (!err)
					err = gguf_writer_data(x->w, x->expert_idx[l][p],
							       e * out_part, out, out_part);
			}
			progress(x, 3 * in_part);
		}
	}
free_bufs:
	free(in);
	free(out);
	return err;
}

static int export(struct exp *x)
{
	uint32_t align = x->cfg && x->cfg->alignment ? x->cfg->alignment : DEFAULT_ALIGNMENT;
	int err;

	if ((err = choose_types(x)))
		return err;
	x->tensor_idx = calloc(mp_store_tensor_count(x->s), sizeof(*x->tensor_idx));
	x->expert_idx = calloc(x->g->layers, sizeof(*x->expert_idx));
	if (!x->tensor_idx || !x->expert_idx)
		return mp_err(-ENOMEM, "%s: out of memory", x->path);
	x->total = mp_store_total_expert_bytes(x->s);
	for (uint32_t i = 0; i < mp_store_tensor_count(x->s); i++)
		x->total += mp_store_tensor_at(x->s, i)->bytes;
	err = gguf_writer_create(x->path, align, &x->w);
	if (err)
		return err;
	if ((err = put_hparams(x)) || (err = put_vocab(x)) || (err = declare_tensors(x)) ||
	    (err = gguf_writer_begin_data(x->w)) || (err = write_tensors(x)) ||
	    (err = write_experts(x))) {
		gguf_writer_abort(x->w);
		return err;
	}
	return gguf_writer_finish(x->w);
}

int mp_gguf_export(struct mp_store *s, const char *gguf_path, const struct mp_export_config *cfg)
{
	struct exp x = { .s = s, .cfg = cfg, .path = gguf_path };
	int err;

	if (!s || !gguf_path)
		return mp_err(-EINVAL, "mp_gguf_export: NULL %s", s ? "path" : "store");
	if (cfg && (err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
					    "export config")))
		return err;
	x.g = mp_store_geometry(s);
	err = export(&x);
	free(x.tensor_idx);
	free(x.expert_idx);
	return err;
}
