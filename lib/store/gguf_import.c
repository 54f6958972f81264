// SPDX-License-Identifier: MIT
/* GGUF to .mpk: llama.cpp's MoE architectures mapped onto the runner's; what does not fit is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/convert.h"
#include "store/gguf.h"
#include "store/import.h"

struct arch {
	const char *name;
	/* llama.cpp ropes adjacent pairs (its RoPE type NORM), not halves (NEOX) */
	bool rope_pairs;
	/* the experts' width is ARCH.expert_feed_forward_length (if present) */
	bool expert_ffn_key;
	/* why no model of the architecture can run here, or NULL */
	const char *refused;
};

static const struct arch archs[] = {
	{ "llama", true, false, NULL },
	{ "qwen3moe", false, true, NULL },
	{ "qwen2moe", false, true,
	  "llama.cpp runs it with the top-k router weights left unnormalised (and a shared "
	  "expert); the runner renormalises them over the top k" },
	{ "olmoe", false, false,
	  "llama.cpp runs it with the top-k router weights left unnormalised and an RMSNorm on "
	  "queries and keys; the runner does neither" },
	{ "deepseek2", true, true,
	  "it uses multi-head latent attention, shared experts and dense leading layers, which "
	  "the runner does not compute" },
};

/* Tensors the runner has no place for, by a part of their name, and why. */
static const struct {
	const char *part;
	const char *why;
} unsupported[] = {
	{ ".bias", "a bias; the runner's projections have none" },
	{ "_shexp", "a shared expert, which the runner does not run" },
	{ "attn_q_norm.", "an RMSNorm of the queries (QK-norm), which the runner does not compute" },
	{ "attn_k_norm.", "an RMSNorm of the keys (QK-norm), which the runner does not compute" },
	{ "attn_q_a", "multi-head latent attention, which the runner does not compute" },
	{ "attn_q_b.", "multi-head latent attention, which the runner does not compute" },
	{ "attn_kv_", "multi-head latent attention, which the runner does not compute" },
	{ "attn_k_b.", "multi-head latent attention, which the runner does not compute" },
	{ "attn_v_b.", "multi-head latent attention, which the runner does not compute" },
	{ "exp_probs_b", "an expert-selection bias, which the runner's router does not add" },
	{ "rope_freqs", "RoPE frequency factors (scaled RoPE), which the runner does not apply" },
	{ "attn_qkv.", "a fused Q/K/V projection (the runner reads them apart)" },
	{ "ffn_gate.", "a dense FFN (or the old one-tensor-per-expert layout); every layer of the "
	  "runner is MoE" },
	{ "ffn_up.", "a dense FFN (or the old one-tensor-per-expert layout); every layer of the "
	  "runner is MoE" },
	{ "ffn_down.", "a dense FFN (or the old one-tensor-per-expert layout); every layer of the "
	  "runner is MoE" },
};

/* What the runner reads of each layer, by GGUF name after "blk.N.". */
static const char *const layer_tensors[] = {
	"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
	"attn_output.weight", "ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
	"ffn_up_exps.weight", "ffn_down_exps.weight",
};

struct gimp {
	struct gguf_file *g;
	const struct arch *arch;
	struct import_src src;
	char key[160];
	uint32_t context;		/* ARCH.context_length */
};

static const char *arch_key(struct gimp *m, const char *suffix)
{
	snprintf(m->key, sizeof(m->key), "%s.%s", m->arch->name, suffix);
	return m->key;
}

/* A required u32 hyperparameter; -EINVAL naming the key when it is absent or not one. */
static int need_u32(struct gimp *m, const char *suffix, uint32_t *out)
{
	int err = gguf_get_u32(m->g, arch_key(m, suffix), out);

	if (err == -ENOENT)
		return mp_err(-EINVAL, "%s: no key '%s' (a %s model needs it)", m->g->path, m->key,
			      m->arch->name);
	return err;
}

/* An optional u32 hyperparameter: *out keeps its default when absent. */
static int opt_u32(struct gimp *m, const char *suffix, uint32_t *out)
{
	int err = gguf_get_u32(m->g, arch_key(m, suffix), out);

	return err == -ENOENT ? 0 : err;
}

static int refuse_key(struct gimp *m, const char *suffix, const char *why)
{
	const struct gguf_kv *kv = gguf_find_kv(m->g, arch_key(m, suffix));

	return mp_err(-EOPNOTSUPP, "%s: key '%s' at offset %llu: %s", m->g->path, m->key,
		      kv ? (unsigned long long)kv->off : 0ull, why);
}

