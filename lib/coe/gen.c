// SPDX-License-Identifier: MIT
/*
 * The CoE generator: one classifier per component type (Zipf-distributed
 * frequencies), shared detectors after a clean classification, every
 * model's experts in one container .mpk and a trunk .mpk per architecture.
 * A model's experts are the bytes `moepager gen` writes for its geometry
 * and seed; an architecture's trunk is its first model, whole, whose dense
 * weights every model of the architecture runs with.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "coe/coe_priv.h"
#include "store/gen.h"

struct gen_model {
	char name[32];
	uint32_t arch;
	uint32_t first_slot;
	uint64_t seed;
	double p;
	int detector;		/* the detector model it leads to, -1: none */
};

struct gen {
	const struct mp_coe_gen_config *cfg;
	struct gen_model *models;
	uint32_t n_models;
	uint32_t slots;
	int det_model[64];	/* per arch: its detector model, -1 */
};

static int check_config(const struct mp_coe_gen_config *cfg)
{
	uint64_t bytes, shares = 0;
	uint32_t dets = 0;

	if (!cfg->n_archs || cfg->n_archs > 64 || !cfg->components)
		return mp_err(-EINVAL, "coe gen: need 1 to 64 architectures and components");
	bytes = mp_geometry_expert_bytes(&cfg->archs[0].g);
	for (uint32_t i = 0; i < cfg->n_archs; i++) {
		const struct mp_coe_gen_arch *a = &cfg->archs[i];

		if (mp_geometry_check(&a->g))
			return mp_err(-EINVAL, "coe gen: architecture %s: %s", a->name,
				      mp_last_error());
		if (mp_geometry_expert_bytes(&a->g) != bytes)
			return mp_err(-EINVAL, "coe gen: architecture %s: experts of %llu bytes, "
				      "%s's are %llu (one container holds one expert size)",
				      a->name, (unsigned long long)mp_geometry_expert_bytes(&a->g),
				      cfg->archs[0].name, (unsigned long long)bytes);
		dets += a->detector;
		shares += a->detector ? 0 : a->share;
	}
	if (!shares)
		return mp_err(-EINVAL, "coe gen: no classifier architecture has a share");
	if (!(cfg->zipf >= 0) || !(cfg->detector_share >= 0 && cfg->detector_share <= 1) ||
	    !(cfg->clean > 0 && cfg->clean <= 1) || (cfg->detector_share > 0 && !dets))
		return mp_err(-EINVAL, "coe gen: zipf >= 0, detector share in [0, 1] (with a "
			      "detector architecture) and clean in (0, 1] please");
	return 0;
}

/* Which classifier architecture component i has: by the shares, spread evenly. */
static uint32_t classifier_arch(const struct mp_coe_gen_config *cfg, uint32_t i)
{
	uint64_t total = 0, pos, acc = 0;

	for (uint32_t a = 0; a < cfg->n_archs; a++)
		total += cfg->archs[a].detector ? 0 : cfg->archs[a].share;
	pos = (uint64_t)i * total / cfg->components;
	for (uint32_t a = 0; a < cfg->n_archs; a++) {
		if (cfg->archs[a].detector)
			continue;
		acc += cfg->archs[a].share;
		if (pos < acc)
			return a;
	}
	return 0;
}

