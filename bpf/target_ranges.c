// SPDX-License-Identifier: MIT
/* Finds mp_pager_ranges in another process through ELF symbols and reads it from /proc/PID/mem. */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <inttypes.h>
#include <libelf.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>


#include "base/base.h"
#include "base/ranges.h"
#include "bpf/target_ranges.h"

#define SYMBOL		"mp_pager_ranges"
/* A walk longer than this is a list being rewritten under us (or not a list). */
#define MAX_WALK	4096u
#define READ_TRIES	200

struct elf_facts {
	uint64_t sym;		/* st_value of SYMBOL */
	uint64_t load_vaddr;	/* the lowest PT_LOAD: where the file's first mapping starts */
	uint64_t load_off;
};

static int find_symbol(Elf *e, uint64_t *value)
{
	/* .symtab first (a static link keeps the symbol there), then .dynsym. */
	for (int pass = 0; pass < 2; pass++) {
		Elf_Scn *scn = NULL;

		while ((scn = elf_nextscn(e, scn))) {
			GElf_Shdr sh;
			Elf_Data *d;

			if (!gelf_getshdr(scn, &sh) || !sh.sh_entsize ||
			    sh.sh_type != (pass ? SHT_DYNSYM : SHT_SYMTAB))
				continue;
			d = elf_getdata(scn, NULL);
			for (size_t i = 0; d && i < sh.sh_size / sh.sh_entsize; i++) {
				const char *name;
				GElf_Sym s;

				if (!gelf_getsym(d, (int)i, &s) || s.st_shndx == SHN_UNDEF ||
				    GELF_ST_TYPE(s.st_info) != STT_OBJECT)
					continue;
				name = elf_strptr(e, sh.sh_link, s.st_name);
				if (name && !strcmp(name, SYMBOL)) {
					*value = s.st_value;
					return 0;
				}
			}
		}
	}
	return -ENOENT;
}

static int read_elf(const char *path, struct elf_facts *f)
{
	bool have_load = false;
	size_t nph;
	Elf *e;
	int fd, err;

	if (elf_version(EV_CURRENT) == EV_NONE)
		return mp_err(-ENOSYS, "libelf: %s", elf_errmsg(-1));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return mp_err(-errno, "opening %s to find " SYMBOL ": %s", path, strerror(errno));
	e = elf_begin(fd, ELF_C_READ, NULL);
	if (!e || elf_kind(e) != ELF_K_ELF || elf_getphdrnum(e, &nph)) {
		err = mp_err(-ENOEXEC, "%s is not an ELF file: %s", path, elf_errmsg(-1));
		goto out_end;
	}
	for (size_t i = 0; i < nph; i++) {
		GElf_Phdr ph;

		if (!gelf_getphdr(e, (int)i, &ph) || ph.p_type != PT_LOAD)
			continue;
		if (!have_load || ph.p_vaddr < f->load_vaddr) {
			f->load_vaddr = ph.p_vaddr;
			f->load_off = ph.p_offset;
			have_load = true;
		}
	}
	err = have_load ? find_symbol(e, &f->sym) : -ENOEXEC;
	if (err == -ENOEXEC)
		err = mp_err(err, "%s has no loadable segment", path);
	else if (err)
		mp_debug("%s has no symbol " SYMBOL " (a libmoepager without the range list)",
			 path);
out_end:
	elf_end(e);
	close(fd);
	return err;
}

/* The start of binary's mapping at file offset off in pid, matched by path or device+inode. */
static int find_mapping(int pid, const char *binary, uint64_t off, uint64_t *start)
{
	char maps[64], line[PATH_MAX + 256];
	struct stat st;
	FILE *f;

	if (stat(binary, &st))
		return mp_err(-errno, "%s: %s", binary, strerror(errno));
	snprintf(maps, sizeof(maps), "/proc/%d/maps", pid);
	f = fopen(maps, "re");
	if (!f)
		return mp_err(-errno, "cannot read %s: %s", maps, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		unsigned long long lo, hi, moff, ino;
		unsigned int maj, mnr;
		char *path;
		int n = 0;

		if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu %n", &lo, &hi, &moff, &maj, &mnr,
			   &ino, &n) < 6 || moff != off)
			continue;
		path = line + n;
		path[strcspn(path, "\n")] = 0;
		if (!strcmp(path, binary) || (ino == st.st_ino && maj == major(st.st_dev) &&
					      mnr == minor(st.st_dev))) {
			*start = lo;
			fclose(f);
			return 0;
		}
	}
	fclose(f);
	mp_debug("pid %d does not map %s (yet): no listed expert ranges", pid, binary);
	return -ENOENT;
}

