// SPDX-License-Identifier: MIT
/* The CoE manifest (coe.json): parsing, opening the container and trunks, checking them. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coe/coe_priv.h"

#define MANIFEST_FORMAT "moepager-coe"

/* The manifest's name in messages. */
struct parse {
	struct mp_coe *c;
	const char *what;
};

static char *path_join(const char *dir, const char *name)
{
	char *p;

	if (name[0] == '/' || !dir || !*dir)
		return strdup(name);
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

static int get_string(struct parse *ps, json_t *o, const char *key, const char *where,
		      const char **out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v) || !json_string_length(v) ||
	    strlen(json_string_value(v)) != json_string_length(v))
		return mp_err(-EINVAL, "%s: %s: \"%s\" must be a non-empty string", ps->what, where,
			      key);
	*out = json_string_value(v);
	return 0;
}

static int get_u64(struct parse *ps, json_t *o, const char *key, const char *where, bool need,
		   uint64_t *out)
{
	json_t *v = json_object_get(o, key);

	if (!v && !need)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return mp_err(-EINVAL, "%s: %s: \"%s\" must be a non-negative integer", ps->what,
			      where, key);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_prob(struct parse *ps, json_t *o, const char *key, const char *where, bool need,
		    double *out)
{
	json_t *v = json_object_get(o, key);

	if (!v && !need)
		return 0;
	if (!json_is_number(v) || !(json_number_value(v) >= 0) || json_number_value(v) > 1)
		return mp_err(-EINVAL, "%s: %s: \"%s\" must be a probability in [0, 1]", ps->what,
			      where, key);
	*out = json_number_value(v);
	return 0;
}

static int find_arch(const struct mp_coe *c, const char *name)
{
	for (uint32_t i = 0; i < c->n_archs; i++)
		if (!strcmp(c->archs[i].name, name))
			return (int)i;
	return -ENOENT;
}

int mp_coe_model_find(const struct mp_coe *c, const char *name)
{
	for (uint32_t i = 0; name && i < c->n_models; i++)
		if (!strcmp(c->models[i].name, name))
			return (int)i;
	return -ENOENT;
}

static int parse_archs(struct parse *ps, json_t *arr)
{
	struct mp_coe *c = ps->c;
	size_t n = json_array_size(arr);

	if (!json_is_array(arr) || !n || n > 64)
		return mp_err(-EINVAL, "%s: \"architectures\" must be an array of 1 to 64 entries",
			      ps->what);
	c->archs = calloc(n, sizeof(*c->archs));
	if (!c->archs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(arr, i);
		char where[48];
		const char *name, *trunk;
		int err;

		snprintf(where, sizeof(where), "architectures[%zu]", i);
		if (!json_is_object(o))
			return mp_err(-EINVAL, "%s: %s must be an object", ps->what, where);
		if ((err = get_string(ps, o, "name", where, &name)) ||
		    (err = get_string(ps, o, "trunk", where, &trunk)))
			return err;
		if (find_arch(c, name) >= 0)
			return mp_err(-EINVAL, "%s: %s: architecture \"%s\" named twice", ps->what,
				      where, name);
		c->archs[i].name = strdup(name);
		c->archs[i].trunk_path = path_join(c->dir, trunk);
		c->n_archs++;
		if (!c->archs[i].name || !c->archs[i].trunk_path)
			return -ENOMEM;
	}
	return 0;
}

static int parse_model(struct parse *ps, json_t *o, const char *where, struct coe_model *m)
{
	const char *name, *arch;
	uint64_t slot = UINT64_MAX;
	int err, a;

	if (!json_is_object(o))
		return mp_err(-EINVAL, "%s: %s must be an object", ps->what, where);
	if ((err = get_string(ps, o, "name", where, &name)) ||
	    (err = get_string(ps, o, "arch", where, &arch)) ||
	    (err = get_u64(ps, o, "slot", where, true, &slot)) ||
	    (err = get_u64(ps, o, "seed", where, false, &m->seed)) ||
	    (err = get_prob(ps, o, "p", where, false, &m->p_first)))
		return err;
	if (json_object_get(o, "pin") && !json_is_boolean(json_object_get(o, "pin")))
		return mp_err(-EINVAL, "%s: %s: \"pin\" must be true or false", ps->what, where);
	m->pinned = json_is_true(json_object_get(o, "pin"));
	if (mp_coe_model_find(ps->c, name) >= 0)
		return mp_err(-EINVAL, "%s: %s: model \"%s\" named twice", ps->what, where, name);
	a = find_arch(ps->c, arch);
	if (a < 0)
		return mp_err(-EINVAL, "%s: %s \"%s\": unknown architecture \"%s\"", ps->what,
			      where, name, arch);
	if (slot > UINT32_MAX)
		return mp_err(-EINVAL, "%s: %s \"%s\": slot %llu out of range", ps->what, where,
			      name, (unsigned long long)slot);
	m->arch = (uint32_t)a;
	m->first_slot = (uint32_t)slot;
	m->name = strdup(name);
	return m->name ? 0 : -ENOMEM;
}

static int parse_models(struct parse *ps, json_t *arr)
{
	struct mp_coe *c = ps->c;
	size_t n = json_array_size(arr);

	if (!json_is_array(arr) || !n || n > 65536)
		return mp_err(-EINVAL, "%s: \"models\" must be an array of 1 to 65536 entries",
			      ps->what);
	c->models = calloc(n, sizeof(*c->models));
	if (!c->models)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		char where[48];
		int err;

		snprintf(where, sizeof(where), "models[%zu]", i);
		err = parse_model(ps, json_array_get(arr, i), where, &c->models[i]);
		c->n_models += !err;
		if (err)
			return err;
	}
	return 0;
}