/* Models: classifiers (Zipf frequencies over a shuffled rank), then one detector per arch. */
static int plan(struct gen *gn)
{
	const struct mp_coe_gen_config *cfg = gn->cfg;
	uint32_t n = cfg->components, *rank;
	double norm = 0;

	gn->models = calloc(n + cfg->n_archs, sizeof(*gn->models));
	rank = malloc(n * sizeof(*rank));
	if (!gn->models || !rank) {
		free(rank);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		rank[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(coe_mix(cfg->seed, 0x5eed0000ull + i) % (i + 1)), t = rank[i];

		rank[i] = rank[j];
		rank[j] = t;
	}
	for (uint32_t i = 0; i < n; i++)
		norm += pow(rank[i] + 1, -cfg->zipf);
	for (uint32_t a = 0; a < cfg->n_archs; a++)
		gn->det_model[a] = -1;
	for (uint32_t i = 0; i < n; i++) {
		struct gen_model *m = &gn->models[gn->n_models++];

		snprintf(m->name, sizeof(m->name), "cls-%04u", i);
		m->arch = classifier_arch(cfg, i);
		m->p = pow(rank[i] + 1, -cfg->zipf) / norm;
		m->detector = -1;
	}
	free(rank);
	for (uint32_t a = 0; a < cfg->n_archs; a++) {
		struct gen_model *m;

		if (!cfg->archs[a].detector)
			continue;
		m = &gn->models[gn->n_models];
		snprintf(m->name, sizeof(m->name), "%s", cfg->archs[a].name);
		m->arch = a;
		m->detector = -1;
		gn->det_model[a] = (int)gn->n_models++;
	}
	return 0;
}

/* Which components have a detector, and which one; slots and seeds of every model. */
static void link_and_place(struct gen *gn)
{
	const struct mp_coe_gen_config *cfg = gn->cfg;
	uint32_t dets[64], nd = 0;

	for (uint32_t a = 0; a < cfg->n_archs; a++)
		if (gn->det_model[a] >= 0)
			dets[nd++] = (uint32_t)gn->det_model[a];
	for (uint32_t i = 0; i < cfg->components && nd; i++) {
		double u = (double)(coe_mix(cfg->seed, 0xde7ull << 32 | i) >> 11) * 0x1.0p-53;

		if (u < cfg->detector_share)
			gn->models[i].detector = (int)dets[coe_mix(cfg->seed, 0xa11ull << 32 | i) % nd];
	}
	for (uint32_t m = 0; m < gn->n_models; m++) {
		const struct mp_geometry *g = &cfg->archs[gn->models[m].arch].g;

		gn->models[m].first_slot = gn->slots;
		gn->models[m].seed = coe_mix(cfg->seed, 1000 + m) >> 1;	/* a JSON integer */
		gn->slots += g->layers * g->experts;
	}
}

static int write_manifest(const struct gen *gn, const char *dir)
{
	const struct mp_coe_gen_config *cfg = gn->cfg;
	json_t *root = json_object(), *archs = json_array(), *models = json_array();
	json_t *deps = json_array();
	char *path = NULL;
	int err = -ENOMEM;

	if (!root || !archs || !models || !deps)
		goto free_json;
	json_object_set_new(root, "format", json_string("moepager-coe"));
	json_object_set_new(root, "version", json_integer(1));
	json_object_set_new(root, "container", json_string("experts.mpk"));
	for (uint32_t a = 0; a < cfg->n_archs; a++) {
		char trunk[96];

		snprintf(trunk, sizeof(trunk), "trunk-%s.mpk", cfg->archs[a].name);
		json_array_append_new(archs, json_pack("{s:s, s:s}", "name", cfg->archs[a].name,
						       "trunk", trunk));
	}
	for (uint32_t m = 0; m < gn->n_models; m++) {
		const struct gen_model *x = &gn->models[m];

		json_array_append_new(models, json_pack("{s:s, s:s, s:I, s:I, s:f}", "name",
			x->name, "arch", cfg->archs[x->arch].name, "slot", (json_int_t)x->first_slot,
			"seed", (json_int_t)x->seed, "p", x->p));
		if (x->detector >= 0)
			json_array_append_new(deps, json_pack("{s:s, s:s, s:f}", "preliminary",
				x->name, "subsequent", gn->models[x->detector].name, "p", cfg->clean));
	}
	json_object_set_new(root, "architectures", archs);
	json_object_set_new(root, "models", models);
	json_object_set_new(root, "dependencies", deps);
	archs = models = deps = NULL;
	if (asprintf(&path, "%s/coe.json", dir) < 0) {
		path = NULL;
		goto free_json;
	}
	err = json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(17)) ?
	      mp_err(-EIO, "coe gen: cannot write %s", path) : 0;
free_json:
	json_decref(root);
	json_decref(archs);
	json_decref(models);
	json_decref(deps);
	free(path);
	return err;
}

/* The container's own geometry: a carrier of the experts (its dense tensors are never run). */
static struct mp_geometry container_geometry(const struct gen *gn)
{
	const struct mp_geometry *g0 = &gn->cfg->archs[0].g;
	uint32_t layers = (gn->slots + MP_MAX_EXPERTS - 1) / MP_MAX_EXPERTS;

	return (struct mp_geometry){
		.layers = layers, .experts = (gn->slots + layers - 1) / layers, .topk = 1,
		.hidden = g0->hidden, .ffn = g0->ffn, .heads = 1, .kv_heads = 1, .head_dim = 2,
		.vocab = 2, .max_seq = 2, .dtype = g0->dtype, .rope_theta = 10000.0f,
		.norm_eps = 1e-5f,
	};
}

struct progress {
	void (*fn)(uint64_t done, uint64_t total, void *arg);
	void *arg;
	uint64_t done, total;
};

