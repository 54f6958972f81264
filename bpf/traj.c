// SPDX-License-Identifier: MIT
/* Loader of the trajectory programs: open, configure, load, attach by pid, pin, poll, detach. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <moepager/traj.h>

#include "traj/bpf_source.h"
#include "bpf/target_ranges.h"
#include "bpf/traj.h"
#include "traj.skel.h"
#include "pgfault.skel.h"

#define BPFFS_ROOT		"/sys/fs/bpf"
#define BPFFS_MAGIC		0xcafe4a11
#define PIN_PARENT		BPFFS_ROOT "/moepager"

/* The ring record is handed out as the public record: one layout. */
_Static_assert(sizeof(struct traj_event) == sizeof(struct mp_traj_rec), "record size");
_Static_assert(offsetof(struct traj_event, ids) == offsetof(struct mp_traj_rec, ids), "ids");
_Static_assert(offsetof(struct traj_event, flags) == offsetof(struct mp_traj_rec, flags), "flags");
_Static_assert(offsetof(struct traj_event, value) == offsetof(struct mp_traj_rec, value), "value");
_Static_assert(offsetof(struct traj_event, err) == offsetof(struct mp_traj_rec, err), "err");
_Static_assert(TRAJ_EVENT_HDR_BYTES == offsetof(struct traj_event, ids), "header bytes");
_Static_assert(TRAJ_MAX_K == MP_TRAJ_MAX_K && TRAJ_MAX_K == MP_MAX_TOPK, "max k");
_Static_assert(TRAJ_HIST_SLOTS == MP_TRAJ_HIST_SLOTS, "histogram slots");
_Static_assert(TRAJ_NONE == MP_TRAJ_NONE, "none");
_Static_assert((int)TRAJ_ROUTE == (int)MP_TRAJ_ROUTE && (int)TRAJ_PREFILL == (int)MP_TRAJ_PREFILL,
	       "kinds");
_Static_assert(TRAJ_F_WEIGHTS == MP_TRAJ_F_WEIGHTS, "flags");

/* The probes attached, in the order of docs/probes.md; the region ones only with pager_ranges. */
static const char *const probe_names[] = {
	"route", "prefill", "fault_begin", "fault_done", "prefetch_issue", "prefetch_done", "evict",
	"region", "region_close",
};
#define FIRST_REGION_PROBE	7u
/* Rounds of reading the target's range list before giving up on it changing under us. */
#define SYNC_ROUNDS		50

struct bpf_feed {
	struct traj_bpf *skel;
	struct pgfault_bpf *pf;		/* NULL without a range */
	struct ring_buffer *rb;
	int pid;
	enum mp_log_level fail_level;
	struct mp_traj_range range;
	uint32_t attached;
	bool pin, keep_pins, pinned;
	bool pager_ranges;		/* attribute the ranges the target's pagers publish */
	bool region_probes;		/* region/region_close attached: later opens are seen */
	uint32_t listed;		/* ranges read from the target's list at start */
	char binary[PATH_MAX];
	char pin_dir[PATH_MAX];
	/* Context of the poll in progress. */
	mp_traj_fn fn;
	void *fn_arg;
	int fn_ret;
	int handled;
	struct mp_traj_rec rec;
};

/* Logs at the feed's failure level (a warning when the caller falls back) and returns err. */
static int __mp_printf(3, 4) fail(const struct bpf_feed *b, int err, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (b->fail_level == MP_LOG_ERROR)
		return mp_err(err, "%s", line);
	mp_log(b->fail_level, "%s", line);
	return err;
}

/* libbpf's lines go to the debug log: our own message names the failure. */
static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char line[8192];	/* a verifier log arrives as one line */
	size_t n;

	if (level == LIBBPF_DEBUG)
		return 0;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = 0;
	mp_debug("%s", line);	/* libbpf's lines start with "libbpf: " */
	return 0;
}

static const char *perm_hint(int err)
{
	return err == -EPERM ? " (needs root, or CAP_BPF and CAP_PERFMON)" : "";
}

