// SPDX-License-Identifier: MIT
/* Hugging Face safetensors to .mpk: Mixtral and Qwen-MoE names mapped, what does not fit refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/convert.h"
#include "store/import.h"
#include "store/safetensors.h"

/* A config.json model_type and where its MoE layers keep their pieces. */
struct hf_arch {
	const char *model_type;
	const char *moe;		/* the MoE block under model.layers.N */
	const char *proj[3];		/* an expert's gate, up, down */
	const char *experts_key;
	const char *ffn_key;
};

static const struct hf_arch archs[] = {
	{ "mixtral", "block_sparse_moe", { "w1", "w3", "w2" }, "num_local_experts",
	  "intermediate_size" },
	{ "qwen3_moe", "mlp", { "gate_proj", "up_proj", "down_proj" }, "num_experts",
	  "moe_intermediate_size" },
	{ "qwen2_moe", "mlp", { "gate_proj", "up_proj", "down_proj" }, "num_experts",
	  "moe_intermediate_size" },
};

/* Tensors the runner has no place for, by a part of their name, and why. */
static const struct {
	const char *part;
	const char *why;
} unsupported[] = {
	{ ".bias", "a bias; the runner's projections have none" },
	{ "shared_expert", "a shared expert, which the runner does not run" },
	{ "q_norm.", "an RMSNorm of the queries (QK-norm), which the runner does not compute" },
	{ "k_norm.", "an RMSNorm of the keys (QK-norm), which the runner does not compute" },
	{ ".mlp.gate_proj.", "a dense FFN; every layer of the runner is MoE" },
};

struct simp {
	struct st_dir *d;
	const struct hf_arch *arch;
	struct import_src src;
	char name[160];
};