static int put_models(const struct gen *gn, struct mp_store_writer *w,
		      const struct mp_geometry *cg, void *buf, struct progress *pr)
{
	uint64_t bytes = mp_geometry_expert_bytes(cg);

	for (uint32_t m = 0; m < gn->n_models; m++) {
		const struct gen_model *x = &gn->models[m];
		const struct mp_geometry *g = &gn->cfg->archs[x->arch].g;

		for (uint32_t s = 0; s < g->layers * g->experts; s++) {
			uint32_t flat = x->first_slot + s;
			int err;

			mpk_gen_expert(g, s / g->experts, s % g->experts, x->seed, buf);
			err = mp_store_writer_put_expert(w, flat / cg->experts, flat % cg->experts,
							 buf);
			if (err)
				return err;
			pr->done += bytes;
			if (pr->fn)
				pr->fn(pr->done, pr->total, pr->arg);
		}
	}
	/* Slots past the last model (the container's rectangle rounds up): zeros. */
	memset(buf, 0, bytes);
	for (uint32_t flat = gn->slots; flat < cg->layers * cg->experts; flat++) {
		int err = mp_store_writer_put_expert(w, flat / cg->experts, flat % cg->experts, buf);

		if (err)
			return err;
	}
	return 0;
}

static int write_container(const struct gen *gn, const char *path, struct progress *pr)
{
	struct mp_geometry cg = container_geometry(gn);
	struct mp_store_writer *w;
	void *buf = NULL;
	int err;

	err = mp_store_writer_create(path, &cg, "coe-container", &w);
	if (err)
		return err;
	if (posix_memalign(&buf, 4096, mp_geometry_expert_bytes(&cg))) {
		err = mp_err(-ENOMEM, "coe gen: out of memory");
		goto abort;
	}
	for (uint32_t i = 0; i < mp_store_writer_tensor_count(w); i++) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);
		void *tb = malloc(t->bytes);

		if (!tb) {
			err = mp_err(-ENOMEM, "coe gen: out of memory");
			goto abort;
		}
		mpk_gen_tensor(t, i, gn->cfg->seed, tb);
		err = mp_store_writer_put_tensor(w, t->name, tb);
		free(tb);
		if (err)
			goto abort;
	}
	err = put_models(gn, w, &cg, buf, pr);
	if (err)
		goto abort;
	free(buf);
	return mp_store_writer_finish(w);
abort:
	free(buf);
	mp_store_writer_abort(w);
	return err;
}

/* Each architecture's trunk: its first model, whole, as `moepager gen` writes it. */
static int write_trunks(const struct gen *gn, const char *dir)
{
	for (uint32_t a = 0; a < gn->cfg->n_archs; a++) {
		const struct gen_model *first = NULL;
		char path[4096];
		int err;

		for (uint32_t m = 0; m < gn->n_models && !first; m++)
			if (gn->models[m].arch == a)
				first = &gn->models[m];
		if (!first)
			return mp_err(-EINVAL, "coe gen: architecture %s has no model (too few "
				      "components for its share)", gn->cfg->archs[a].name);
		snprintf(path, sizeof(path), "%s/trunk-%s.mpk", dir, gn->cfg->archs[a].name);
		err = mp_gen_model(path, &gn->cfg->archs[a].g, first->seed, first->name, NULL, NULL);
		if (err)
			return err;
	}
	return 0;
}

int mp_coe_gen(const char *dir, const struct mp_coe_gen_config *cfg,
	       void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
	struct gen gn = { .cfg = cfg };
	struct progress pr = { progress, arg, 0, 0 };
	char path[4096];
	int err;

	if (!dir || !cfg)
		return mp_err(-EINVAL, "coe gen: NULL argument");
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "coe gen config");
	if (!err)
		err = check_config(cfg);
	if (err)
		return err;
	if (mkdir(dir, 0755) && errno != EEXIST)
		return mp_err(-errno, "coe gen: cannot create %s: %s", dir, strerror(errno));
	err = plan(&gn);
	if (err)
		goto free_models;
	link_and_place(&gn);
	pr.total = (uint64_t)gn.slots * mp_geometry_expert_bytes(&cfg->archs[0].g);
	err = write_trunks(&gn, dir);
	if (err)
		goto free_models;
	snprintf(path, sizeof(path), "%s/experts.mpk", dir);
	err = write_container(&gn, path, &pr);
	if (!err)
		err = write_manifest(&gn, dir);
free_models:
	free(gn.models);
	return err;
}