int target_ranges_locate(int pid, const char *binary, uint64_t *addr)
{
	long page = sysconf(_SC_PAGESIZE);
	struct elf_facts f = { 0 };
	uint64_t start;
	int err;

	err = read_elf(binary, &f);
	if (!err)
		err = find_mapping(pid, binary, f.load_off & ~(uint64_t)(page - 1), &start);
	if (err)
		return err;
	*addr = start - (f.load_vaddr & ~(uint64_t)(page - 1)) + f.sym;
	return 0;
}

static int read_at(int fd, uint64_t addr, void *buf, size_t n)
{
	ssize_t got = pread(fd, buf, n, (off_t)addr);

	if (got == (ssize_t)n)
		return 0;
	return got < 0 ? -errno : -EIO;
}

static int open_mem(int pid, int *fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/mem", pid);
	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0)
		return mp_err(-errno, "cannot read %s: %s", path, strerror(errno));
	return 0;
}

int target_ranges_gen(int pid, uint64_t addr, uint64_t *gen)
{
	int fd, err = open_mem(pid, &fd);

	if (err)
		return err;
	err = read_at(fd, addr + offsetof(struct mp_pager_ranges, gen), gen, sizeof(*gen));
	close(fd);
	if (err)
		return mp_err(err, "reading " SYMBOL " of pid %d at 0x%" PRIx64 ": %s", pid, addr,
			      strerror(-err));
	return 0;
}

/* One walk: n ranges, or -EAGAIN when the list changed meanwhile (or was read mid-change). */
static int walk(int fd, uint64_t addr, struct target_range *out, uint32_t max, uint64_t *gen)
{
	struct mp_pager_ranges h;
	uint64_t next, after;
	uint32_t n = 0;
	int err;

	err = read_at(fd, addr, &h, sizeof(h));
	if (err)
		return err;
	if (h.magic != MP_PAGER_RANGES_MAGIC || h.version != MP_PAGER_RANGES_VERSION ||
	    h.entry_bytes != sizeof(struct mp_pager_range_entry))
		return -EPROTO;
	if (h.gen & 1)
		return -EAGAIN;
	for (next = h.head; next && n < MAX_WALK; n++) {
		struct mp_pager_range_entry e;

		/* An entry freed under us reads as garbage or fails: the generation tells. */
		if (read_at(fd, next, &e, sizeof(e)))
			return -EAGAIN;
		if (n < max)
			out[n] = (struct target_range){
				.id = e.id, .base = e.base, .slot_bytes = e.slot_bytes,
				.slots_per_layer = e.slots_per_layer, .layers = e.layers,
				.experts = e.experts,
			};
		next = e.next;
	}
	/* Each read is its own pread(2) on the target: no fence needed between them. */
	err = read_at(fd, addr + offsetof(struct mp_pager_ranges, gen), &after, sizeof(after));
	if (err)
		return err;
	if (after != h.gen || next)
		return -EAGAIN;
	*gen = h.gen;
	return (int)n;
}

int target_ranges_read(int pid, uint64_t addr, struct target_range *out, uint32_t max,
		       uint64_t *gen)
{
	struct timespec pause = { 0, 100000 };
	int fd, err = open_mem(pid, &fd);

	if (err)
		return err;
	for (int i = 0; i < READ_TRIES; i++) {
		err = walk(fd, addr, out, max, gen);
		if (err != -EAGAIN)
			break;
		nanosleep(&pause, NULL);
	}
	close(fd);
	if (err == -EPROTO)
		return mp_err(err, SYMBOL " of pid %d at 0x%" PRIx64 " is not a range list of "
			      "version %u", pid, addr, MP_PAGER_RANGES_VERSION);
	if (err == -EAGAIN)
		return mp_err(err, SYMBOL " of pid %d kept changing while read (%d tries)", pid,
			      READ_TRIES);
	if (err < 0)
		return mp_err(err, "reading " SYMBOL " of pid %d at 0x%" PRIx64 ": %s", pid, addr,
			      strerror(-err));
	return err;
}
