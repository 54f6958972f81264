// SPDX-License-Identifier: MIT
/* moepager consolidate: Multi-MoE's Algorithm 1 over model variants, its map, its distance report. */
#include <argp.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

static struct consolidate_env {
	const char *paths[MP_CONSOL_MAX_MODELS];
	uint32_t n;
	const char *capacity;
	const char *out;
	const char *info;
	uint32_t cross;
	bool json;
} env;

static const char doc[] =
	"Consolidates fine-tuned variants of one MoE model (Multi-MoE's Algorithm 1,\n"
	"docs/consolidate-format.md). For every (layer, expert) position it takes the L2\n"
	"distance between every pair of models' experts, sums it over the pairs, ranks the\n"
	"positions by that sum ascending (ties: lower layer, then lower expert), gives rank r\n"
	"to model (r - 1) mod N for the first C ranks and to none after, and writes the map.\n"
	"A position with an owner is served by that model's expert for every model; at the\n"
	"others each model uses its own.\n"
	"\n"
	"  moepager consolidate A.mpk B.mpk ... --capacity C --out MAP\n"
	"  moepager consolidate --info MAP [A.mpk B.mpk ...]   show a map; with models, check\n"
	"                                        it was made for them, in that order\n"
	"\n"
	"C is a count of positions (96), a fraction (0.5) or percentage (50%) of them, or\n"
	"memory for experts (512M, 8G: that many bytes over one expert's). The report gives,\n"
	"per layer, the positions each model owns and the distances at the same position\n"
	"(every pair) and across positions (--cross-samples of the (e1, e2 != e1) pairs of\n"
	"each model pair, evenly spread; 0 skips them).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager consolidate base.mpk chat.mpk code.mpk --capacity 50% --out v3.mpc\n"
	"  moepager consolidate --info v3.mpc base.mpk chat.mpk code.mpk --json\n";

static const struct argp_option opts[] = {
	{ "capacity", 'c', "C", 0, "Positions owned: N, 0.F, P% or a size (8G)", 0 },
	{ "out", 'o', "MAP", 0, "The map file to write", 0 },
	{ "info", 'i', "MAP", 0, "Show (and with models, check) a map", 0 },
	{ "cross-samples", 'x', "S", 0, "Cross-position distances per layer and pair (32)", 0 },
	{ "json", 'j', NULL, 0, "Print one JSON object", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'c':
		env.capacity = arg;
		break;
	case 'o':
		env.out = arg;
		break;
	case 'i':
		env.info = arg;
		break;
	case 'x':
		cli_opt_u32(state, "--cross-samples", arg, 0, MP_MAX_EXPERTS * MP_MAX_EXPERTS,
			    &env.cross);
		break;
	case 'j':
		env.json = true;
		break;
	case ARGP_KEY_ARG:
		if (env.n == MP_CONSOL_MAX_MODELS)
			argp_error(state, "at most %u models", MP_CONSOL_MAX_MODELS);
		env.paths[env.n++] = arg;
		break;
	case ARGP_KEY_END:
		if (!env.info && (!env.n || !env.capacity || !env.out))
			argp_error(state, "give the models, --capacity and --out (or --info MAP)");
		if (env.info && (env.capacity || env.out))
			argp_error(state, "--info takes no --capacity or --out");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

/* C as a count, fraction, percentage or size of experts, for positions of expert_bytes each. */
static int parse_capacity(const char *s, uint32_t positions, uint64_t expert_bytes, uint32_t *out)
{
	size_t len = strlen(s);
	char *end;
	double f;

	if (len && (s[len - 1] == '%' || strchr(s, '.'))) {
		errno = 0;
		f = strtod(s, &end);
		if (s[len - 1] == '%' && *end == '%') {
			f /= 100;
			end++;
		}
		if (errno || end == s || *end || !(f >= 0 && f <= 1))
			goto bad;
		*out = (uint32_t)floor(f * positions + 1e-9);
		return 0;
	}
	if (len && isalpha((unsigned char)s[len - 1])) {
		uint64_t bytes;

		if (cli_parse_size("--capacity", s, &bytes))
			return -EINVAL;
		*out = bytes / expert_bytes < positions ? (uint32_t)(bytes / expert_bytes) : positions;
		return 0;
	}
	return cli_parse_u32("--capacity", s, 0, positions, out);
bad:
	return cli_error(-EINVAL, "--capacity '%s' is not a count, a fraction in [0, 1], "
			 "a percentage or a size", s);
}

/*
 * The report: per layer, who owns what, and the distances at and across positions
 */

struct stats {
	uint32_t n;
	double min, p10, median, p90, max;
};

struct layer_report {
	uint32_t owned[MP_CONSOL_MAX_MODELS];
	uint32_t unowned;
	struct stats summed, same, cross;
};

struct report {
	struct layer_report *layer;
	struct stats summed, same, cross;
	double seconds;
};

static struct stats stats_of(const double *v, size_t n)
{
	struct stats s = { .n = (uint32_t)n };

	if (!n)
		return s;
	s.min = cli_quantile(v, n, 0);
	s.p10 = cli_quantile(v, n, 0.1);
	s.median = cli_median(v, n);
	s.p90 = cli_quantile(v, n, 0.9);
	s.max = cli_quantile(v, n, 1);
	return s;
}

/* Owners and the same-position (pair) and summed distances of layer l; buf holds pairs x experts. */
static void layer_owners_and_same(const struct mp_consolidation *c, uint32_t l,
				  struct layer_report *r, double *buf)
{
	uint32_t n = mp_consolidation_models(c), e_n = mp_consolidation_experts(c), k = 0;

	for (uint32_t e = 0; e < e_n; e++) {
		int o = mp_consolidation_owner(c, l, e);

		if (o == MP_CONSOL_NONE)
			r->unowned++;
		else
			r->owned[o]++;
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t j = i + 1; j < n; j++)
				buf[k++] = mp_consolidation_pair_distance(c, i, j, l, e);
	}
	r->same = stats_of(buf, k);
	for (uint32_t e = 0; e < e_n; e++)
		buf[e] = mp_consolidation_distance(c, l, e);
	r->summed = stats_of(buf, e_n);
}

/* Cross-position samples of layer l for every model pair, appended to all[*n_all]. */
static int layer_cross(struct mp_store **models, uint32_t n, uint32_t l, struct layer_report *r,
		       double *all, size_t *n_all)
{
	double *start = all + *n_all;
	size_t k = 0;

	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i + 1; j < n; j++) {
			int got = mp_consolidation_cross_distances(models[i], models[j], l,
								   env.cross, start + k);

			if (got < 0)
				return got;
			k += (size_t)got;
		}
	r->cross = stats_of(start, k);
	*n_all += k;
	return 0;
}