static int parse_edges(struct parse *ps, json_t *arr)
{
	struct mp_coe *c = ps->c;
	size_t n = json_array_size(arr);

	if (arr && !json_is_array(arr))
		return mp_err(-EINVAL, "%s: \"dependencies\" must be an array", ps->what);
	c->edges = calloc(n ? n : 1, sizeof(*c->edges));
	if (!c->edges)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(arr, i);
		const char *from, *to;
		char where[48];
		int f, t, err;

		snprintf(where, sizeof(where), "dependencies[%zu]", i);
		if (!json_is_object(o))
			return mp_err(-EINVAL, "%s: %s must be an object", ps->what, where);
		if ((err = get_string(ps, o, "preliminary", where, &from)) ||
		    (err = get_string(ps, o, "subsequent", where, &to)) ||
		    (err = get_prob(ps, o, "p", where, true, &c->edges[i].p)))
			return err;
		f = mp_coe_model_find(c, from);
		t = mp_coe_model_find(c, to);
		if (f < 0 || t < 0)
			return mp_err(-EINVAL, "%s: %s: unknown model \"%s\"", ps->what, where,
				      f < 0 ? from : to);
		if (!(c->edges[i].p > 0))
			return mp_err(-EINVAL, "%s: %s: %s -> %s: p must be in (0, 1]", ps->what,
				      where, from, to);
		c->edges[i].from = (uint32_t)f;
		c->edges[i].to = (uint32_t)t;
		c->n_edges++;
	}
	return 0;
}

static int parse_root(struct parse *ps, json_t *root)
{
	const char *fmt, *container;
	uint64_t version = 0;
	int err;

	if (!json_is_object(root))
		return mp_err(-EINVAL, "%s: the manifest must be a JSON object", ps->what);
	if ((err = get_string(ps, root, "format", "top level", &fmt)))
		return err;
	if (strcmp(fmt, MANIFEST_FORMAT))
		return mp_err(-EINVAL, "%s: format \"%s\", expected \"%s\"", ps->what, fmt,
			      MANIFEST_FORMAT);
	if ((err = get_u64(ps, root, "version", "top level", true, &version)))
		return err;
	if (version != 1)
		return mp_err(-EPROTONOSUPPORT, "%s: version %llu (this library reads 1)", ps->what,
			      (unsigned long long)version);
	if ((err = get_string(ps, root, "container", "top level", &container)))
		return err;
	ps->c->container_path = path_join(ps->c->dir, container);
	if (!ps->c->container_path)
		return -ENOMEM;
	if ((err = parse_archs(ps, json_object_get(root, "architectures"))) ||
	    (err = parse_models(ps, json_object_get(root, "models"))) ||
	    (err = parse_edges(ps, json_object_get(root, "dependencies"))))
		return err;
	return coe_graph_build(ps->c, ps->what);
}