/* A load error: EPERM is a missing privilege, EACCES/EINVAL the verifier saying no. */
static const char *load_hint(int err)
{
	if (err == -EACCES || err == -EINVAL)
		return " (rejected by the verifier: MOEPAGER_DEBUG=1 shows its log)";
	return perm_hint(err);
}

/*
 * The file holding the probes, as the target maps it: its libmoepager.so,
 * else its executable (the probes were linked in statically).
 */
static int find_binary(struct bpf_feed *b)
{
	char path[64], line[PATH_MAX + 256];
	ssize_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", b->pid);
	f = fopen(path, "re");
	if (!f)
		return fail(b, -errno, "cannot read %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		char *file = strchr(line, '/');
		char *base;

		if (!file)
			continue;
		file[strcspn(file, "\n")] = 0;
		base = strrchr(file, '/') + 1;
		if (!strncmp(base, "libmoepager.so", 14) && !strstr(file, " (deleted)")) {
			snprintf(b->binary, sizeof(b->binary), "%s", file);
			fclose(f);
			return 0;
		}
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/exe", b->pid);
	n = readlink(path, b->binary, sizeof(b->binary) - 1);
	if (n < 0)
		return fail(b, -errno, "cannot resolve %s: %s", path, strerror(errno));
	b->binary[n] = 0;
	/* A replaced executable is still reachable through the link itself. */
	if (strstr(b->binary, " (deleted)"))
		snprintf(b->binary, sizeof(b->binary), "%s", path);
	return 0;
}

static int handle_event(void *ctx, void *data, size_t size)
{
	struct bpf_feed *b = ctx;
	int ret;

	if (size < TRAJ_EVENT_HDR_BYTES || size > sizeof(b->rec))
		return 0;
	memcpy(&b->rec, data, size);
	if (size < sizeof(b->rec))
		memset((char *)&b->rec + size, 0, sizeof(b->rec) - size);
	b->handled++;
	ret = b->fn ? b->fn(&b->rec, b->fn_arg) : 0;
	if (ret) {
		b->fn_ret = ret;
		return -ECANCELED;	/* stops ring_buffer__poll(); fn's value is returned */
	}
	return 0;
}

static int load_pgfault(struct bpf_feed *b)
{
	struct pgfault_bpf *pf;
	int err;

	pf = pgfault_bpf__open();
	if (!pf)
		return fail(b, -errno, "opening the page-fault program failed: %s",
			    strerror(errno));
	b->pf = pf;
	pf->rodata->targ_tgid = (__u32)b->pid;
	/* One ring, one set of counts and ranges: share traj's maps. */
	err = bpf_map__reuse_fd(pf->maps.events, bpf_map__fd(b->skel->maps.events));
	if (!err)
		err = bpf_map__reuse_fd(pf->maps.regions, bpf_map__fd(b->skel->maps.regions));
	if (!err)
		err = bpf_map__reuse_fd(pf->maps.expert_stats,
					bpf_map__fd(b->skel->maps.expert_stats));
	if (!err)
		err = bpf_map__reuse_fd(pf->maps.transitions,
					bpf_map__fd(b->skel->maps.transitions));
	if (err)
		return fail(b, err, "sharing maps with the page-fault program failed: %s",
			    strerror(-err));
	err = pgfault_bpf__load(pf);
	if (err)
		return fail(b, err, "loading the page-fault program (tp_btf/page_fault_user) "
			    "failed: %s%s", strerror(-err), load_hint(err));
	if (b->range.slot_bytes) {
		__u64 id = TRAJ_REGION_EXPLICIT;
		struct traj_region r = {
			.base = b->range.base, .slot_bytes = b->range.slot_bytes,
			.slots_per_layer = b->range.slots_per_layer, .layers = b->range.layers,
		};

		err = bpf_map_update_elem(bpf_map__fd(b->skel->maps.regions), &id, &r, BPF_ANY);
		if (err)
			return fail(b, -errno, "setting the expert range failed: %s",
				    strerror(errno));
	}
	return 0;
}

/* Adds ranges[0..n) not yet known (the region probe may have been first); notes what it added. */
static void add_ranges(struct bpf_feed *b, const struct target_range *ranges, uint32_t n,
		       uint64_t *added, uint32_t *nadded)
{
	int fd = bpf_map__fd(b->skel->maps.regions);

	for (uint32_t i = 0; i < n; i++) {
		const struct target_range *t = &ranges[i];
		struct traj_region r = {
			.base = t->base, .slot_bytes = t->slot_bytes,
			.slots_per_layer = t->slots_per_layer, .layers = t->layers,
			.experts = t->experts,
		};
		bool seen = false;

		if (t->id == TRAJ_REGION_EXPLICIT || !t->slot_bytes || !t->slots_per_layer ||
		    !t->layers)
			continue;
		if (bpf_map_update_elem(fd, &t->id, &r, BPF_NOEXIST)) {
			if (errno != EEXIST)
				mp_warn("pid %d: expert range %llu at 0x%llx not attributed: %s",
					b->pid, (unsigned long long)t->id,
					(unsigned long long)t->base, strerror(errno));
			continue;
		}
		for (uint32_t j = 0; j < *nadded; j++)
			seen |= added[j] == t->id;
		if (!seen && *nadded < TRAJ_MAX_REGIONS)
			added[(*nadded)++] = t->id;
	}
}

/* Removes the ranges this loader added that ranges[0..n) no longer lists (closed meanwhile). */
static void drop_closed(struct bpf_feed *b, const struct target_range *ranges, uint32_t n,
			uint64_t *added, uint32_t *nadded)
{
	int fd = bpf_map__fd(b->skel->maps.regions);

	for (uint32_t j = 0; j < *nadded;) {
		bool open = false;

		for (uint32_t i = 0; i < n; i++)
			open |= ranges[i].id == added[j];
		if (open) {
			j++;
			continue;
		}
		/* Ids are never reused: deleting a closed one never removes a live range. */
		bpf_map_delete_elem(fd, &added[j]);
		added[j] = added[--*nadded];
	}
}

/*
 * The ranges the target's pagers opened before the region probes were
 * attached come from its list. A range that closes while this runs may be
 * added after its region_close removed it: the list's generation moves
 * (the pager fires the probe inside its write section), so read again and
 * drop it, until a round sees the generation unchanged.
 */
static int sync_ranges(struct bpf_feed *b)
{
	struct target_range ranges[TRAJ_MAX_REGIONS];
	uint64_t addr, gen, now, added[TRAJ_MAX_REGIONS];
	uint32_t nadded = 0;
	int n = 0, err;

	err = target_ranges_locate(b->pid, b->binary, &addr);
	if (err)
		return err;
	for (int round = 0; round < SYNC_ROUNDS; round++) {
		n = target_ranges_read(b->pid, addr, ranges, TRAJ_MAX_REGIONS, &gen);
		if (n < 0)
			return n;
		if (n > TRAJ_MAX_REGIONS) {
			mp_warn("pid %d has %d expert ranges open: page faults are attributed in "
				"%u of them", b->pid, n, TRAJ_MAX_REGIONS);
			n = TRAJ_MAX_REGIONS;
		}
		drop_closed(b, ranges, (uint32_t)n, added, &nadded);
		add_ranges(b, ranges, (uint32_t)n, added, &nadded);
		err = target_ranges_gen(b->pid, addr, &now);
		if (err)
			return err;
		if (now != gen)
			continue;
		b->listed = (uint32_t)n;
		for (int i = 0; i < n; i++)
			mp_debug("pid %d: expert range %llu at 0x%llx, %u layers x %u slots of "
				 "%llu bytes", b->pid, (unsigned long long)ranges[i].id,
				 (unsigned long long)ranges[i].base, ranges[i].layers,
				 ranges[i].slots_per_layer, (unsigned long long)ranges[i].slot_bytes);
		return 0;
	}
	return mp_err(-EAGAIN, "the expert ranges of pid %d kept changing (%d rounds)", b->pid,
		      SYNC_ROUNDS);
}

int bpf_feed_open(const struct mp_traj_opts *opts, enum mp_log_level fail_level,
		  struct bpf_feed **out)
{
	libbpf_print_fn_t old_print = libbpf_set_print(libbpf_print);
	struct bpf_feed *b;
	int err;

	b = calloc(1, sizeof(*b));
	if (!b) {
		err = mp_err(-ENOMEM, "trajectory feed: out of memory");
		goto out_print;
	}
	b->pid = opts->pid;
	b->fail_level = fail_level;
	b->range = opts->range;
	b->pin = opts->pin;
	b->keep_pins = opts->keep_pins;
	b->pager_ranges = opts->pager_ranges;
	if (kill(b->pid, 0) && errno == ESRCH) {
		err = fail(b, -ESRCH, "no process %d to record", b->pid);
		goto err_free;
	}
	if (opts->binary)
		snprintf(b->binary, sizeof(b->binary), "%s", opts->binary);
	else if ((err = find_binary(b)))
		goto err_free;
	if (access(b->binary, R_OK)) {
		err = fail(b, -errno, "probe binary %s: %s", b->binary, strerror(errno));
		goto err_free;
	}
	if (b->pin)
		snprintf(b->pin_dir, sizeof(b->pin_dir), "%s",
			 opts->pin_dir ? opts->pin_dir : "");
	if (b->pin && !b->pin_dir[0])
		snprintf(b->pin_dir, sizeof(b->pin_dir), PIN_PARENT "/%d", b->pid);

	b->skel = traj_bpf__open();
	if (!b->skel) {
		err = -errno;
		err = fail(b, err, "opening the trajectory programs failed: %s", strerror(-err));
		goto err_free;
	}
	err = bpf_map__set_max_entries(b->skel->maps.events, opts->ring_bytes);
	if (err) {
		err = fail(b, err, "ring buffer of %u bytes: %s", opts->ring_bytes, strerror(-err));
		goto err_destroy;
	}
	err = traj_bpf__load(b->skel);
	if (err) {
		err = fail(b, err, "loading the trajectory programs failed: %s%s", strerror(-err),
			   load_hint(err));
		goto err_destroy;
	}
	if ((b->range.slot_bytes || b->pager_ranges) && (err = load_pgfault(b)))
		goto err_destroy;

	b->rb = ring_buffer__new(bpf_map__fd(b->skel->maps.events), handle_event, b, NULL);
	if (!b->rb) {
		err = -errno;
		err = fail(b, err, "creating the ring buffer reader failed: %s", strerror(-err));
		goto err_destroy;
	}
	*out = b;
	err = 0;
	goto out_print;

err_destroy:
	pgfault_bpf__destroy(b->pf);
	traj_bpf__destroy(b->skel);
err_free:
	free(b);
out_print:
	libbpf_set_print(old_print);
	return err;
}

static bool is_bpffs(const char *path)
{
	struct statfs st;

	return !statfs(path, &st) && (unsigned long)st.f_type == BPFFS_MAGIC;
}

/* Mounts bpffs on /sys/fs/bpf when nothing is mounted there (it is not at boot here). */
static int ensure_bpffs(struct bpf_feed *b)
{
	if (strncmp(b->pin_dir, BPFFS_ROOT "/", sizeof(BPFFS_ROOT)) || is_bpffs(BPFFS_ROOT))
		return 0;
	if (mount("bpf", BPFFS_ROOT, "bpf", 0, "mode=0700")) {
		int err = -errno;

		return fail(b, err, "mounting bpffs on " BPFFS_ROOT " failed: %s%s",
			    strerror(-err), perm_hint(err));
	}
	mp_info("mounted bpffs on " BPFFS_ROOT " (it was not mounted)");
	return 0;
}

static int make_dir(struct bpf_feed *b, const char *dir)
{
	if (mkdir(dir, 0700) && errno != EEXIST)
		return fail(b, -errno, "creating pin directory %s failed: %s", dir,
			    strerror(errno));
	return 0;
}

static bool dir_is_empty(const char *dir)
{
	struct dirent *de;
	bool empty = true;
	DIR *d = opendir(dir);

	if (!d)
		return true;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			empty = false;
			break;
		}
	closedir(d);
	return empty;
}

