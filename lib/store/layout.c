// SPDX-License-Identifier: MIT
/* The Mixtral-style tensor list of a geometry and where the writer puts each piece. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/format.h"
#include "store/layout.h"

/* Tensors per decoder layer, and outside the layers (tok_embd, output_norm, output). */
#define LAYER_TENSORS	7u
#define GLOBAL_TENSORS	3u

uint64_t mpk_shape_bytes(enum mp_dtype t, uint32_t ndim, const uint64_t *dims, bool *overflow)
{
	/* rows of the last dimension, in whole blocks for the block types */
	uint64_t n = ndim ? mp_dtype_bytes(t, dims[ndim - 1]) : 0;

	*overflow = !n && ndim && dims[ndim - 1];
	for (uint32_t i = 0; i + 1 < ndim && !*overflow; i++)
		*overflow = __builtin_mul_overflow(n, dims[i], &n);
	return *overflow ? 0 : n;
}

static void set_tensor(struct mp_tensor_info *t, const char *name, enum mp_dtype dtype,
		       uint64_t rows, uint64_t cols)
{
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dtype = dtype;
	t->ndim = cols ? 2 : 1;
	t->dims[0] = rows;
	t->dims[1] = cols;
}

static void fill_tensors(const struct mp_geometry *g, struct mp_tensor_info *t)
{
	uint64_t q_rows = (uint64_t)g->heads * g->head_dim;
	uint64_t kv_rows = (uint64_t)g->kv_heads * g->head_dim;
	char name[MP_TENSOR_NAME_MAX];

	set_tensor(t++, "tok_embd", g->dtype, g->vocab, g->hidden);
	for (uint32_t l = 0; l < g->layers; l++) {
#define LAYER_TENSOR(suffix, dtype, rows, cols) do {				\
		snprintf(name, sizeof(name), "blk.%u." suffix, l);		\
		set_tensor(t++, name, dtype, rows, cols);			\
	} while (0)
		LAYER_TENSOR("attn_norm", MP_DTYPE_F32, g->hidden, 0);
		LAYER_TENSOR("attn_q", g->dtype, q_rows, g->hidden);
		LAYER_TENSOR("attn_k", g->dtype, kv_rows, g->hidden);
		LAYER_TENSOR("attn_v", g->dtype, kv_rows, g->hidden);
		LAYER_TENSOR("attn_o", g->dtype, g->hidden, q_rows);
		LAYER_TENSOR("ffn_norm", MP_DTYPE_F32, g->hidden, 0);
		LAYER_TENSOR("router", MP_DTYPE_F32, g->experts, g->hidden);
#undef LAYER_TENSOR
	}
	set_tensor(t++, "output_norm", MP_DTYPE_F32, g->hidden, 0);
	set_tensor(t++, "output", g->dtype, g->vocab, g->hidden);
}

int mpk_layout_build(const struct mp_geometry *g, struct mpk_layout *l)
{
	uint64_t off, tables, experts_end;
	bool ovf;
	int err;

	memset(l, 0, sizeof(*l));
	err = mp_geometry_check(g);
	if (err)
		return err;
	/* Bounded by mp_geometry_check(): layers <= 1024, experts <= 4096. */
	l->n_tensors = GLOBAL_TENSORS + LAYER_TENSORS * g->layers;
	l->n_experts = g->layers * g->experts;
	l->tensors = calloc(l->n_tensors, sizeof(*l->tensors));
	if (!l->tensors)
		return mp_err(-ENOMEM, "store layout: out of memory for %u tensors", l->n_tensors);
	fill_tensors(g, l->tensors);

	l->tensor_table_off = MPK_HEADER_BYTES;
	l->expert_table_off = l->tensor_table_off +
			      (uint64_t)l->n_tensors * MPK_TENSOR_ENTRY_BYTES;
	tables = l->expert_table_off + (uint64_t)l->n_experts * MPK_EXPERT_ENTRY_BYTES;
	l->tables_end = tables;

	/* Shapes are bounded (dims <= 2^24, 4-byte types) so these sums cannot overflow. */
	off = MP_ALIGN_UP(tables, MPK_TENSOR_ALIGN);
	for (uint32_t i = 0; i < l->n_tensors; i++) {
		struct mp_tensor_info *t = &l->tensors[i];

		t->bytes = mpk_shape_bytes(t->dtype, t->ndim, t->dims, &ovf);
		t->offset = off;
		off = MP_ALIGN_UP(off + t->bytes, MPK_TENSOR_ALIGN);
		l->tensor_data_bytes += t->bytes;
	}

	l->expert_bytes = mp_geometry_expert_bytes(g);
	l->expert_stride = MP_ALIGN_UP(l->expert_bytes, MP_EXPERT_ALIGN);
	l->expert_base = MP_ALIGN_UP(off, MP_EXPERT_ALIGN);
	if (__builtin_mul_overflow((uint64_t)(l->n_experts - 1), l->expert_stride, &experts_end) ||
	    __builtin_add_overflow(experts_end, l->expert_base + l->expert_bytes, &experts_end) ||
	    experts_end > INT64_MAX - MPK_FILE_ALIGN) {
		mpk_layout_free(l);
		return mp_err(-EINVAL, "store layout: %u experts of %llu bytes do not fit a file",
			      g->layers * g->experts,
			      (unsigned long long)mp_geometry_expert_bytes(g));
	}
	l->file_bytes = MP_ALIGN_UP(experts_end, MPK_FILE_ALIGN);
	return 0;
}

void mpk_layout_free(struct mpk_layout *l)
{
	free(l->tensors);
	l->tensors = NULL;
	l->n_tensors = 0;
}
