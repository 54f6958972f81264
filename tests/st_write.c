// SPDX-License-Identifier: MIT
/* Writes an .mpk model as a Hugging Face directory (config.json, safetensors shards), for tests. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <moepager.h>

#include "st_write.h"

struct piece {
	char name[128];
	const char *dtype;
	uint64_t rows, cols;		/* cols 0: 1-D */
	void *data;
	uint64_t bytes;
};

static const char *st_dtype(enum mp_dtype t)
{
	return t == MP_DTYPE_F32 ? "F32" : t == MP_DTYPE_F16 ? "F16" : "BF16";
}

static int add(struct piece **v, size_t *n, const char *name, const char *dtype, uint64_t rows,
	       uint64_t cols, const void *data, uint64_t bytes)
{
	struct piece *p = realloc(*v, (*n + 1) * sizeof(**v));

	if (!p)
		return -ENOMEM;
	*v = p;
	p += (*n)++;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->dtype = dtype;
	p->rows = rows;
	p->cols = cols;
	p->bytes = bytes;
	p->data = calloc(1, bytes ? bytes : 1);
	if (!p->data)
		return -ENOMEM;
	if (data)
		memcpy(p->data, data, bytes);
	return 0;
}

/* The Hugging Face name of an .mpk tensor. */
static void hf_name(const char *mpk, const char *moe, char *out, size_t len)
{
	static const char *const map[][2] = {
		{ "attn_norm", "input_layernorm" }, { "attn_q", "self_attn.q_proj" },
		{ "attn_k", "self_attn.k_proj" }, { "attn_v", "self_attn.v_proj" },
		{ "attn_o", "self_attn.o_proj" }, { "ffn_norm", "post_attention_layernorm" },
	};
	unsigned layer;
	int pos = 0;

	if (!strcmp(mpk, "tok_embd") || !strcmp(mpk, "output") || !strcmp(mpk, "output_norm")) {
		snprintf(out, len, "%s", !strcmp(mpk, "tok_embd") ? "model.embed_tokens.weight" :
			 !strcmp(mpk, "output") ? "lm_head.weight" : "model.norm.weight");
		return;
	}
	sscanf(mpk, "blk.%u.%n", &layer, &pos);
	snprintf(out, len, "model.layers.%u.%s.gate.weight", layer, moe);
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(mpk + pos, map[i][0]))
			snprintf(out, len, "model.layers.%u.%s.weight", layer, map[i][1]);
}

static int collect(struct mp_store *s, const struct st_write_opts *o, bool mixtral,
		   struct piece **v, size_t *n)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	const char *moe = mixtral ? "block_sparse_moe" : "mlp";
	static const char *const mix[] = { "w1", "w3", "w2" };
	static const char *const qwen[] = { "gate_proj", "up_proj", "down_proj" };
	uint64_t part = mp_dtype_bytes(g->dtype, (uint64_t)g->hidden * g->ffn);
	char name[128];
	void *buf = malloc(mp_store_expert_bytes(s) * 4 + 4096);
	int err = buf ? 0 : -ENOMEM;

	for (uint32_t i = 0; !err && i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		hf_name(t->name, moe, name, sizeof(name));
		err = t->bytes > mp_store_expert_bytes(s) * 4 ? -E2BIG :
		      mp_store_read_tensor(s, t, buf);
		if (!err)
			err = add(v, n, name, st_dtype(t->dtype), t->dims[0],
				  t->ndim > 1 ? t->dims[1] : 0, buf, t->bytes);
	}
	for (uint32_t l = 0; !err && l < g->layers; l++) {
		for (uint32_t e = 0; !err && e < g->experts; e++) {
			err = mp_store_read_expert(s, l, e, buf);
			for (int p = 0; p < 3 && !err; p++) {
				snprintf(name, sizeof(name), "model.layers.%u.%s.experts.%u.%s.weight",
					 l, moe, e, mixtral ? mix[p] : qwen[p]);
				err = add(v, n, name, st_dtype(g->dtype), p < 2 ? g->ffn : g->hidden,
					  p < 2 ? g->hidden : g->ffn, (char *)buf + p * part, part);
			}
		}
	}
	if (!err && o->extra_tensor)
		err = add(v, n, o->extra_tensor, "F32", g->hidden, 0, NULL, 4ull * g->hidden);
	free(buf);
	return err;
}