static struct bpf_map *pinned_maps(const struct bpf_feed *b, size_t i)
{
	struct bpf_map *maps[] = {
		b->skel->maps.expert_stats, b->skel->maps.transitions, b->skel->maps.fault_latency,
	};

	return i < MP_ARRAY_SIZE(maps) ? maps[i] : NULL;
}

static void unpin_maps(struct bpf_feed *b)
{
	char path[PATH_MAX + 64];
	struct bpf_map *m;

	for (size_t i = 0; (m = pinned_maps(b, i)); i++) {
		snprintf(path, sizeof(path), "%s/%s", b->pin_dir, bpf_map__name(m));
		if (unlink(path) && errno != ENOENT)
			mp_warn("removing pin %s failed: %s", path, strerror(errno));
	}
	if (rmdir(b->pin_dir) && errno != ENOENT)
		mp_warn("removing pin directory %s failed: %s", b->pin_dir, strerror(errno));
	/* The shared parent goes when the last recorder leaves it. */
	if (!strncmp(b->pin_dir, PIN_PARENT "/", sizeof(PIN_PARENT)))
		rmdir(PIN_PARENT);
	b->pinned = false;
}

static int pin_maps(struct bpf_feed *b)
{
	char path[PATH_MAX + 64];
	struct bpf_map *m;
	int err;

	err = ensure_bpffs(b);
	if (!err && !strncmp(b->pin_dir, PIN_PARENT "/", sizeof(PIN_PARENT)))
		err = make_dir(b, PIN_PARENT);
	if (!err)
		err = make_dir(b, b->pin_dir);
	if (err)
		return err;
	if (!dir_is_empty(b->pin_dir))
		return fail(b, -EEXIST, "pin directory %s is in use (another recorder of pid %d, "
			    "or pins kept by --keep: remove it)", b->pin_dir, b->pid);
	b->pinned = true;
	for (size_t i = 0; (m = pinned_maps(b, i)); i++) {
		snprintf(path, sizeof(path), "%s/%s", b->pin_dir, bpf_map__name(m));
		err = bpf_map__pin(m, path);
		if (err) {
			err = fail(b, err, "pinning %s failed: %s", path, strerror(-err));
			unpin_maps(b);
			return err;
		}
	}
	return 0;
}

