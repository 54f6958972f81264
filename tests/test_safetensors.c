// SPDX-License-Identifier: MIT
/* Hugging Face safetensors import: Mixtral and Qwen3-MoE directories, refused models, damaged shards. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "st_write.h"
#include "base/base.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static char dir[512], mpk[512], out[512];

/* A small model (2 layers x 4 experts) written as a fresh Hugging Face directory. */
static void make_dir(enum mp_dtype dtype, const struct st_write_opts *o)
{
	char cmd[1100];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir '%s'", dir, dir);
	assert_int_equal(system(cmd), 0);
	unlink(out);
	assert_int_equal(t_gen_small(mpk, dtype, 6), 0);
	assert_int_equal(st_write_dir(mpk, dir, o), 0);
}

/* Hugging Face ropes halves and stores [out, in]: the .mpk comes back byte for byte. */
static void mixtral_and_qwen3_moe_directories_import_byte_for_byte(void **state)
{
	static const struct {
		enum mp_dtype dtype;
		struct st_write_opts o;
	} cases[] = {
		{ MP_DTYPE_F32, { .model_type = "mixtral" } },
		{ MP_DTYPE_BF16, { .model_type = "mixtral", .shards = 3 } },
		{ MP_DTYPE_F16, { .model_type = "qwen3_moe", .shards = 2 } },
	};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		struct mp_import_config cfg = { .dtype = -1, .name = "small" };

		make_dir(cases[i].dtype, &cases[i].o);
		if (mp_safetensors_import(dir, out, &cfg))
			fail_msg("case %zu: %s", i, mp_last_error());
		t_assert_same_model(mpk, out);
	}
}

static void import_refuses_models_the_runner_cannot_run(void **state)
{
	static const struct {
		struct st_write_opts o;
		int err;
		const char *msg;
	} cases[] = {
		{ { .model_type = "llama4" }, -EOPNOTSUPP, "model_type 'llama4' is not one" },
		{ { .model_type = "qwen3_moe",
		    .extra_tensor = "model.layers.0.self_attn.q_norm.weight" }, -EOPNOTSUPP,
		  "tensor 'model.layers.0.self_attn.q_norm.weight': an RMSNorm of the queries" },
		{ { .model_type = "qwen2_moe", .extra_config = "{\"norm_topk_prob\": false}" },
		  -EOPNOTSUPP, "'norm_topk_prob': top-k router weights left unnormalised" },
		{ { .model_type = "qwen2_moe",
		    .extra_config = "{\"shared_expert_intermediate_size\": 64}" },
		  -EOPNOTSUPP, "'shared_expert_intermediate_size': a shared expert" },
		{ { .extra_tensor = "model.layers.1.self_attn.q_proj.bias" }, -EOPNOTSUPP,
		  "'model.layers.1.self_attn.q_proj.bias': a bias" },
		{ { .extra_config = "{\"rope_scaling\": {\"type\": \"yarn\"}}" }, -EOPNOTSUPP,
		  "'rope_scaling': scaled RoPE" },
		{ { .extra_config = "{\"sliding_window\": 64}" }, -EOPNOTSUPP, "sliding-window" },
		{ { .retype = "model.layers.1.block_sparse_moe.experts.2.w3.weight", .type = "I32" },
		  -EOPNOTSUPP, "tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight' is I32" },
		{ { .extra_config = "{\"num_local_experts\": 5}" }, -EINVAL,
		  "'model.layers.0.block_sparse_moe.gate.weight' is [4, 64] (2 dims), the config "
		  "gives [5, 64]" },
		{ { .extra_config = "{\"num_experts_per_tok\": 9}" }, -EINVAL,
		  "the model does not fit the runner: geometry: topk = 9" },
	};

	(void)state;
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		int err;

		make_dir(MP_DTYPE_F32, &cases[i].o);
		t_log_reset();
		err = mp_safetensors_import(dir, out, NULL);
		if (err != cases[i].err || !t_log_contains(cases[i].msg))
			fail_msg("case %zu: %d, log lacks '%s': %s", i, err, cases[i].msg,
				 mp_last_error());
		assert_int_equal(access(out, F_OK), -1);
	}
}

