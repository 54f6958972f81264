/* SPDX-License-Identifier: MIT */
/* The geometry of the safetensors fuzz seeds, and of the config.json the fuzzer reads them with. */
#ifndef MP_ST_FUZZ_H
#define MP_ST_FUZZ_H

#define ST_FUZZ_GEOMETRY {							\
	.layers = 1, .experts = 2, .topk = 1, .hidden = 32, .ffn = 32, .heads = 2,	\
	.kv_heads = 1, .head_dim = 16, .vocab = 16, .max_seq = 16,			\
	.dtype = MP_DTYPE_F32, .rope_theta = 10000.0f, .norm_eps = 1e-5f,		\
}

#endif