/*
 * The experts must be Mixtral's: no shared ones, no dense layers, weights
 * unscaled. (llama.cpp hard-codes the softmax gating and renormalisation of
 * the architectures imported here, whatever other keys say.)
 */
static int check_moe_keys(struct gimp *m)
{
	uint32_t shared = 0, dense = 0;
	float scale = 1.0f;
	int err;

	if ((err = opt_u32(m, "expert_shared_count", &shared)) ||
	    (err = opt_u32(m, "leading_dense_block_count", &dense)))
		return err;
	err = gguf_get_f32(m->g, arch_key(m, "expert_weights_scale"), &scale);
	if (err && err != -ENOENT)
		return err;
	if (shared)
		return refuse_key(m, "expert_shared_count", "shared experts, which the runner "
				  "does not run");
	if (dense)
		return refuse_key(m, "leading_dense_block_count", "dense leading layers; every "
				  "layer of the runner is MoE");
	if (scale != 0.0f && scale != 1.0f)
		return refuse_key(m, "expert_weights_scale", "scaled expert weights, which the "
				  "runner does not scale");
	return 0;
}

/* RoPE must be plain, over the whole head. */
static int check_rope(struct gimp *m)
{
	struct mp_geometry *g = &m->src.g;
	uint32_t rot = g->head_dim, vlen = g->head_dim;
	const char *scaling = NULL;
	int err;

	if ((err = opt_u32(m, "rope.dimension_count", &rot)) ||
	    (err = opt_u32(m, "attention.value_length", &vlen)))
		return err;
	err = gguf_get_str(m->g, arch_key(m, "rope.scaling.type"), &scaling);
	if (err && err != -ENOENT)
		return err;
	if (scaling && strcmp(scaling, "none"))
		return refuse_key(m, "rope.scaling.type", "scaled RoPE, which the runner does not "
				  "apply");
	if (rot != g->head_dim)
		return refuse_key(m, "rope.dimension_count", "RoPE over part of a head; the runner "
				  "rotates whole heads");
	if (vlen != g->head_dim)
		return refuse_key(m, "attention.value_length", "values of another width than keys");
	return 0;
}

static int read_hparams(struct gimp *m)
{
	struct mp_geometry *g = &m->src.g;
	int err;

	g->rope_theta = 10000.0f;
	if ((err = need_u32(m, "block_count", &g->layers)) ||
	    (err = need_u32(m, "embedding_length", &g->hidden)) ||
	    (err = need_u32(m, "attention.head_count", &g->heads)) ||
	    (err = need_u32(m, "context_length", &m->context)))
		return err;
	if ((err = gguf_get_u32(m->g, arch_key(m, "expert_count"), &g->experts)) == -ENOENT ||
	    (!err && !g->experts))
		return mp_err(-EOPNOTSUPP, "%s: no experts (key '%s' absent or 0): not a mixture of "
			      "experts", m->g->path, m->key);
	if (err || (err = need_u32(m, "expert_used_count", &g->topk)))
		return err;
	g->kv_heads = g->heads;
	g->head_dim = g->heads ? g->hidden / g->heads : 0;
	g->ffn = 0;
	if ((err = opt_u32(m, "attention.head_count_kv", &g->kv_heads)) ||
	    (err = opt_u32(m, "attention.key_length", &g->head_dim)) ||
	    (m->arch->expert_ffn_key && (err = opt_u32(m, "expert_feed_forward_length", &g->ffn))))
		return err;
	if (!g->ffn && (err = need_u32(m, "feed_forward_length", &g->ffn)))
		return err;
	err = gguf_get_f32(m->g, arch_key(m, "attention.layer_norm_rms_epsilon"), &g->norm_eps);
	if (err == -ENOENT)
		return mp_err(-EINVAL, "%s: no key '%s'", m->g->path, m->key);
	if (!err)
		err = gguf_get_f32(m->g, arch_key(m, "rope.freq_base"), &g->rope_theta);
	if (err && err != -ENOENT)
		return err;
	if ((err = check_moe_keys(m)))
		return err;
	return check_rope(m);
}

/* Why a tensor the runner does not read makes the file unimportable. */
static int refuse_tensor(struct gimp *m, const struct gguf_tensor *t)
{
	const char *why = "no tensor of the runner's architecture has this name";

	for (size_t i = 0; i < MP_ARRAY_SIZE(unsupported); i++) {
		if (strstr(t->name, unsupported[i].part)) {
			why = unsupported[i].why;
			break;
		}
	}
	return mp_err(-EOPNOTSUPP, "%s: tensor '%s' (info at offset %llu): %s", m->g->path,
		      t->name, (unsigned long long)t->info_off, why);
}

