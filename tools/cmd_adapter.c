// SPDX-License-Identifier: MIT
/* moepager adapter: pack, merge, make and inspect expert adapters (.mpa). */
#include <argp.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

#define MAX_ARGS 3

static struct adapter_env {
	const char *args[MAX_ARGS];	/* the action, then its files */
	uint32_t n_args;
	const char *out;
	const char *name;
	const char *base;
	uint32_t per_layer;
	uint64_t seed;
	bool verify;
	bool json;
} env;

static const char doc[] =
	"Expert adapters (.mpa, docs/mpa-format.md): the experts an expert-specialised\n"
	"fine-tune (ESFT) replaces in a base model, with the base's identity.\n"
	"\n"
	"  pack BASE.mpk TUNED.mpk --out A.mpa   the experts TUNED changed; refused when\n"
	"                                        it changed anything but experts\n"
	"  merge BASE.mpk A.mpa --out M.mpk      the merged model: BASE with A's experts\n"
	"  gen BASE.mpk --out A.mpa --per-layer K   a synthetic adapter for scale tests: K\n"
	"                                        experts per layer (chosen by --seed), each\n"
	"                                        a copy of another expert of its layer\n"
	"  info A.mpa [--base BASE.mpk] [--verify]  name, base, replaced experts per layer;\n"
	"                                        --base checks it is A's base, --verify every\n"
	"                                        expert checksum (exit 1 when one fails)\n"
	"\n"
	"The name (--name) defaults to the output file's name without its extension.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager adapter pack tiny-real.mpk tiny-real-man.mpk --out man.mpa\n"
	"  moepager adapter info --json --base tiny-real.mpk man.mpa\n";