static struct bpf_link **probe_link(struct bpf_feed *b, size_t i, struct bpf_program **prog)
{
	struct traj_bpf *s = b->skel;
	struct {
		struct bpf_program *prog;
		struct bpf_link **link;
	} t[] = {
		{ s->progs.route, &s->links.route },
		{ s->progs.prefill, &s->links.prefill },
		{ s->progs.fault_begin, &s->links.fault_begin },
		{ s->progs.fault_done, &s->links.fault_done },
		{ s->progs.prefetch_issue, &s->links.prefetch_issue },
		{ s->progs.prefetch_done, &s->links.prefetch_done },
		{ s->progs.evict, &s->links.evict },
		{ s->progs.region, &s->links.region },
		{ s->progs.region_close, &s->links.region_close },
	};

	_Static_assert(MP_ARRAY_SIZE(t) == MP_ARRAY_SIZE(probe_names), "probe table");
	*prog = t[i].prog;
	return t[i].link;
}

int bpf_feed_start(struct bpf_feed *b)
{
	libbpf_print_fn_t old_print = libbpf_set_print(libbpf_print);
	struct bpf_program *prog;
	struct bpf_link **link;
	int err = 0;

	b->attached = 0;
	b->region_probes = false;
	for (size_t i = 0; i < MP_ARRAY_SIZE(probe_names); i++) {
		if (i >= FIRST_REGION_PROBE && !b->pager_ranges)
			break;
		link = probe_link(b, i, &prog);
		*link = bpf_program__attach_usdt(prog, b->pid, b->binary, "moepager",
						 probe_names[i], NULL);
		if (*link) {
			b->attached++;
			b->region_probes |= i == FIRST_REGION_PROBE;
			continue;
		}
		err = -errno;
		/* A binary may carry only some probes (a test program, an engine, no pager). */
		if (err == -ENOENT) {
			mp_debug("no probe moepager:%s in %s", probe_names[i], b->binary);
			continue;
		}
		err = fail(b, err, "attaching moepager:%s in %s (pid %d) failed: %s%s",
			   probe_names[i], b->binary, b->pid, strerror(-err), perm_hint(err));
		goto err_detach;
	}
	if (b->pager_ranges) {
		/* After the region probes: a range opened from now on is seen by them. */
		err = sync_ranges(b);
		if (err && err != -ENOENT)
			goto err_detach;
		if (!b->region_probes)
			mp_warn("no moepager:region probe in %s: page faults of expert ranges "
				"opened from now on are not attributed", b->binary);
	}
	if (b->pf) {
		err = pgfault_bpf__attach(b->pf);
		if (err) {
			err = fail(b, err, "attaching tp_btf/page_fault_user failed: %s%s",
				   strerror(-err), perm_hint(err));
			goto err_detach;
		}
	}
	if (!b->attached && !b->pf) {
		err = fail(b, -ENOENT, "no moepager probe in %s and no expert range given: "
			   "nothing to record for pid %d", b->binary, b->pid);
		goto err_detach;
	}
	if (b->pin && (err = pin_maps(b)))
		goto err_detach;
	if (b->pager_ranges)
		mp_info("trajectory feed: BPF, pid %d, %u probes in %s, page faults in its expert "
			"ranges (%u open now%s)%s%s", b->pid, b->attached, b->binary, b->listed,
			b->region_probes ? ", and those opened later" : "",
			b->pinned ? ", maps pinned in " : "", b->pinned ? b->pin_dir : "");
	else
		mp_info("trajectory feed: BPF, pid %d, %u probes in %s%s%s%s", b->pid,
			b->attached, b->binary, b->pf ? ", page faults in the expert range" : "",
			b->pinned ? ", maps pinned in " : "", b->pinned ? b->pin_dir : "");
	libbpf_set_print(old_print);
	return 0;

err_detach:
	traj_bpf__detach(b->skel);
	if (b->pf)
		pgfault_bpf__detach(b->pf);
	b->attached = 0;
	libbpf_set_print(old_print);
	return err;
}