/* Every tensor of the file is one the runner reads, or the import stops naming it. */
static int check_tensor_names(struct gimp *m)
{
	for (uint64_t i = 0; i < m->g->n_tensors; i++) {
		const struct gguf_tensor *t = &m->g->t[i];
		const char *rest = NULL;
		unsigned layer = 0, pos = 0;
		bool known = false;

		if (!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output_norm.weight") ||
		    !strcmp(t->name, "output.weight"))
			continue;
		if (sscanf(t->name, "blk.%u.%n", &layer, &pos) == 1 && pos)
			rest = t->name + pos;
		for (size_t j = 0; rest && j < MP_ARRAY_SIZE(layer_tensors) && !known; j++)
			known = !strcmp(rest, layer_tensors[j]);
		if (!known)
			return refuse_tensor(m, t);
		if (layer >= m->src.g.layers)
			return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): layer %u, the "
				      "model has %u", m->g->path, t->name,
				      (unsigned long long)t->info_off, layer, m->src.g.layers);
	}
	return 0;
}

/* The tensor called name with this shape (ggml order, row first) in a type the runner reads. */
static const struct gguf_tensor *want(struct gimp *m, const char *name, uint64_t ne0,
				      uint64_t ne1, uint64_t ne2, int *err)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->g, name);
	enum mp_dtype dt;

	if (*err)
		return NULL;
	if (!t) {
		*err = mp_err(-EINVAL, "%s: no tensor '%s'", m->g->path, name);
		return NULL;
	}
	if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
		*err = mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu) is {%llu, %llu, %llu, "
			      "%llu}, the hyperparameters give {%llu, %llu, %llu}", m->g->path, name,
			      (unsigned long long)t->info_off, (unsigned long long)t->ne[0],
			      (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
			      (unsigned long long)t->ne[3], (unsigned long long)ne0,
			      (unsigned long long)ne1, (unsigned long long)ne2);
		return NULL;
	}
	if (ggml_to_dtype(t->type, &dt)) {
		*err = mp_err(-EOPNOTSUPP, "%s: tensor '%s' (info at offset %llu) is %s; moepager "
			      "reads f32, f16, bf16, q8_0 and q4_0", m->g->path, name,
			      (unsigned long long)t->info_off, ggml_type_name(t->type));
		return NULL;
	}
	return t;
}

/* Every tensor the runner reads, present with its shape and a readable type. */
static int check_tensors(struct gimp *m)
{
	const struct mp_geometry *g = &m->src.g;
	const uint64_t q = (uint64_t)g->heads * g->head_dim, kv = (uint64_t)g->kv_heads * g->head_dim;
	char n[GGUF_NAME_MAX];
	int err = 0;

	want(m, "token_embd.weight", g->hidden, g->vocab, 1, &err);
	want(m, "output_norm.weight", g->hidden, 1, 1, &err);
	if (gguf_find_tensor(m->g, "output.weight"))
		want(m, "output.weight", g->hidden, g->vocab, 1, &err);
	for (uint32_t l = 0; l < g->layers && !err; l++) {
#define WANT(suffix, a, b, c) (snprintf(n, sizeof(n), "blk.%u." suffix, l), want(m, n, a, b, c, &err))
		WANT("attn_norm.weight", g->hidden, 1, 1);
		WANT("attn_q.weight", g->hidden, q, 1);
		WANT("attn_k.weight", g->hidden, kv, 1);
		WANT("attn_v.weight", g->hidden, kv, 1);
		WANT("attn_output.weight", q, g->hidden, 1);
		WANT("ffn_norm.weight", g->hidden, 1, 1);
		WANT("ffn_gate_inp.weight", g->hidden, g->experts, 1);
		WANT("ffn_gate_exps.weight", g->hidden, g->ffn, g->experts);
		WANT("ffn_up_exps.weight", g->hidden, g->ffn, g->experts);
		WANT("ffn_down_exps.weight", g->ffn, g->hidden, g->experts);
#undef WANT
	}
	return err;
}

/* n values at byte off of t, converted to type to, into dst. */
static int read_values(struct gimp *m, const struct gguf_tensor *t, uint64_t off, uint64_t n,
		       enum mp_dtype to, void *dst)
{
	uint64_t bytes = ggml_type_bytes(t->type, n);
	enum mp_dtype from;
	void *raw;
	int err;

	if (ggml_to_dtype(t->type, &from))
		return mp_err(-EOPNOTSUPP, "%s: tensor '%s' is %s", m->g->path, t->name,
			      ggml_type_name(t->type));
	if (from == to)
		return gguf_read(m->g, t, off, dst, bytes);
	raw = malloc(bytes ? bytes : 1);
	if (!raw)
		return mp_err(-ENOMEM, "%s: out of memory reading tensor '%s'", m->g->path, t->name);
	err = gguf_read(m->g, t, off, raw, bytes);
	if (!err)
		err = mpk_convert(from, raw, to, dst, n);
	free(raw);
	return err;
}