static void patch(const char *path, uint64_t off, const void *v, size_t len)
{
	int fd = open(path, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, v, len, (off_t)off), (ssize_t)len);
	close(fd);
}

/* Replaces the first occurrence of from in the shard's JSON header by to (same length). */
static void patch_header(const char *path, const char *from, const char *to)
{
	size_t len;
	char *buf, *at;

	assert_int_equal(strlen(from), strlen(to));
	assert_int_equal(mp_read_file("test", path, &buf, &len), 0);
	at = memmem(buf, len, from, strlen(from));
	assert_non_null(at);
	patch(path, (uint64_t)(at - buf), to, strlen(to));
	free(buf);
}

/* A damaged shard is refused naming the file, the tensor and where. */
static void damaged_shards_are_refused_by_name(void **state)
{
	struct st_write_opts one = { .shards = 1 };
	char shard[600], config[600];
	uint64_t big = 50ull << 20, huge = 1ull << 40;
	struct stat st;

	(void)state;
	snprintf(shard, sizeof(shard), "%s/model-00001-of-00001.safetensors", dir);
	snprintf(config, sizeof(config), "%s/config.json", dir);

	make_dir(MP_DTYPE_F32, &one);
	patch(shard, 0, &big, 8);
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -ENODATA);
	assert_true(t_log_contains("a header of 52428800 bytes at offset 8 runs past"));
	patch(shard, 0, &huge, 8);
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -EINVAL);
	assert_true(t_log_contains("a header of 1099511627776 bytes at offset 8 is above"));

	make_dir(MP_DTYPE_F32, &one);
	patch(shard, 8, "[", 1);
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -EINVAL);
	assert_true(t_log_contains("the header is not a JSON object"));

	/* a shape that does not match its bytes */
	make_dir(MP_DTYPE_F32, &one);
	patch_header(shard, "\"shape\":[300,64]", "\"shape\":[301,64]");
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -EINVAL);
	assert_true(t_log_contains("tensor 'model.embed_tokens.weight': data_offsets [0, 76800) "
				   "hold 76800 bytes, its shape of F32 needs 77056"));

	/* data past the end of the file */
	make_dir(MP_DTYPE_F32, &one);
	assert_int_equal(stat(shard, &st), 0);
	assert_int_equal(truncate(shard, st.st_size - 1), 0);
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -ENODATA);
	assert_true(t_log_contains("runs past the end of the file"));

	/* two tensors on the same bytes: the norm moved onto the embedding */
	make_dir(MP_DTYPE_F32, &one);
	patch_header(shard, "\"data_offsets\":[76800,77056]", "\"data_offsets\":[0    ,  256]");
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -EINVAL);
	assert_true(t_log_contains("overlaps tensor"));

	/* no config.json */
	make_dir(MP_DTYPE_F32, &one);
	unlink(config);
	t_log_reset();
	assert_int_equal(mp_safetensors_import(dir, out, NULL), -ENOENT);
	assert_true(t_log_contains("config.json"));
	assert_int_equal(access(out, F_OK), -1);
}

static int group_setup(void **state)
{
	(void)state;
	t_log_capture();
	snprintf(dir, sizeof(dir), "%s", t_path("hf"));
	snprintf(mpk, sizeof(mpk), "%s", t_path("src.mpk"));
	snprintf(out, sizeof(out), "%s", t_path("out.mpk"));
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(mixtral_and_qwen3_moe_directories_import_byte_for_byte),
		cmocka_unit_test(import_refuses_models_the_runner_cannot_run),
		cmocka_unit_test(damaged_shards_are_refused_by_name),
	};

	return cmocka_run_group_tests(tests, group_setup, t_group_tmpdir_cleanup);
}