/* Opens a store, naming the role it plays when it is missing. */
static int open_store(const char *what, const char *role, const char *path, struct mp_store **out)
{
	int err = mp_store_open(path, out);

	if (err == -ENOENT)
		return mp_err(-ENOENT, "%s: %s %s: no such file", what, role, path);
	if (err)
		return mp_err(err, "%s: %s %s: %s", what, role, path, mp_last_error());
	return 0;
}

static int cmp_first_slot(const void *a, const void *b, void *arg)
{
	const struct mp_coe *c = arg;
	uint32_t x = c->models[*(const uint32_t *)a].first_slot;
	uint32_t y = c->models[*(const uint32_t *)b].first_slot;

	return x < y ? -1 : x > y;
}

/* Every model's slots inside the container, none shared. */
static int check_slots(struct parse *ps)
{
	struct mp_coe *c = ps->c;
	const struct mp_geometry *cg = mp_store_geometry(c->container);
	uint64_t cap = (uint64_t)cg->layers * cg->experts;
	uint32_t *order = malloc(c->n_models * sizeof(*order));
	int err = 0;

	if (!order)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n_models; i++)
		order[i] = i;
	qsort_r(order, c->n_models, sizeof(*order), cmp_first_slot, c);
	for (uint32_t i = 0; i < c->n_models && !err; i++) {
		const struct coe_model *m = &c->models[order[i]];
		uint64_t end = (uint64_t)m->first_slot + c->archs[m->arch].slots;

		if (end > cap)
			err = mp_err(-EINVAL, "%s: model \"%s\": slots [%u, %llu) outside the "
				     "container's %llu experts", ps->what, m->name, m->first_slot,
				     (unsigned long long)end, (unsigned long long)cap);
		else if (i + 1 < c->n_models && end > c->models[order[i + 1]].first_slot)
			err = mp_err(-EINVAL, "%s: models \"%s\" and \"%s\" share container slot %u",
				     ps->what, m->name, c->models[order[i + 1]].name,
				     c->models[order[i + 1]].first_slot);
	}
	free(order);
	return err;
}

static int open_stores(struct parse *ps)
{
	struct mp_coe *c = ps->c;
	int err = open_store(ps->what, "container", c->container_path, &c->container);

	if (err)
		return err;
	c->c_experts = mp_store_geometry(c->container)->experts;
	c->slot_bytes = mp_store_expert_bytes(c->container);
	for (uint32_t i = 0; i < c->n_archs; i++) {
		struct coe_arch *a = &c->archs[i];

		err = open_store(ps->what, "trunk", a->trunk_path, &a->trunk);
		if (err)
			return err;
		if (mp_store_expert_bytes(a->trunk) != c->slot_bytes)
			return mp_err(-EINVAL, "%s: architecture \"%s\": experts of %llu bytes in %s, "
				      "the container's are %llu", ps->what, a->name,
				      (unsigned long long)mp_store_expert_bytes(a->trunk),
				      a->trunk_path, (unsigned long long)c->slot_bytes);
	}
	return 0;
}

static void fill_sizes(struct mp_coe *c)
{
	c->total_bytes = 0;
	for (uint32_t m = 0; m < c->n_models; m++)
		c->total_bytes += coe_model_bytes(c, m);
}

/* Parses a manifest; what names it in messages (its path, or "coe manifest"). */
static int parse_named(const char *what, const char *json, size_t len, const char *dir,
		       bool no_stores, struct mp_coe **out)
{
	struct parse ps = { .what = what };
	json_error_t jerr;
	json_t *root;
	int err;

	*out = NULL;
	ps.c = calloc(1, sizeof(*ps.c));
	if (!ps.c || !(ps.c->dir = strdup(dir ? dir : ".")))
		goto nomem;
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		err = mp_err(-EINVAL, "%s: line %d column %d: %s", ps.what, jerr.line,
			     jerr.column, jerr.text);
		goto close;
	}
	err = parse_root(&ps, root);
	json_decref(root);
	if (err)
		goto close;
	if (!no_stores) {
		err = open_stores(&ps);
		for (uint32_t i = 0; !err && i < ps.c->n_archs; i++) {
			struct coe_arch *a = &ps.c->archs[i];

			a->g = *mp_store_geometry(a->trunk);
			a->slots = a->g.layers * a->g.experts;
		}
		if (!err)
			err = check_slots(&ps);
		if (err)
			goto close;
	}
	fill_sizes(ps.c);
	*out = ps.c;
	return 0;
