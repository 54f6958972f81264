/* SPDX-License-Identifier: MIT */
/* On-disk structures of the .mpk file (docs/mpk-format.md); private to the store. */
#ifndef MP_MPK_FORMAT_H
#define MP_MPK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/*
 * The file is little-endian and these structs are its byte image; the store
 * reads and writes them with memcpy, so it builds only for little-endian
 * hosts (every target moepager runs on: x86-64, arm64).
 */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .mpk reader assumes little-endian");

#define MPK_MAGIC		"MOEPAGER"
#define MPK_MAGIC_LEN		8
#define MPK_HEADER_BYTES	4096u
#define MPK_TENSOR_ENTRY_BYTES	128u
#define MPK_EXPERT_ENTRY_BYTES	64u
/* Every non-expert tensor starts on this boundary (O_DIRECT-friendly). */
#define MPK_TENSOR_ALIGN	4096u
/* file_bytes is a multiple of this, so an O_DIRECT read of the last expert stays inside. */
#define MPK_FILE_ALIGN		4096u
#define MPK_NAME_MAX		64u
#define MPK_MAX_DIMS		4u

/* Header flags: none defined in version 1; a reader rejects unknown bits. */
#define MPK_FLAGS_KNOWN		0u

struct mpk_header {
	char magic[MPK_MAGIC_LEN];	/* "MOEPAGER", no NUL */
	uint32_t version;		/* MP_MPK_VERSION */
	uint32_t header_bytes;		/* MPK_HEADER_BYTES */
	uint64_t file_bytes;		/* total size of the file */
	uint32_t layers;
	uint32_t experts;
	uint32_t topk;
	uint32_t hidden;
	uint32_t ffn;
	uint32_t heads;
	uint32_t kv_heads;
	uint32_t head_dim;
	uint32_t vocab;
	uint32_t max_seq;
	uint32_t dtype;			/* enum mp_dtype of the weight matrices */
	uint32_t flags;
	float rope_theta;
	float norm_eps;
	uint64_t tensor_table_off;
	uint32_t n_tensors;
	uint32_t tensor_entry_bytes;	/* MPK_TENSOR_ENTRY_BYTES */
	uint64_t expert_table_off;
	uint32_t n_experts;		/* layers * experts */
	uint32_t expert_entry_bytes;	/* MPK_EXPERT_ENTRY_BYTES */
	uint64_t expert_align;		/* MP_EXPERT_ALIGN */
	uint64_t expert_bytes;		/* mp_geometry_expert_bytes() */
	uint64_t tables_checksum;	/* XXH3-64 of the tensor table then the expert table */
	char name[MPK_NAME_MAX];	/* model name, NUL-padded */
	uint8_t reserved[MPK_HEADER_BYTES - 200 - 8];
	uint64_t header_checksum;	/* XXH3-64 of bytes [0, 4088) */
};

_Static_assert(sizeof(struct mpk_header) == MPK_HEADER_BYTES, "header size");
_Static_assert(offsetof(struct mpk_header, layers) == 24, "header layout");
_Static_assert(offsetof(struct mpk_header, dtype) == 64, "header layout");
_Static_assert(offsetof(struct mpk_header, tensor_table_off) == 80, "header layout");
_Static_assert(offsetof(struct mpk_header, expert_table_off) == 96, "header layout");
_Static_assert(offsetof(struct mpk_header, expert_align) == 112, "header layout");
_Static_assert(offsetof(struct mpk_header, tables_checksum) == 128, "header layout");
_Static_assert(offsetof(struct mpk_header, name) == 136, "header layout");
_Static_assert(offsetof(struct mpk_header, reserved) == 200, "header layout");
_Static_assert(offsetof(struct mpk_header, header_checksum) == MPK_HEADER_BYTES - 8,
	       "header layout");

struct mpk_tensor_entry {
	char name[MPK_NAME_MAX];	/* NUL-terminated, NUL-padded */
	uint32_t dtype;
	uint32_t ndim;			/* 1..4 */
	uint64_t dims[MPK_MAX_DIMS];	/* dims[0] slowest; unused dims are 0 */
	uint64_t offset;
	uint64_t bytes;
	uint64_t checksum;		/* XXH3-64 of the tensor's bytes */
};

_Static_assert(sizeof(struct mpk_tensor_entry) == MPK_TENSOR_ENTRY_BYTES, "tensor entry size");
_Static_assert(offsetof(struct mpk_tensor_entry, dims) == 72, "tensor entry layout");
_Static_assert(offsetof(struct mpk_tensor_entry, offset) == 104, "tensor entry layout");

struct mpk_expert_entry {
	uint32_t layer;
	uint32_t expert;
	uint64_t offset;
	uint64_t bytes;
	uint64_t checksum;		/* XXH3-64 of the expert's bytes */
	uint32_t flags;			/* 0 in version 1 */
	uint32_t reserved[7];
};

_Static_assert(sizeof(struct mpk_expert_entry) == MPK_EXPERT_ENTRY_BYTES, "expert entry size");
_Static_assert(offsetof(struct mpk_expert_entry, flags) == 32, "expert entry layout");

/*
 * The .mpa adapter file (docs/mpa-format.md): the experts one fine-tune
 * replaces in a base model, and the identity of that base.
 */
#define MPA_MAGIC		"MPADAPTR"
#define MPA_HEADER_BYTES	4096u
#define MPA_ENTRY_BYTES		64u
/* Experts and the table start on this boundary; file_bytes is a multiple of it. */
#define MPA_ALIGN		4096u
#define MPA_FLAGS_KNOWN		0u