/* The summed and the pair distances over every position, through all[] (pairs x positions). */
static void overall_distances(const struct mp_consolidation *c, double *all, struct report *rep)
{
	uint32_t n = mp_consolidation_models(c), layers = mp_consolidation_layers(c);
	uint32_t experts = mp_consolidation_experts(c);
	size_t k = 0;

	for (uint32_t l = 0; l < layers; l++)
		for (uint32_t e = 0; e < experts; e++)
			all[k++] = mp_consolidation_distance(c, l, e);
	rep->summed = stats_of(all, k);
	k = 0;
	for (uint32_t l = 0; l < layers; l++)
		for (uint32_t e = 0; e < experts; e++)
			for (uint32_t i = 0; i < n; i++)
				for (uint32_t j = i + 1; j < n; j++)
					all[k++] = mp_consolidation_pair_distance(c, i, j, l, e);
	rep->same = stats_of(all, k);
}

/* Fills rep from the map, and cross-position samples from models when they are open. */
static int make_report(const struct mp_consolidation *c, struct mp_store **models,
		       struct report *rep)
{
	uint32_t n = mp_consolidation_models(c), layers = mp_consolidation_layers(c);
	uint32_t experts = mp_consolidation_experts(c), pairs = n * (n - 1) / 2;
	size_t cross = (size_t)experts * (experts - 1), n_cross = 0;
	/* per pair and layer, all[] holds its cross samples or its experts' distances */
	size_t per_layer = env.cross < cross ? env.cross : cross;
	size_t len = (size_t)(pairs ? pairs : 1) * layers * (per_layer > experts ? per_layer : experts);
	double *same = malloc(((size_t)pairs + 1) * experts * sizeof(*same));
	double *all = malloc((len + 1) * sizeof(*all));
	int err = 0;

	rep->layer = calloc(layers, sizeof(*rep->layer));
	if (!same || !all || !rep->layer) {
		err = -ENOMEM;
		goto free_buffers;
	}
	for (uint32_t l = 0; l < layers && !err; l++) {
		layer_owners_and_same(c, l, &rep->layer[l], same);
		if (models && env.cross && pairs)
			err = layer_cross(models, n, l, &rep->layer[l], all, &n_cross);
	}
	rep->cross = stats_of(all, n_cross);
	overall_distances(c, all, rep);
free_buffers:
	free(same);
	free(all);
	return err;
}