nomem:
	err = mp_err(-ENOMEM, "coe manifest: out of memory");
close:
	mp_coe_close(ps.c);
	return err;
}

int mp_coe_parse(const char *json, size_t len, const char *dir, bool no_stores,
		 struct mp_coe **out)
{
	return parse_named("coe manifest", json, len, dir, no_stores, out);
}

int mp_coe_open(const char *manifest, struct mp_coe **out)
{
	char *buf = NULL, *dir, *slash;
	size_t len;
	int err;

	if (!manifest || !out)
		return mp_err(-EINVAL, "coe open: NULL %s", !manifest ? "manifest" : "out");
	err = mp_read_file("coe manifest", manifest, &buf, &len);
	if (err)
		return err;
	dir = strdup(manifest);
	if (!dir) {
		free(buf);
		return -ENOMEM;
	}
	slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	err = parse_named(manifest, buf, len, slash ? dir : ".", false, out);
	free(dir);
	free(buf);
	return err;
}

void mp_coe_close(struct mp_coe *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < c->n_archs; i++) {
		mp_store_close(c->archs[i].trunk);
		free(c->archs[i].name);
		free(c->archs[i].trunk_path);
	}
	for (uint32_t i = 0; i < c->n_models; i++) {
		free(c->models[i].name);
		free(c->models[i].pre);
	}
	mp_store_close(c->container);
	free(c->archs);
	free(c->models);
	free(c->edges);
	free(c->container_path);
	free(c->dir);
	free(c);
}

/*
 * Accessors
 */

struct mp_store *mp_coe_container(const struct mp_coe *c)
{
	return c->container;
}

uint32_t mp_coe_arch_count(const struct mp_coe *c)
{
	return c->n_archs;
}

int mp_coe_arch(const struct mp_coe *c, uint32_t i, struct mp_coe_arch_info *out)
{
	if (i >= c->n_archs)
		return mp_err(-EINVAL, "coe: architecture %u out of range (%u)", i, c->n_archs);
	*out = (struct mp_coe_arch_info){ c->archs[i].name, c->archs[i].trunk_path,
					  &c->archs[i].g, c->archs[i].slots };
	return 0;
}

uint32_t mp_coe_model_count(const struct mp_coe *c)
{
	return c->n_models;
}

int mp_coe_model(const struct mp_coe *c, uint32_t i, struct mp_coe_model_info *out)
{
	const struct coe_model *m;

	if (i >= c->n_models)
		return mp_err(-EINVAL, "coe: model %u out of range (%u)", i, c->n_models);
	m = &c->models[i];
	*out = (struct mp_coe_model_info){
		.name = m->name, .arch = m->arch, .first_slot = m->first_slot,
		.bytes = coe_model_bytes(c, i), .seed = m->seed, .p_first = m->p_first,
		.usage = m->usage, .n_pre = m->n_pre, .n_next = m->n_next, .pinned = m->pinned,
	};
	return 0;
}

uint32_t mp_coe_edge_count(const struct mp_coe *c)
{
	return c->n_edges;
}

const struct mp_coe_edge *mp_coe_edges(const struct mp_coe *c)
{
	return c->edges;
}

uint64_t mp_coe_total_bytes(const struct mp_coe *c)
{
	return c->total_bytes;
}

int mp_coe_slot(const struct mp_coe *c, uint32_t model, uint32_t layer, uint32_t expert,
		uint32_t *c_layer, uint32_t *c_expert)
{
	const struct coe_arch *a;
	uint32_t flat;

	if (model >= c->n_models || !c->c_experts)
		return mp_err(-EINVAL, "coe: model %u out of range (%u)", model, c->n_models);
	a = &c->archs[c->models[model].arch];
	if (layer >= a->g.layers || expert >= a->g.experts)
		return mp_err(-EINVAL, "coe: model %s: layer %u expert %u out of range",
			      c->models[model].name, layer, expert);
	flat = c->models[model].first_slot + layer * a->g.experts + expert;
	*c_layer = flat / c->c_experts;
	*c_expert = flat % c->c_experts;
	return 0;
}