int bpf_feed_poll(struct bpf_feed *b, int timeout_ms, mp_traj_fn fn, void *arg)
{
	int err;

	b->fn = fn;
	b->fn_arg = arg;
	b->fn_ret = 0;
	b->handled = 0;
	err = ring_buffer__poll(b->rb, timeout_ms);
	b->fn = NULL;
	if (b->fn_ret)
		return b->fn_ret;
	if (err < 0 && err != -EINTR)
		return mp_err(err, "reading the trajectory ring buffer failed: %s", strerror(-err));
	return err < 0 ? err : b->handled;
}

int bpf_feed_stop(struct bpf_feed *b)
{
	traj_bpf__detach(b->skel);
	if (b->pf)
		pgfault_bpf__detach(b->pf);
	b->attached = 0;
	if (b->pinned && !b->keep_pins)
		unpin_maps(b);
	return 0;
}

void bpf_feed_close(struct bpf_feed *b)
{
	if (!b)
		return;
	bpf_feed_stop(b);
	ring_buffer__free(b->rb);
	pgfault_bpf__destroy(b->pf);
	traj_bpf__destroy(b->skel);
	free(b);
}

void bpf_feed_stats(const struct bpf_feed *b, struct mp_traj_stats *st)
{
	const struct traj_counters *c = &b->skel->bss->counters;

	st->dropped = __atomic_load_n(&c->dropped, __ATOMIC_RELAXED);
	st->bad_args = __atomic_load_n(&c->bad_args, __ATOMIC_RELAXED);
	if (b->pf)
		st->dropped += __atomic_load_n(&b->pf->bss->counters.dropped, __ATOMIC_RELAXED);
	st->probes_attached = b->attached;
	st->pgfault_attached = b->pf && b->pf->links.page_fault_user;
}