static json_t *stats_json(const struct stats *s)
{
	if (!s->n)
		return json_null();
	return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)s->n, "min", s->min,
			 "p10", s->p10, "median", s->median, "p90", s->p90, "max", s->max);
}

static json_t *distance_json(const struct stats *summed, const struct stats *same,
			     const struct stats *cross)
{
	json_t *o = json_pack("{s:o, s:o, s:o}", "summed", stats_json(summed), "same",
			      stats_json(same), "cross", stats_json(cross));

	if (o && same->n && cross->n && same->median > 0)
		json_object_set_new(o, "cross_over_same", json_real(cross->median / same->median));
	return o;
}

static json_t *models_json(const struct mp_consolidation *c, struct mp_store **models)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; arr && i < mp_consolidation_models(c); i++) {
		char id[17];

		snprintf(id, sizeof(id), "%016" PRIx64, mp_consolidation_model_identity(c, i));
		json_array_append_new(arr, json_pack("{s:I, s:s, s:s, s:s, s:I}", "index",
			(json_int_t)i, "file", models ? mp_store_path(models[i]) :
			mp_consolidation_model_file(c, i), "name", mp_consolidation_model_name(c, i),
			"identity", id, "owned", (json_int_t)mp_consolidation_owned(c, i)));
	}
	return arr;
}

static json_t *layers_json(const struct mp_consolidation *c, const struct report *rep)
{
	json_t *arr = json_array();

	for (uint32_t l = 0; arr && l < mp_consolidation_layers(c); l++) {
		const struct layer_report *r = &rep->layer[l];
		json_t *owned = json_array();

		for (uint32_t i = 0; owned && i < mp_consolidation_models(c); i++)
			json_array_append_new(owned, json_integer(r->owned[i]));
		json_array_append_new(arr, json_pack("{s:I, s:o, s:I, s:o}", "layer", (json_int_t)l,
			"owned", owned ? owned : json_null(), "unowned", (json_int_t)r->unowned,
			"distance", distance_json(&r->summed, &r->same, &r->cross)));
	}
	return arr;
}

static json_t *positions_json(const struct mp_consolidation *c)
{
	json_t *arr = json_array();

	for (uint32_t l = 0; arr && l < mp_consolidation_layers(c); l++)
		for (uint32_t e = 0; e < mp_consolidation_experts(c); e++)
			json_array_append_new(arr, json_pack("{s:I, s:I, s:I, s:i, s:f}",
				"layer", (json_int_t)l, "expert", (json_int_t)e,
				"rank", (json_int_t)mp_consolidation_rank(c, l, e),
				"owner", mp_consolidation_owner(c, l, e),
				"distance", mp_consolidation_distance(c, l, e)));
	return arr;
}

static void print_json(const char *map, const struct mp_consolidation *c,
		       struct mp_store **models, const struct report *rep)
{
	uint32_t n = mp_consolidation_models(c);
	json_t *root = json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}",
		"map", map, "models", models_json(c, models),
		"layers", (json_int_t)mp_consolidation_layers(c),
		"experts", (json_int_t)mp_consolidation_experts(c),
		"positions", (json_int_t)mp_consolidation_layers(c) * mp_consolidation_experts(c),
		"capacity", (json_int_t)mp_consolidation_capacity(c),
		"pairs", (json_int_t)n * (n - 1) / 2,
		"distance", distance_json(&rep->summed, &rep->same, &rep->cross),
		"per_layer", layers_json(c, rep), "positions_by_index", positions_json(c));

	if (root && rep->seconds > 0)
		json_object_set_new(root, "seconds", json_real(rep->seconds));
	if (root && !json_dumpf(root, stdout, JSON_INDENT(2)))
		putchar('\n');
	json_decref(root);
}

static void print_stats(const struct stats *s)
{
	if (s->n)
		printf("  %9.4g %9.4g %9.4g", s->p10, s->median, s->p90);
	else
		printf("  %9s %9s %9s", "-", "-", "-");
}