struct mpa_header {
	char magic[MPK_MAGIC_LEN];	/* "MPADAPTR", no NUL */
	uint32_t version;		/* MP_MPA_VERSION */
	uint32_t header_bytes;		/* MPA_HEADER_BYTES */
	uint64_t file_bytes;
	uint32_t layers;		/* the base's geometry, for the messages and checks */
	uint32_t experts;
	uint32_t hidden;
	uint32_t ffn;
	uint32_t dtype;
	uint32_t flags;
	uint64_t expert_bytes;
	uint64_t base_identity;		/* mp_store_identity() of the base */
	uint64_t table_off;
	uint32_t n_entries;
	uint32_t entry_bytes;		/* MPA_ENTRY_BYTES */
	uint64_t table_checksum;	/* XXH3-64 of the table */
	char name[MPK_NAME_MAX];	/* adapter name */
	char base_name[MPK_NAME_MAX];	/* the base's model name, for messages */
	uint8_t reserved[MPA_HEADER_BYTES - 216 - 8];
	uint64_t header_checksum;	/* XXH3-64 of bytes [0, 4088) */
};

_Static_assert(sizeof(struct mpa_header) == MPA_HEADER_BYTES, "adapter header size");
_Static_assert(offsetof(struct mpa_header, base_identity) == 56, "adapter header layout");
_Static_assert(offsetof(struct mpa_header, name) == 88, "adapter header layout");
_Static_assert(offsetof(struct mpa_header, reserved) == 216, "adapter header layout");

/* The table lists entries in strictly increasing (layer, expert) order. */
struct mpa_entry {
	uint32_t layer;
	uint32_t expert;		/* the base expert id this one replaces */
	uint64_t offset;		/* MPA_ALIGN-aligned */
	uint64_t bytes;			/* == expert_bytes */
	uint64_t checksum;		/* XXH3-64 of the expert's bytes */
	uint32_t flags;			/* 0 in version 1 */
	uint32_t reserved[7];
};

_Static_assert(sizeof(struct mpa_entry) == MPA_ENTRY_BYTES, "adapter entry size");

/*
 * The .mpc consolidation map (docs/consolidate-format.md): which model's
 * expert serves every model at each (layer, expert) position.
 */
#define MPC_MAGIC		"MPCONSOL"
#define MPC_HEADER_BYTES	4096u
#define MPC_MODEL_ENTRY_BYTES	256u
#define MPC_POSITION_ENTRY_BYTES	16u
#define MPC_FLAGS_KNOWN		0u

struct mpc_header {
	char magic[MPK_MAGIC_LEN];	/* "MPCONSOL", no NUL */
	uint32_t version;		/* MP_MPC_VERSION */
	uint32_t header_bytes;		/* MPC_HEADER_BYTES */
	uint64_t file_bytes;
	uint32_t n_models;
	uint32_t flags;
	uint32_t layers;		/* the models' geometry */
	uint32_t experts;
	uint32_t hidden;
	uint32_t ffn;
	uint32_t dtype;
	uint32_t capacity;		/* positions owned */
	uint64_t expert_bytes;
	uint64_t models_off;		/* n_models entries of MPC_MODEL_ENTRY_BYTES */
	uint64_t positions_off;		/* layers * experts entries of MPC_POSITION_ENTRY_BYTES */
	uint64_t pairs_off;		/* n_pairs * layers * experts f64 */
	uint32_t model_entry_bytes;
	uint32_t position_entry_bytes;
	uint32_t n_positions;		/* layers * experts */
	uint32_t n_pairs;		/* n_models * (n_models - 1) / 2 */
	uint64_t models_checksum;	/* XXH3-64 of each table */
	uint64_t positions_checksum;
	uint64_t pairs_checksum;
	uint8_t reserved[MPC_HEADER_BYTES - 128 - 8];
	uint64_t header_checksum;	/* XXH3-64 of bytes [0, 4088) */
};

_Static_assert(sizeof(struct mpc_header) == MPC_HEADER_BYTES, "map header size");
_Static_assert(offsetof(struct mpc_header, expert_bytes) == 56, "map header layout");
_Static_assert(offsetof(struct mpc_header, model_entry_bytes) == 88, "map header layout");
_Static_assert(offsetof(struct mpc_header, models_checksum) == 104, "map header layout");
_Static_assert(offsetof(struct mpc_header, reserved) == 128, "map header layout");

struct mpc_model_entry {
	uint64_t identity;		/* mp_store_identity() */
	uint32_t owned;			/* positions it owns */
	uint32_t flags;			/* 0 in version 1 */
	char name[MPK_NAME_MAX];	/* mp_store_name(), NUL-padded */
	char file[128];			/* the file's name without its directory, for messages */
	uint8_t reserved[48];
};

_Static_assert(sizeof(struct mpc_model_entry) == MPC_MODEL_ENTRY_BYTES, "map model entry size");
_Static_assert(offsetof(struct mpc_model_entry, file) == 80, "map model entry layout");

/* Entry layer * experts + expert; distance is the sum of the pair table's column. */
struct mpc_position_entry {
	int32_t owner;			/* model index, or -1: each model uses its own */
	uint32_t rank;			/* 1 .. n_positions, 1 = smallest distance */
	double distance;		/* summed over model pairs */
};

_Static_assert(sizeof(struct mpc_position_entry) == MPC_POSITION_ENTRY_BYTES,
	       "map position entry size");

#endif /* MP_MPK_FORMAT_H */
