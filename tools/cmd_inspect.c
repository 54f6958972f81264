// SPDX-License-Identifier: MIT
/* moepager inspect: prints an .mpk file's geometry, tensor table and expert table. */
#include <argp.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

static struct inspect_env {
	const char *path;
	bool json;
} env;

static const char doc[] =
	"Validate an .mpk file's header and tables and print its geometry, tensors and\n"
	"experts. Expert data is not read (see `moepager verify`).\n"
	"\n"
	"--json prints one object: {\"path\", \"name\", \"version\", \"file_bytes\",\n"
	"\"expert_bytes\", \"total_expert_bytes\", \"geometry\": {...}, \"tensors\": [{\"name\",\n"
	"\"dtype\", \"shape\", \"offset\", \"bytes\", \"checksum\"}], \"experts\": [{\"layer\",\n"
	"\"expert\", \"offset\", \"bytes\", \"checksum\"}]}; checksums are 16 hex digits.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager inspect /tmp/tiny.mpk\n"
	"  moepager inspect --json model.mpk | jq '.experts[0]'\n";

static const struct argp_option opts[] = {
	{ "json", 'j', NULL, 0, "Print one JSON object on stdout", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'j':
		env.json = true;
		break;
	default:
		return cli_parse_one_path(key, arg, state, &env.path);
	}
	return 0;
}

static void hex64(char buf[17], uint64_t v)
{
	snprintf(buf, 17, "%016" PRIx64, v);
}

static json_t *geometry_json(const struct mp_geometry *g)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:f, s:f}",
			 "layers", (json_int_t)g->layers, "experts", (json_int_t)g->experts,
			 "topk", (json_int_t)g->topk, "hidden", (json_int_t)g->hidden,
			 "ffn", (json_int_t)g->ffn, "heads", (json_int_t)g->heads,
			 "kv_heads", (json_int_t)g->kv_heads, "head_dim", (json_int_t)g->head_dim,
			 "vocab", (json_int_t)g->vocab, "max_seq", (json_int_t)g->max_seq,
			 "dtype", mp_dtype_name(g->dtype), "rope_theta", (double)g->rope_theta,
			 "norm_eps", (double)g->norm_eps);
}

static int print_json(const struct mp_store *s)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	json_t *root, *tensors, *experts, *shape;
	char sum[17];
	int err = -ENOMEM;

	root = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "path", mp_store_path(s),
			 "name", mp_store_name(s), "version", (json_int_t)MP_MPK_VERSION,
			 "file_bytes", (json_int_t)mp_store_file_bytes(s),
			 "expert_bytes", (json_int_t)mp_store_expert_bytes(s),
			 "total_expert_bytes", (json_int_t)mp_store_total_expert_bytes(s));
	tensors = json_array();
	experts = json_array();
	if (!root || !tensors || !experts ||
	    json_object_set_new(root, "geometry", geometry_json(g)))
		goto put_json;
	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		shape = json_array();
		for (uint32_t d = 0; shape && d < t->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)t->dims[d]));
		hex64(sum, t->checksum);
		if (json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}",
				"name", t->name, "dtype", mp_dtype_name(t->dtype), "shape", shape,
				"offset", (json_int_t)t->offset, "bytes", (json_int_t)t->bytes,
				"checksum", sum)))
			goto put_json;
	}
	for (uint32_t l = 0; l < g->layers; l++) {
		for (uint32_t e = 0; e < g->experts; e++) {
			const struct mp_expert_info *x = mp_store_expert(s, l, e);

			hex64(sum, x->checksum);
			if (json_array_append_new(experts, json_pack("{s:I, s:I, s:I, s:I, s:s}",
					"layer", (json_int_t)l, "expert", (json_int_t)e,
					"offset", (json_int_t)x->offset,
					"bytes", (json_int_t)x->bytes, "checksum", sum)))
				goto put_json;
		}
	}
	json_object_set(root, "tensors", tensors);
	json_object_set(root, "experts", experts);
	if (json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(7)) == 0) {
		putchar('\n');
		err = 0;
	}
put_json:
	json_decref(experts);
	json_decref(tensors);
	json_decref(root);
	if (err)
		cli_error(err, "out of memory building JSON");
	return err;
}

static void print_text(const struct mp_store *s)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	char shape[96];

	printf("file        %s (%" PRIu64 " bytes, format v%u)\n", mp_store_path(s),
	       mp_store_file_bytes(s), MP_MPK_VERSION);
	printf("name        %s\n", mp_store_name(s));
	printf("geometry    layers %u, experts %u, topk %u, hidden %u, ffn %u, heads %u, "
	       "kv_heads %u, head_dim %u, vocab %u, max_seq %u, dtype %s, rope_theta %g, "
	       "norm_eps %g\n", g->layers, g->experts, g->topk, g->hidden, g->ffn, g->heads,
	       g->kv_heads, g->head_dim, g->vocab, g->max_seq, mp_dtype_name(g->dtype),
	       (double)g->rope_theta, (double)g->norm_eps);
	printf("experts     %u x %" PRIu64 " bytes = %.3f GB\n", g->layers * g->experts,
	       mp_store_expert_bytes(s), mp_store_total_expert_bytes(s) / 1e9);
	printf("\n%-24s %-5s %-16s %14s %12s  %s\n", "tensor", "dtype", "shape", "offset",
	       "bytes", "checksum");
	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		if (t->ndim == 1)
			snprintf(shape, sizeof(shape), "[%" PRIu64 "]", t->dims[0]);
		else
			snprintf(shape, sizeof(shape), "[%" PRIu64 ", %" PRIu64 "]", t->dims[0],
				 t->dims[1]);
		printf("%-24s %-5s %-16s %14" PRIu64 " %12" PRIu64 "  %016" PRIx64 "\n", t->name,
		       mp_dtype_name(t->dtype), shape, t->offset, t->bytes, t->checksum);
	}
	printf("\n%5s %6s %14s %12s  %s\n", "layer", "expert", "offset", "bytes", "checksum");
	for (uint32_t l = 0; l < g->layers; l++) {
		for (uint32_t e = 0; e < g->experts; e++) {
			const struct mp_expert_info *x = mp_store_expert(s, l, e);

			printf("%5u %6u %14" PRIu64 " %12" PRIu64 "  %016" PRIx64 "\n", l, e,
			       x->offset, x->bytes, x->checksum);
		}
	}
}

int cmd_inspect(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "FILE", doc, NULL, NULL, NULL };
	struct mp_store *s;
	int err;

	memset(&env, 0, sizeof(env));
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.path, &s);
	if (err)
		return cli_fail(err, "%s", env.path);
	if (env.json)
		err = print_json(s);
	else
		print_text(s);
	mp_store_close(s);
	return err;
}