const char *bpf_feed_pin_dir(const struct bpf_feed *b)
{
	return b->pinned ? b->pin_dir : NULL;
}

const char *bpf_feed_binary(const struct bpf_feed *b)
{
	return b->binary;
}

/* Walks a hash map: fn(key, value) per entry. Entries added during the walk may be missed. */
static int walk_map(struct bpf_map *m, void *key, void *next, void *val,
		    int (*fn)(const void *key, const void *val, void *arg), void *arg)
{
	int fd = bpf_map__fd(m), n = 0, err;
	void *prev = NULL;

	while (!bpf_map_get_next_key(fd, prev, next)) {
		memcpy(key, next, bpf_map__key_size(m));
		prev = key;
		if (bpf_map_lookup_elem(fd, key, val))
			continue;	/* deleted meanwhile */
		err = fn(key, val, arg);
		if (err)
			return err;
		n++;
	}
	if (errno != ENOENT)
		return mp_err(-errno, "reading map %s failed: %s", bpf_map__name(m),
			      strerror(errno));
	return n;
}

struct walk_ctx {
	int (*expert)(const struct mp_traj_expert_stats *s, void *arg);
	int (*trans)(const struct mp_traj_transition *tr, void *arg);
	int (*hist)(const struct mp_traj_hist *h, void *arg);
	void *arg;
};