static int write_shard(const char *path, struct piece *v, size_t n, unsigned shard,
		       unsigned shards, const struct st_write_opts *o)
{
	json_t *h = json_object();
	uint64_t off = 0, len;
	char *text;
	FILE *f;
	int err = 0;

	for (size_t i = shard; i < n; i += shards) {
		json_t *e = json_object(), *shape = json_array();
		bool re = o->retype && !strcmp(v[i].name, o->retype);

		json_array_append_new(shape, json_integer((json_int_t)v[i].rows));
		if (v[i].cols)
			json_array_append_new(shape, json_integer((json_int_t)v[i].cols));
		json_object_set_new(e, "dtype", json_string(re ? o->type : v[i].dtype));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off,
								 (json_int_t)(off + v[i].bytes)));
		json_object_set_new(h, v[i].name, e);
		off += v[i].bytes;
	}
	json_object_set_new(h, "__metadata__", json_pack("{ss}", "format", "pt"));
	text = json_dumps(h, JSON_COMPACT);
	json_decref(h);
	f = fopen(path, "wb");
	if (!text || !f) {
		free(text);
		if (f)
			fclose(f);
		return -EIO;
	}
	len = strlen(text);
	if (fwrite(&len, 8, 1, f) != 1 || fwrite(text, 1, len, f) != len)
		err = -EIO;
	for (size_t i = shard; !err && i < n; i += shards)
		if (fwrite(v[i].data, 1, v[i].bytes, f) != v[i].bytes)
			err = -EIO;
	free(text);
	return fclose(f) || err ? -EIO : 0;
}

int st_write_config(const char *dir, const struct mp_geometry *g, const char *type,
		    const char *extra)
{
	char path[4096];
	json_t *c = json_pack("{ss ss si si si si si si si si si sf sf sb sn}",
			      "model_type", type, "hidden_act", "silu",
			      "num_hidden_layers", (int)g->layers, "hidden_size", (int)g->hidden,
			      "num_attention_heads", (int)g->heads,
			      "num_key_value_heads", (int)g->kv_heads, "head_dim", (int)g->head_dim,
			      "num_experts_per_tok", (int)g->topk,
			      "max_position_embeddings", (int)g->max_seq,
			      "vocab_size", (int)g->vocab,
			      strcmp(type, "mixtral") ? "num_experts" : "num_local_experts",
			      (int)g->experts, "rms_norm_eps", (double)g->norm_eps,
			      "rope_theta", (double)g->rope_theta, "norm_topk_prob", 1,
			      "rope_scaling");
	json_t *more = extra ? json_loads(extra, 0, NULL) : NULL;
	int err;

	if (!c)
		return -ENOMEM;
	json_object_set_new(c, strcmp(type, "mixtral") ? "moe_intermediate_size" :
			    "intermediate_size", json_integer(g->ffn));
	if (more)
		json_object_update(c, more);
	json_decref(more);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	err = json_dump_file(c, path, JSON_INDENT(1)) ? -EIO : 0;
	json_decref(c);
	return err;
}

int st_write_dir(const char *mpk, const char *dir, const struct st_write_opts *o)
{
	const char *type = o->model_type ? o->model_type : "mixtral";
	unsigned shards = o->shards ? o->shards : 1;
	struct piece *v = NULL;
	struct mp_store *s;
	char path[4096];
	size_t n = 0;
	int err = mp_store_open(mpk, &s);

	if (err)
		return err;
	err = collect(s, o, !strcmp(type, "mixtral"), &v, &n);
	for (unsigned i = 0; !err && i < shards; i++) {
		snprintf(path, sizeof(path), "%s/model-%05u-of-%05u.safetensors", dir, i + 1, shards);
		err = write_shard(path, v, n, i, shards, o);
	}
	if (!err)
		err = st_write_config(dir, mp_store_geometry(s), type, o->extra_config);
	for (size_t i = 0; i < n; i++)
		free(v[i].data);
	free(v);
	mp_store_close(s);
	return err;
}