static int cfg_u32(struct simp *m, const char *key, bool need, uint32_t *out)
{
	json_t *v = json_object_get(m->d->config, key);

	if (!v && !need)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
		return mp_err(-EINVAL, "%s/config.json: '%s' is %s, not a count", m->d->path, key,
			      v ? "there" : "missing");
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

static int cfg_f32(struct simp *m, const char *key, float *out)
{
	json_t *v = json_object_get(m->d->config, key);

	if (!v)
		return 0;
	if (!json_is_number(v))
		return mp_err(-EINVAL, "%s/config.json: '%s' is not a number", m->d->path, key);
	*out = (float)json_number_value(v);
	return 0;
}

static int refuse(struct simp *m, const char *key, const char *why)
{
	return mp_err(-EOPNOTSUPP, "%s/config.json: '%s': %s", m->d->path, key, why);
}

/* What the runner cannot honour, said by the config. */
static int check_config(struct simp *m)
{
	json_t *c = m->d->config, *v;
	const char *act = json_string_value(json_object_get(c, "hidden_act"));
	uint32_t shared = 0, step = 1;
	int err;

	if ((err = cfg_u32(m, "shared_expert_intermediate_size", false, &shared)) ||
	    (err = cfg_u32(m, "decoder_sparse_step", false, &step)))
		return err;
	if (act && strcmp(act, "silu"))
		return refuse(m, "hidden_act", "experts that are not SwiGLU (silu)");
	if ((v = json_object_get(c, "rope_scaling")) && !json_is_null(v))
		return refuse(m, "rope_scaling", "scaled RoPE, which the runner does not apply");
	if (shared)
		return refuse(m, "shared_expert_intermediate_size", "a shared expert, which the "
			      "runner does not run");
	if (step != 1 || json_array_size(json_object_get(c, "mlp_only_layers")))
		return refuse(m, step != 1 ? "decoder_sparse_step" : "mlp_only_layers",
			      "dense layers; every layer of the runner is MoE");
	if (strcmp(m->arch->moe, "mlp") == 0 && !json_is_true(json_object_get(c, "norm_topk_prob")))
		return refuse(m, "norm_topk_prob", "top-k router weights left unnormalised; the "
			      "runner renormalises them");
	v = json_object_get(c, "sliding_window");
	if (json_is_integer(v) && !json_is_false(json_object_get(c, "use_sliding_window")))
		return refuse(m, "sliding_window", "sliding-window attention; the runner attends to "
			      "every position");
	return 0;
}

static int read_config(struct simp *m)
{
	struct mp_geometry *g = &m->src.g;
	const char *type = json_string_value(json_object_get(m->d->config, "model_type"));
	int err;

	for (size_t i = 0; type && i < MP_ARRAY_SIZE(archs) && !m->arch; i++)
		if (!strcmp(type, archs[i].model_type))
			m->arch = &archs[i];
	if (!m->arch)
		return mp_err(-EOPNOTSUPP, "%s/config.json: model_type '%s' is not one moepager "
			      "imports (mixtral, qwen3_moe; docs/gguf.md)", m->d->path,
			      type ? type : "(none)");
	g->rope_theta = 10000.0f;
	g->norm_eps = 1e-6f;
	if ((err = cfg_u32(m, "num_hidden_layers", true, &g->layers)) ||
	    (err = cfg_u32(m, "hidden_size", true, &g->hidden)) ||
	    (err = cfg_u32(m, "num_attention_heads", true, &g->heads)) ||
	    (err = cfg_u32(m, m->arch->experts_key, true, &g->experts)) ||
	    (err = cfg_u32(m, "num_experts_per_tok", true, &g->topk)) ||
	    (err = cfg_u32(m, m->arch->ffn_key, true, &g->ffn)) ||
	    (err = cfg_u32(m, "max_position_embeddings", true, &g->max_seq)))
		return err;
	g->kv_heads = g->heads;
	g->head_dim = g->heads ? g->hidden / g->heads : 0;
	if ((err = cfg_u32(m, "num_key_value_heads", false, &g->kv_heads)) ||
	    (err = cfg_u32(m, "head_dim", false, &g->head_dim)) ||
	    (err = cfg_f32(m, "rms_norm_eps", &g->norm_eps)) ||
	    (err = cfg_f32(m, "rope_theta", &g->rope_theta)))
		return err;
	return check_config(m);
}

/* True when rest (after "model.layers.N.") is a tensor the runner reads. */
static bool layer_tensor(const struct simp *m, const char *rest)
{
	static const char *const fixed[] = {
		"input_layernorm.weight", "post_attention_layernorm.weight",
		"self_attn.q_proj.weight", "self_attn.k_proj.weight",
		"self_attn.v_proj.weight", "self_attn.o_proj.weight",
	};
	size_t moe = strlen(m->arch->moe);
	unsigned e, pos = 0;

	for (size_t i = 0; i < MP_ARRAY_SIZE(fixed); i++)
		if (!strcmp(rest, fixed[i]))
			return true;
	if (strncmp(rest, m->arch->moe, moe) || rest[moe] != '.')
		return false;
	rest += moe + 1;
	if (!strcmp(rest, "gate.weight"))
		return true;
	if (sscanf(rest, "experts.%u.%n", &e, &pos) != 1 || !pos || e >= m->src.g.experts)
		return false;
	for (int p = 0; p < 3; p++) {
		size_t n = strlen(m->arch->proj[p]);

		if (!strncmp(rest + pos, m->arch->proj[p], n) && !strcmp(rest + pos + n, ".weight"))
			return true;
	}
	return false;
}

/* Every tensor is one the runner reads (RoPE's inv_freq buffers aside), or the import stops. */
static int check_names(struct simp *m)
{
	for (uint64_t i = 0; i < m->d->n; i++) {
		const struct st_tensor *t = &m->d->t[i];
		const char *why = "no tensor of the runner's architecture has this name";
		unsigned layer = 0, pos = 0;

		if (!strcmp(t->name, "model.embed_tokens.weight") ||
		    !strcmp(t->name, "model.norm.weight") || !strcmp(t->name, "lm_head.weight") ||
		    strstr(t->name, "rotary_emb.inv_freq"))
			continue;
		if (sscanf(t->name, "model.layers.%u.%n", &layer, &pos) == 1 && pos &&
		    layer < m->src.g.layers && layer_tensor(m, t->name + pos))
			continue;
		for (size_t j = 0; j < MP_ARRAY_SIZE(unsupported); j++) {
			if (strstr(t->name, unsupported[j].part)) {
				why = unsupported[j].why;
				break;
			}
		}
		return mp_err(-EOPNOTSUPP, "%s: tensor '%s': %s", m->d->files[t->file].path,
			      t->name, why);
	}
	return 0;
}

/* The safetensors tensor called name, of shape [rows, cols] (cols 0: [rows]), readable. */
static const struct st_tensor *want(struct simp *m, const char *name, uint64_t rows,
				    uint64_t cols, int *err)
{
	const struct st_tensor *t = st_find(m->d, name);

	if (*err)
		return NULL;
	if (!t) {
		*err = mp_err(-EINVAL, "%s: no tensor '%s'", m->d->path, name);
		return NULL;
	}
	if (t->n_dims != (cols ? 2u : 1u) || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
		*err = mp_err(-EINVAL, "%s: tensor '%s' is [%llu, %llu] (%u dims), the config gives "
			      "[%llu, %llu]", m->d->files[t->file].path, name,
			      (unsigned long long)t->shape[0],
			      (unsigned long long)(t->n_dims > 1 ? t->shape[1] : 0), t->n_dims,
			      (unsigned long long)rows, (unsigned long long)cols);
		return NULL;
	}
	if (!t->readable) {
		*err = mp_err(-EOPNOTSUPP, "%s: tensor '%s' is %s; moepager reads F32, F16 and BF16",
			      m->d->files[t->file].path, name, t->dtype);
		return NULL;
	}
	return t;
}

/* The .mpk tensor's safetensors name. */
static void hf_name(const struct simp *m, const char *mpk, char *out, size_t len)
{
	static const char *const map[][2] = {
		{ "attn_norm", "input_layernorm" }, { "attn_q", "self_attn.q_proj" },
		{ "attn_k", "self_attn.k_proj" }, { "attn_v", "self_attn.v_proj" },
		{ "attn_o", "self_attn.o_proj" }, { "ffn_norm", "post_attention_layernorm" },
		{ "router", NULL },
	};
	unsigned layer;
	int pos = 0;

	if (!strcmp(mpk, "tok_embd") || !strcmp(mpk, "output_norm") || !strcmp(mpk, "output")) {
		snprintf(out, len, "%s", !strcmp(mpk, "tok_embd") ? "model.embed_tokens.weight" :
			 !strcmp(mpk, "output") ? "lm_head.weight" : "model.norm.weight");
		return;
	}
	sscanf(mpk, "blk.%u.%n", &layer, &pos);
	for (size_t i = 0; i < MP_ARRAY_SIZE(map); i++)
		if (!strcmp(mpk + pos, map[i][0]))
			snprintf(out, len, "model.layers.%u.%s%s.weight", layer,
				 map[i][1] ? map[i][1] : m->arch->moe, map[i][1] ? "" : ".gate");
}

static int read_values(struct simp *m, const struct st_tensor *t, enum mp_dtype to, void *dst)
{
	uint64_t n = mp_dtype_elems(t->type, t->bytes);
	void *raw;
	int err;

	if (t->type == to)
		return st_read(m->d, t, 0, dst, t->bytes);
	raw = malloc(t->bytes ? t->bytes : 1);
	if (!raw)
		return mp_err(-ENOMEM, "%s: out of memory reading '%s'", m->d->path, t->name);
	err = st_read(m->d, t, 0, raw, t->bytes);
	if (!err)
		err = mpk_convert(t->type, raw, to, dst, n);
	free(raw);
	return err;
}

static int read_tensor(void *ctx, const struct mp_tensor_info *t, void *dst)
{
	struct simp *m = ctx;
	const struct st_tensor *st;
	char name[MP_TENSOR_NAME_MAX + 64];
	int err = 0;

	hf_name(m, t->name, name, sizeof(name));
	st = st_find(m->d, name);
	if (!st && !strcmp(t->name, "output"))	/* tied to the embedding */
		snprintf(name, sizeof(name), "model.embed_tokens.weight");
	st = want(m, name, t->dims[0], t->ndim > 1 ? t->dims[1] : 0, &err);
	return err ? err : read_values(m, st, t->dtype, dst);
}

static int read_expert(void *ctx, uint32_t layer, uint32_t expert, void *dst)
{
	struct simp *m = ctx;
	const struct mp_geometry *g = &m->src.g;
	char name[160];
	int err = 0;

	for (int p = 0; p < 3 && !err; p++) {
		const struct st_tensor *t;

		snprintf(name, sizeof(name), "model.layers.%u.%s.experts.%u.%s.weight", layer,
			 m->arch->moe, expert, m->arch->proj[p]);
		t = want(m, name, p < 2 ? g->ffn : g->hidden, p < 2 ? g->hidden : g->ffn, &err);
		if (!err)
			err = read_values(m, t, g->dtype, (char *)dst +
					  mp_dtype_bytes(g->dtype, (uint64_t)p * g->ffn * g->hidden));
	}
	return err;
}

/* The directory's last component ("Mixtral-8x7B-v0.1" of "models/Mixtral-8x7B-v0.1/"). */
static void dir_name(const char *path, char *out, size_t len)
{
	size_t end = strlen(path), start;

	while (end > 1 && path[end - 1] == '/')
		end--;
	start = end;
	while (start > 0 && path[start - 1] != '/')
		start--;
	snprintf(out, len, "%.*s", (int)(end - start), path + start);
}

/* Every tensor the runner reads, present with its shape and a readable type, before writing. */
static int check_tensors(struct simp *m)
{
	const struct mp_geometry *g = &m->src.g;
	const uint64_t q = (uint64_t)g->heads * g->head_dim, kv = (uint64_t)g->kv_heads * g->head_dim;
	static const char *const dense[] = { "attn_norm", "attn_q", "attn_k", "attn_v", "attn_o",
					     "ffn_norm", "router" };
	const uint64_t rows[] = { g->hidden, q, kv, kv, g->hidden, g->hidden, g->experts };
	const uint64_t cols[] = { 0, g->hidden, g->hidden, g->hidden, q, 0, g->hidden };
	char mpk[MP_TENSOR_NAME_MAX], name[160];
	int err = 0;

	want(m, "model.embed_tokens.weight", g->vocab, g->hidden, &err);
	want(m, "model.norm.weight", g->hidden, 0, &err);
	if (st_find(m->d, "lm_head.weight"))
		want(m, "lm_head.weight", g->vocab, g->hidden, &err);
	for (uint32_t l = 0; l < g->layers && !err; l++) {
		for (size_t i = 0; i < MP_ARRAY_SIZE(dense); i++) {
			snprintf(mpk, sizeof(mpk), "blk.%u.%s", l, dense[i]);
			hf_name(m, mpk, name, sizeof(name));
			want(m, name, rows[i], cols[i], &err);
		}
		for (uint32_t e = 0; e < g->experts; e++) {
			for (int p = 0; p < 3; p++) {
				snprintf(name, sizeof(name), "model.layers.%u.%s.experts.%u.%s.weight",
					 l, m->arch->moe, e, m->arch->proj[p]);
				want(m, name, p < 2 ? g->ffn : g->hidden, p < 2 ? g->hidden : g->ffn,
				     &err);
			}
		}
	}
	return err;
}

static int plan(struct simp *m, const struct mp_import_config *cfg)
{
	struct mp_geometry *g = &m->src.g;
	const struct st_tensor *emb, *gate;
	int err = read_config(m);

	if (err || (err = check_names(m)))
		return err;
	emb = st_find(m->d, "model.embed_tokens.weight");
	g->vocab = emb && emb->n_dims == 2 ? (uint32_t)MP_MIN(emb->shape[0], UINT32_MAX) : 0;
	if (cfg && cfg->max_seq)
		g->max_seq = cfg->max_seq;
	g->max_seq = MP_MIN(g->max_seq, MP_MAX_SEQ);
	snprintf(m->name, sizeof(m->name), "model.layers.0.%s.experts.0.%s.weight", m->arch->moe,
		 m->arch->proj[0]);
	gate = want(m, m->name, g->ffn, g->hidden, &err);
	if (err)
		return err;
	g->dtype = cfg && cfg->dtype >= 0 ? (enum mp_dtype)cfg->dtype : gate->type;
	err = mpk_import_geometry(&m->src);
	if (!err)
		err = check_tensors(m);
	if (err)
		return err;
	/* Hugging Face ropes halves, as the runner does: no row moves */
	m->src.rope_pairs = false;
	if (cfg && cfg->name)
		snprintf(m->src.name, sizeof(m->src.name), "%s", cfg->name);
	else
		dir_name(m->d->path, m->src.name, sizeof(m->src.name));
	return 0;
}

int mp_safetensors_import(const char *dir, const char *mpk_path,
			  const struct mp_import_config *cfg)
{
	struct simp m = { 0 };
	int err;

	err = mpk_import_args("mp_safetensors_import", dir, mpk_path, cfg);
	if (!err)
		err = st_open(dir, &m.d);
	if (err)
		return err;
	m.src.path = dir;
	m.src.ctx = &m;
	m.src.tensor = read_tensor;
	m.src.expert = read_expert;
	err = plan(&m, cfg);
	if (!err)
		err = mpk_import_write(mpk_path, &m.src, cfg);
	st_close(m.d);
	return err;
}