static const struct argp_option opts[] = {
	{ "out", 'o', "FILE", 0, "Output file (pack, merge, gen)", 0 },
	{ "name", 'n', "NAME", 0, "Adapter or model name", 0 },
	{ "base", 'b', "BASE", 0, "info: check the adapter against this base model", 0 },
	{ "per-layer", 'k', "K", 0, "gen: experts replaced per layer", 0 },
	{ "seed", 's', "N", 0, "gen: which experts (default 1)", 0 },
	{ "verify", 'V', NULL, 0, "info: check every expert's checksum", 0 },
	{ "json", 'j', NULL, 0, "info: print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'o':
		env.out = arg;
		break;
	case 'n':
		env.name = arg;
		break;
	case 'b':
		env.base = arg;
		break;
	case 'k':
		cli_opt_u32(state, "--per-layer", arg, 1, MP_MAX_EXPERTS, &env.per_layer);
		break;
	case 's':
		cli_opt_u64(state, "--seed", arg, 0, UINT64_MAX, &env.seed);
		break;
	case 'V':
		env.verify = true;
		break;
	case 'j':
		env.json = true;
		break;
	case ARGP_KEY_ARG:
		if (env.n_args == MAX_ARGS)
			argp_error(state, "too many arguments");
		env.args[env.n_args++] = arg;
		break;
	case ARGP_KEY_END:
		if (!env.n_args)
			argp_error(state, "which action: pack, merge, gen or info?");
		if (strcmp(env.args[0], "pack") && strcmp(env.args[0], "merge") &&
		    strcmp(env.args[0], "gen") && strcmp(env.args[0], "info"))
			argp_error(state, "unknown action '%s' (pack, merge, gen, info)",
				   env.args[0]);
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/* The default name: the output file's name without its extension, in buf. */
static const char *name_or_default(char *buf, size_t len)
{
	char *copy, *dot;

	if (env.name)
		return env.name;
	copy = strdup(env.out);
	if (!copy)
		return NULL;
	snprintf(buf, len, "%s", basename(copy));
	free(copy);
	dot = strrchr(buf, '.');
	if (dot && dot != buf)
		*dot = 0;
	return buf;
}

static int fail(const char *what, int err)
{
	return cli_fail(err, "%s", what);
}

static int need(uint32_t files, bool out, const char *usage)
{
	if (env.n_args == files + 1 && (!out || env.out))
		return 0;
	return cli_error(-EINVAL, "usage: moepager adapter %s", usage);
}

static int do_pack(void)
{
	struct mp_store *base = NULL, *tuned = NULL;
	char buf[MP_ADAPTER_NAME_MAX + 64];
	const char *name, *what;
	int n;

	if (need(2, true, "pack BASE.mpk TUNED.mpk --out A.mpa [--name NAME]"))
		return -EINVAL;
	name = name_or_default(buf, sizeof(buf));
	/* The error names the file that failed: a missing input, not the output. */
	what = env.args[1];
	n = mp_store_open(what, &base);
	if (!n)
		n = mp_store_open(what = env.args[2], &tuned);
	if (!n)
		n = mp_adapter_pack(base, tuned, name ? name : "", what = env.out);
	if (n > 0)
		printf("%s: adapter '%s' of %s: %d experts\n", env.out, name, env.args[1], n);
	mp_store_close(tuned);
	mp_store_close(base);
	return n < 0 ? fail(what, n) : 0;
}

static int do_merge(void)
{
	struct mp_store *base = NULL;
	struct mp_adapter *a = NULL;
	const char *what;
	int err;

	if (need(2, true, "merge BASE.mpk A.mpa --out MERGED.mpk [--name NAME]"))
		return -EINVAL;
	what = env.args[1];
	err = mp_store_open(what, &base);
	if (!err)
		err = mp_adapter_open(what = env.args[2], &a);
	if (!err)
		err = mp_adapter_merge(base, a, env.name, what = env.out);
	if (!err)
		printf("%s: %s with adapter '%s' (%u experts)\n", env.out, env.args[1],
		       mp_adapter_name(a), mp_adapter_count(a));
	mp_adapter_close(a);
	mp_store_close(base);
	return err ? fail(what, err) : 0;
}

/* splitmix64: the choice of experts is a function of --seed alone. */
static uint64_t next_random(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Layer l's K experts, each a copy of the expert after it (so they differ from the base). */
static int gen_layer(struct mp_store *base, struct mp_adapter_writer *w, uint32_t l,
		     uint64_t *rng, void *buf)
{
	uint32_t experts = mp_store_geometry(base)->experts, perm[MP_MAX_EXPERTS];
	int err = 0;

	for (uint32_t e = 0; e < experts; e++)
		perm[e] = e;
	for (uint32_t i = 0; i < env.per_layer && !err; i++) {
		uint32_t j = i + (uint32_t)(next_random(rng) % (experts - i)), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		err = mp_store_read_expert(base, l, (perm[i] + 1) % experts, buf);
		if (!err)
			err = mp_adapter_writer_put(w, l, perm[i], buf);
	}
	return err;
}

static int do_gen(void)
{
	struct mp_adapter_writer *w = NULL;
	struct mp_store *base = NULL;
	char nbuf[MP_ADAPTER_NAME_MAX + 64];
	uint64_t rng = env.seed;
	void *buf = NULL;
	int err;

	if (need(1, true, "gen BASE.mpk --out A.mpa --per-layer K [--seed N] [--name NAME]"))
		return -EINVAL;
	err = mp_store_open(env.args[1], &base);
	if (err)
		return fail(env.args[1], err);
	if (!env.per_layer || env.per_layer >= mp_store_geometry(base)->experts) {
		err = cli_error(-EINVAL, "--per-layer must be in [1, %u)",
				mp_store_geometry(base)->experts);
		goto close_base;
	}
	buf = malloc(mp_store_expert_bytes(base));
	err = buf ? mp_adapter_writer_create(env.out, base, name_or_default(nbuf, sizeof(nbuf)),
					     &w) : -ENOMEM;
	for (uint32_t l = 0; !err && l < mp_store_geometry(base)->layers; l++)
		err = gen_layer(base, w, l, &rng, buf);
	if (err)
		mp_adapter_writer_abort(w);
	else
		err = mp_adapter_writer_finish(w);
	if (err)
		fail(env.out, err);
close_base:
	free(buf);
	mp_store_close(base);
	return err;
}

static json_t *layers_json(const struct mp_adapter *a)
{
	json_t *arr = json_array();

	for (uint32_t l = 0; arr && l < mp_adapter_layers(a); l++) {
		uint32_t n;
		const struct mp_adapter_expert *e = mp_adapter_layer(a, l, &n);
		json_t *ids = json_array();

		for (uint32_t i = 0; ids && i < n; i++)
			json_array_append_new(ids, json_integer(e[i].expert));
		json_array_append_new(arr, ids ? ids : json_null());
	}
	return arr;
}

static uint64_t adapter_bytes(const struct mp_adapter *a)
{
	uint64_t sum = 0;
	uint32_t n;

	for (uint32_t l = 0; l < mp_adapter_layers(a); l++) {
		const struct mp_adapter_expert *e = mp_adapter_layer(a, l, &n);

		for (uint32_t i = 0; i < n; i++)
			sum += e[i].bytes;
	}
	return sum;
}

static void print_info(const struct mp_adapter *a, int base_err, int bad)
{
	uint32_t n;
	char id[17];

	snprintf(id, sizeof(id), "%016" PRIx64, mp_adapter_base_identity(a));
	if (env.json) {
		json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:o}",
			"path", mp_adapter_path(a), "name", mp_adapter_name(a),
			"base_name", mp_adapter_base_name(a), "base_identity", id,
			"experts", (json_int_t)mp_adapter_count(a),
			"max_per_layer", (json_int_t)mp_adapter_max_per_layer(a),
			"bytes", (json_int_t)adapter_bytes(a),
			"layers", layers_json(a));

		if (root && env.base)
			json_object_set_new(root, "base_ok", json_boolean(!base_err));
		if (root && env.verify)
			json_object_set_new(root, "bad_experts", json_integer(bad));
		if (root && !json_dumpf(root, stdout, JSON_INDENT(2)))
			putchar('\n');
		json_decref(root);
		return;
	}
	printf("%s: adapter '%s' of model '%s' (identity %s): %u experts (%.1f MB), at most %u "
	       "per layer\n", mp_adapter_path(a), mp_adapter_name(a), mp_adapter_base_name(a), id,
	       mp_adapter_count(a), adapter_bytes(a) / 1e6, mp_adapter_max_per_layer(a));
	for (uint32_t l = 0; l < mp_adapter_layers(a); l++) {
		const struct mp_adapter_expert *e = mp_adapter_layer(a, l, &n);

		printf("  layer %u:", l);
		for (uint32_t i = 0; i < n; i++)
			printf(" %u", e[i].expert);
		printf("\n");
	}
	if (env.base)
		printf("base %s: %s\n", env.base, base_err ? "NOT this adapter's base" : "OK");
	if (env.verify)
		printf("verify: %s (%d bad)\n", bad ? "FAILED" : "OK", bad);
}

static int do_info(void)
{
	struct mp_adapter *a = NULL;
	struct mp_store *base = NULL;
	int err, base_err = 0, bad = 0;

	if (need(1, false, "info A.mpa [--base BASE.mpk] [--verify] [--json]"))
		return -EINVAL;
	err = mp_adapter_open(env.args[1], &a);
	if (err)
		return fail(env.args[1], err);
	if (env.base) {
		err = mp_store_open(env.base, &base);
		if (err) {
			fail(env.base, err);
			goto close_adapter;
		}
		base_err = mp_adapter_check_base(a, base);
	}
	if (env.verify) {
		bad = mp_adapter_verify(a);
		if (bad < 0) {
			err = fail(env.args[1], bad);
			goto close_adapter;
		}
	}
	print_info(a, base_err, bad);
	err = base_err ? base_err : bad ? -EBADMSG : 0;
close_adapter:
	mp_store_close(base);
	mp_adapter_close(a);
	return err;
}

int cmd_adapter(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "pack|merge|gen|info FILE...", doc,
					  NULL, NULL, NULL };
	static const struct {
		const char *name;
		int (*run)(void);
	} actions[] = {
		{ "pack", do_pack }, { "merge", do_merge }, { "gen", do_gen }, { "info", do_info },
	};
	int err;

	memset(&env, 0, sizeof(env));
	env.seed = 1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return -err;
	for (size_t i = 0; i < sizeof(actions) / sizeof(actions[0]); i++)
		if (!strcmp(env.args[0], actions[i].name))
			return actions[i].run();
	return -EINVAL;	/* not reached: parse_arg() refused any other action */
}