static void print_text(const char *map, const struct mp_consolidation *c,
		       const struct report *rep)
{
	uint32_t n = mp_consolidation_models(c), l_n = mp_consolidation_layers(c);
	uint32_t e_n = mp_consolidation_experts(c);

	printf("%s: %u models, %u layers x %u experts = %u positions, capacity %u, %u pairs\n",
	       map, n, l_n, e_n, l_n * e_n, mp_consolidation_capacity(c), n * (n - 1) / 2);
	for (uint32_t i = 0; i < n; i++)
		printf("  model %u: '%s' (%s, identity %016" PRIx64 ") owns %u\n", i,
		       mp_consolidation_model_name(c, i), mp_consolidation_model_file(c, i),
		       mp_consolidation_model_identity(c, i), mp_consolidation_owned(c, i));
	printf("layer  none  owned per model | same position p10/median/p90 | cross position "
	       "p10/median/p90\n");
	for (uint32_t l = 0; l < l_n; l++) {
		printf("%5u  %4u ", l, rep->layer[l].unowned);
		for (uint32_t i = 0; i < n; i++)
			printf(" %u", rep->layer[l].owned[i]);
		print_stats(&rep->layer[l].same);
		print_stats(&rep->layer[l].cross);
		printf("\n");
	}
	printf("all:        ");
	print_stats(&rep->same);
	print_stats(&rep->cross);
	if (rep->same.n && rep->cross.n && rep->same.median > 0)
		printf("   cross/same median %.1fx", rep->cross.median / rep->same.median);
	printf("\n");
}

static int fail(const char *what, int err)
{
	return cli_fail(err, "%s", what);
}

static void close_models(struct mp_store **models)
{
	for (uint32_t i = 0; i < env.n; i++) {
		mp_store_close(models[i]);
		models[i] = NULL;
	}
}

static int open_models(struct mp_store **models)
{
	for (uint32_t i = 0; i < env.n; i++) {
		int err = mp_store_open(env.paths[i], &models[i]);

		if (err) {
			close_models(models);
			return fail(env.paths[i], err);
		}
	}
	return 0;
}

static void show_progress(uint64_t done, uint64_t total, void *arg)
{
	(void)arg;
	cli_progress("distances", done, total);
}

static int report(const char *map, const struct mp_consolidation *c, struct mp_store **models,
		  double seconds)
{
	struct report rep = { .seconds = seconds };
	int err = make_report(c, models, &rep);

	if (err)
		fail(map, err);
	else if (env.json)
		print_json(map, c, models, &rep);
	else
		print_text(map, c, &rep);
	free(rep.layer);
	return err;
}

static int do_build(void)
{
	struct mp_store *models[MP_CONSOL_MAX_MODELS] = { 0 };
	struct mp_consolidation *c = NULL;
	const struct mp_geometry *g;
	uint64_t t0 = cli_now_ns();
	uint32_t capacity;
	int err = open_models(models);

	if (err)
		return err;
	g = mp_store_geometry(models[0]);
	err = parse_capacity(env.capacity, g->layers * g->experts, mp_store_expert_bytes(models[0]),
			     &capacity);
	if (err)
		goto close_models;
	err = mp_consolidation_build(models, env.n, capacity,
				     cli_progress_enabled() ? show_progress : NULL, NULL, &c);
	cli_progress_end();
	if (!err)
		err = mp_consolidation_write(c, env.out);
	if (err) {
		fail(env.out, err);
		goto close_models;
	}
	err = report(env.out, c, models, (double)(cli_now_ns() - t0) / 1e9);
	mp_consolidation_close(c);
close_models:
	close_models(models);
	return err;
}

static int do_info(void)
{
	struct mp_store *models[MP_CONSOL_MAX_MODELS] = { 0 };
	struct mp_consolidation *c = NULL;
	int err = mp_consolidation_open(env.info, &c);

	if (err)
		return fail(env.info, err);
	if (env.n) {
		err = open_models(models);
		if (!err)
			err = mp_consolidation_check(c, models, env.n);
		if (err == -EMEDIUMTYPE)
			fail(env.info, err);
	}
	if (!err) {
		/* cross-position distances read experts: only when building */
		env.cross = 0;
		err = report(env.info, c, env.n ? models : NULL, 0);
	}
	if (!err && env.n && !env.json)
		printf("the map was made for these %u models, in this order\n", env.n);
	close_models(models);
	mp_consolidation_close(c);
	return err;
}

int cmd_consolidate(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "A.mpk B.mpk ...", doc, NULL, NULL,
					  NULL };
	int err;

	memset(&env, 0, sizeof(env));
	env.cross = 32;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return -err;
	return env.info ? do_info() : do_build();
}