static int read_tensor(void *ctx, const struct mp_tensor_info *t, void *dst)
{
	struct gimp *m = ctx;
	char name[GGUF_NAME_MAX + 8];
	const struct gguf_tensor *gt;
	uint64_t n = t->dims[0] * (t->ndim > 1 ? t->dims[1] : 1);

	mpk_gguf_name(t->name, name, sizeof(name));
	gt = gguf_find_tensor(m->g, name);
	if (!gt && !strcmp(t->name, "output"))	/* tied to the embedding */
		gt = gguf_find_tensor(m->g, "token_embd.weight");
	return read_values(m, gt, 0, n, t->dtype, dst);
}

static int read_expert(void *ctx, uint32_t layer, uint32_t expert, void *dst)
{
	static const char *const parts[] = { "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps" };
	struct gimp *m = ctx;
	const struct mp_geometry *g = &m->src.g;
	const uint64_t n = (uint64_t)g->hidden * g->ffn;
	char name[GGUF_NAME_MAX];
	int err = 0;

	for (uint32_t p = 0; p < 3 && !err; p++) {
		const struct gguf_tensor *t;

		snprintf(name, sizeof(name), "blk.%u.%s.weight", layer, parts[p]);
		t = gguf_find_tensor(m->g, name);
		/* one expert's slice of a projection is one contiguous range */
		err = read_values(m, t, expert * ggml_type_bytes(t->type, n), n, g->dtype,
				  (char *)dst + mp_dtype_bytes(g->dtype, p * n));
	}
	return err;
}

/* Architecture, hyperparameters, tensors, the .mpk's type: everything checked before writing. */
static int plan(struct gimp *m, const struct mp_import_config *cfg)
{
	struct mp_geometry *g = &m->src.g;
	const struct gguf_tensor *emb, *exps;
	const char *arch = NULL, *name = NULL;
	int err;

	err = gguf_get_str(m->g, "general.architecture", &arch);
	if (err)
		return err == -ENOENT ? mp_err(-EINVAL, "%s: no key 'general.architecture'",
					       m->g->path) : err;
	for (size_t i = 0; i < MP_ARRAY_SIZE(archs) && !m->arch; i++)
		if (!strcmp(arch, archs[i].name))
			m->arch = &archs[i];
	if (!m->arch || m->arch->refused)
		return mp_err(-EOPNOTSUPP, "%s: architecture '%s' %s%s", m->g->path, arch,
			      m->arch ? "cannot be imported: " : "is not one moepager imports (llama, "
			      "qwen3moe; docs/gguf.md)", m->arch ? m->arch->refused : "");
	if ((err = read_hparams(m)) || (err = check_tensor_names(m)))
		return err;
	emb = gguf_find_tensor(m->g, "token_embd.weight");
	g->vocab = emb ? (uint32_t)MP_MIN(emb->ne[1], (uint64_t)UINT32_MAX) : 0;
	g->max_seq = cfg && cfg->max_seq ? cfg->max_seq : MP_MIN(m->context, MP_MAX_SEQ);
	if ((err = check_tensors(m)))
		return err;
	exps = gguf_find_tensor(m->g, "blk.0.ffn_gate_exps.weight");
	if (cfg && cfg->dtype >= 0)
		g->dtype = (enum mp_dtype)cfg->dtype;
	else
		ggml_to_dtype(exps->type, &g->dtype);
	err = mpk_import_geometry(&m->src);
	if (err)
		return err;
	m->src.rope_pairs = m->arch->rope_pairs;
	if (cfg && cfg->name)
		name = cfg->name;
	else if (gguf_get_str(m->g, "general.name", &name))
		name = "";
	snprintf(m->src.name, sizeof(m->src.name), "%s", name);
	return 0;
}

int mp_gguf_import(const char *gguf_path, const char *mpk_path, const struct mp_import_config *cfg)
{
	struct gimp m = { 0 };
	int err;

	err = mpk_import_args("mp_gguf_import", gguf_path, mpk_path, cfg);
	if (!err)
		err = gguf_open(gguf_path, &m.g);
	if (err)
		return err;
	m.src.path = gguf_path;
	m.src.ctx = &m;
	m.src.tensor = read_tensor;
	m.src.expert = read_expert;
	err = plan(&m, cfg);
	if (!err)
		err = mpk_import_write(mpk_path, &m.src, cfg);
	gguf_close(m.g);
	return err;
}