static int expert_cb(const void *key, const void *val, void *arg)
{
	const struct traj_expert_key *k = key;
	const struct traj_expert_stats *v = val;
	struct walk_ctx *w = arg;
	struct mp_traj_expert_stats s = {
		.layer = k->layer, .expert = k->expert, .routed = v->routed,
		.page_faults = v->page_faults, .demand_faults = v->demand_faults,
		.prefetches = v->prefetches, .evictions = v->evictions,
	};

	return w->expert(&s, w->arg);
}

int bpf_feed_expert_stats(const struct bpf_feed *b,
			  int (*fn)(const struct mp_traj_expert_stats *s, void *arg), void *arg)
{
	struct traj_expert_key key, next;
	struct traj_expert_stats val;
	struct walk_ctx w = { .expert = fn, .arg = arg };

	return walk_map(b->skel->maps.expert_stats, &key, &next, &val, expert_cb, &w);
}

static int trans_cb(const void *key, const void *val, void *arg)
{
	const struct traj_trans_key *k = key;
	const struct traj_trans_count *v = val;
	struct walk_ctx *w = arg;
	struct mp_traj_transition t = {
		.layer = k->layer, .from = k->from, .to = k->to,
		.routed = v->routed, .faulted = v->faulted,
	};

	return w->trans(&t, w->arg);
}

int bpf_feed_transitions(const struct bpf_feed *b,
			 int (*fn)(const struct mp_traj_transition *tr, void *arg), void *arg)
{
	struct traj_trans_key key, next;
	struct traj_trans_count val;
	struct walk_ctx w = { .trans = fn, .arg = arg };

	return walk_map(b->skel->maps.transitions, &key, &next, &val, trans_cb, &w);
}

static int hist_cb(const void *key, const void *val, void *arg)
{
	const struct traj_hist_key *k = key;
	const struct traj_hist *v = val;
	struct walk_ctx *w = arg;
	struct mp_traj_hist h = { .tier = k->tier, .count = v->count, .sum_ns = v->sum_ns };

	memcpy(h.slots, v->slots, sizeof(h.slots));
	return w->hist(&h, w->arg);
}

int bpf_feed_fault_latency(const struct bpf_feed *b,
			   int (*fn)(const struct mp_traj_hist *h, void *arg), void *arg)
{
	struct traj_hist_key key, next;
	struct traj_hist val;
	struct walk_ctx w = { .hist = fn, .arg = arg };

	return walk_map(b->skel->maps.fault_latency, &key, &next, &val, hist_cb, &w);
}
