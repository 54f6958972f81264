// SPDX-License-Identifier: MIT
/* moepager verify: checks every tensor and expert checksum of an .mpk file. */
#include <argp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

static struct verify_env {
	const char *path;
	bool json;
} env;

static const char doc[] =
	"Open an .mpk file (validating header and tables), then read every tensor and\n"
	"expert and check its XXH3-64 checksum. Exits 0 only when all pass; otherwise\n"
	"prints `layer L expert E: checksum mismatch` for every bad expert and exits 1.\n"
	"\n"
	"--json prints one object: {\"path\", \"ok\", \"tensors\", \"experts\",\n"
	"\"bad_tensors\", \"bad_experts\": [{\"layer\", \"expert\", \"error\"}], \"bytes\",\n"
	"\"seconds\"}.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager verify /tmp/tiny.mpk\n"
	"  moepager verify --json model.mpk | jq .bad_experts\n";

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

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	const struct mp_store *s = arg;

	cli_progress("verify", done * mp_store_expert_bytes(s),
		     total * mp_store_expert_bytes(s));
}

static const char *bad_reason(int err)
{
	return err == -EBADMSG ? "checksum mismatch" : strerror(-err);
}

static int print_json(const struct mp_store *s, const struct mp_verify_result *bad,
		      uint32_t n_bad, int n_fail, double secs)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	json_t *root, *arr;
	int err = -ENOMEM;

	arr = json_array();
	root = json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:f}", "path", mp_store_path(s),
			 "ok", n_fail == 0, "tensors", (json_int_t)mp_store_tensor_count(s),
			 "experts", (json_int_t)g->layers * g->experts,
			 "bad_tensors", (json_int_t)(n_fail - (int)n_bad),
			 "bytes", (json_int_t)mp_store_total_expert_bytes(s), "seconds", secs);
	if (!arr || !root)
		goto put_json;
	for (uint32_t i = 0; i < n_bad; i++)
		if (json_array_append_new(arr, json_pack("{s:I, s:I, s:s}",
				"layer", (json_int_t)bad[i].layer,
				"expert", (json_int_t)bad[i].expert,
				"error", bad_reason(bad[i].err))))
			goto put_json;
	json_object_set(root, "bad_experts", arr);
	if (json_dumpf(root, stdout, JSON_INDENT(2)) == 0) {
		putchar('\n');
		err = 0;
	}
put_json:
	json_decref(arr);
	json_decref(root);
	if (err)
		cli_error(err, "out of memory building JSON");
	return err;
}

int cmd_verify(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "FILE", doc, NULL, NULL, NULL };
	struct mp_verify_result *bad = NULL;
	const struct mp_geometry *g;
	struct mp_store *s;
	uint32_t n_experts, n_bad;
	uint64_t t0;
	double secs;
	int err, n_fail;

	memset(&env, 0, sizeof(env));
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.path, &s);
	if (err)
		return cli_fail(err, "%s", env.path);
	g = mp_store_geometry(s);
	n_experts = g->layers * g->experts;
	bad = calloc(n_experts, sizeof(*bad));
	if (!bad) {
		err = cli_error(-ENOMEM, "out of memory");
		goto close_store;
	}
	t0 = cli_now_ns();
	n_fail = mp_store_verify(s, bad, n_experts, cli_progress_enabled() ? on_progress : NULL, s);
	cli_progress_end();
	secs = (cli_now_ns() - t0) / 1e9;
	if (n_fail < 0) {
		err = cli_fail(n_fail, "%s", env.path);
		goto free_bad;
	}
	/* bad[] holds every failing expert (max_bad = all); the rest are tensors */
	for (n_bad = 0; n_bad < n_experts && bad[n_bad].err; n_bad++)
		;
	if (env.json) {
		err = print_json(s, bad, n_bad, n_fail, secs);
	} else {
		for (uint32_t i = 0; i < n_bad; i++)
			printf("layer %u expert %u: %s\n", bad[i].layer, bad[i].expert,
			       bad_reason(bad[i].err));
		if (n_fail > (int)n_bad)
			printf("%d tensor(s) failed (see the messages above)\n",
			       n_fail - (int)n_bad);
		if (!n_fail)
			printf("%s: OK: %u tensors and %u experts (%.2f GB) in %.2f s\n", env.path,
			       mp_store_tensor_count(s), n_experts,
			       mp_store_total_expert_bytes(s) / 1e9, secs);
		else
			printf("%s: FAILED: %d bad piece(s)\n", env.path, n_fail);
	}
	if (!err && n_fail)
		err = -EBADMSG;
free_bad:
	free(bad);
close_store:
	mp_store_close(s);
	return err;
}
