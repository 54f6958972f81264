// SPDX-License-Identifier: MIT
/* The SIGBUS guard: a poisoned expert read inside mp_pager_guard() becomes an error return. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <ucontext.h>

#include <moepager/pager.h>

#include "base/base.h"
#include "pager/pager_priv.h"
#include "pager/share_priv.h"

/*
 * The signal hook is process-wide by nature; it is the one piece of
 * global state here. Pagers register their ranges in a fixed table the
 * handler reads without locks (it runs in signal context); everything
 * else happens after the siglongjmp, under the registry lock.
 */
#define MAX_RANGES 64

struct guard_range {
	_Atomic uintptr_t start;	/* 0: free entry */
	_Atomic uintptr_t end;
	struct mp_pager *p;
	/* Ranges that are not a pager's (share_priv.h): who says what failed. */
	int (*cause)(void *ctx, void *addr);
	void *ctx;
};

static struct guard_range ranges[MAX_RANGES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static struct sigaction prev_action;
static int hook_err;

/*
 * The frame saves no signal mask: sigsetjmp(jb, 1) costs a sigprocmask call
 * on every entry, and the engine enters the guard once per chunk of work
 * (~200 times a token on tiny-real). The handler keeps the mask the fault
 * interrupted (its ucontext's) instead, and the guard restores it after the
 * jump, which is what a saved mask would have given back.
 */
struct guard_frame {
	sigjmp_buf jb;
	struct guard_frame *prev;
	void *addr;
	sigset_t mask;
};

/* Initial-exec TLS: the handler must not call into the dynamic linker. */
static __thread struct guard_frame *guard_top __attribute__((tls_model("initial-exec")));

/*
 * How often a thread's guard entries look whether someone replaced our
 * SIGBUS handler (a sigaction() system call): its first entry and every
 * HOOK_RECHECK-th after it, and every pager open (register_entry). A count,
 * not a clock: reading the clock on every entry cost as much as the rest of
 * the entry (docs/region.md, session 34).
 */
#define HOOK_RECHECK 64u
static __thread uint32_t hook_entries __attribute__((tls_model("initial-exec")));

static bool in_ranges(uintptr_t a)
{
	for (int i = 0; i < MAX_RANGES; i++) {
		uintptr_t s = atomic_load_explicit(&ranges[i].start, memory_order_acquire);

		if (s && a >= s && a < atomic_load_explicit(&ranges[i].end, memory_order_relaxed))
			return true;
	}
	return false;
}

/* Hands a SIGBUS that is not ours to whatever handled SIGBUS before us. */
static void chain(int sig, siginfo_t *si, void *uc)
{
	if (prev_action.sa_flags & SA_SIGINFO) {
		if (prev_action.sa_sigaction)
			prev_action.sa_sigaction(sig, si, uc);
		return;
	}
	if (prev_action.sa_handler == SIG_IGN)
		return;
	if (prev_action.sa_handler != SIG_DFL) {
		prev_action.sa_handler(sig);
		return;
	}
	/*
	 * Default action: restore it. A fault re-executes the access and
	 * dies of it (with the right core); a sent signal is raised again.
	 */
	signal(SIGBUS, SIG_DFL);
	if (si->si_code <= 0)
		raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	struct guard_frame *f = guard_top;

	if (f && si->si_code > 0 && in_ranges((uintptr_t)si->si_addr)) {
		f->addr = si->si_addr;
		f->mask = ((const ucontext_t *)uc)->uc_sigmask;
		siglongjmp(f->jb, 1);
	}
	chain(sig, si, uc);
}

static void hook_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev_action))
		hook_err = -errno;
}

/*
 * Someone installed a SIGBUS handler after ours (a test harness, a
 * runtime): put ours back in front, chaining to theirs. Checked at every
 * pager open and on a thread's guard entries (HOOK_RECHECK), so the guard
 * keeps working whatever was installed since.
 */
/*
 * Ours, however it was put back: signal() returns our handler as a plain
 * one, and a harness that restores it with signal() (cmocka does) installs
 * it without SA_SIGINFO. Taken for a foreign one, it would become the
 * handler we chain to: ourselves, called without a siginfo.
 */
static bool is_ours(const struct sigaction *sa)
{
	return (void *)sa->sa_sigaction == (void *)on_sigbus;
}

static int hook_check(void)
{
	static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
	struct sigaction cur;

	if (sigaction(SIGBUS, NULL, &cur))
		return -errno;
	if ((cur.sa_flags & SA_SIGINFO) && is_ours(&cur))
		return 0;
	pthread_mutex_lock(&hook_lock);
	if (!sigaction(SIGBUS, NULL, &cur) && !((cur.sa_flags & SA_SIGINFO) && is_ours(&cur))) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_sigbus;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
		sigemptyset(&sa.sa_mask);
		if (!is_ours(&cur))
			prev_action = cur;
		sigaction(SIGBUS, &sa, NULL);
	}
	pthread_mutex_unlock(&hook_lock);
	return 0;
}

static int hook_ensure(bool always)
{
	pthread_once(&hook_once, hook_install);
	if (hook_err)
		return hook_err;
	if (!always && hook_entries++ % HOOK_RECHECK)
		return 0;
	return hook_check();
}

static int register_entry(struct mp_pager *p, const void *start, uint64_t len,
			  int (*cause)(void *ctx, void *addr), void *ctx)
{
	int err = hook_ensure(true);

	if (err)
		return mp_err(err, "guard: installing the SIGBUS handler: %s", strerror(-err));
	err = -ENOSPC;
	pthread_mutex_lock(&registry_lock);
	for (int i = 0; i < MAX_RANGES; i++) {
		if (atomic_load(&ranges[i].start))
			continue;
		ranges[i].p = p;
		ranges[i].cause = cause;
		ranges[i].ctx = ctx;
		atomic_store_explicit(&ranges[i].end, (uintptr_t)start + len, memory_order_relaxed);
		atomic_store_explicit(&ranges[i].start, (uintptr_t)start, memory_order_release);
		err = 0;
		break;
	}
	pthread_mutex_unlock(&registry_lock);
	if (err)
		return mp_err(err, "guard: more than %d ranges open at once", MAX_RANGES);
	return 0;
}

int mp_guard_register(struct mp_pager *p, const void *start, uint64_t len)
{
	return register_entry(p, start, len, NULL, NULL);
}

int mp_guard_register_range(const void *start, uint64_t len,
			    int (*cause)(void *ctx, void *addr), void *ctx)
{
	return register_entry(NULL, start, len, cause, ctx);
}

void mp_guard_unregister_range(void *ctx)
{
	pthread_mutex_lock(&registry_lock);
	for (int i = 0; i < MAX_RANGES; i++) {
		if (ranges[i].ctx == ctx && atomic_load(&ranges[i].start)) {
			atomic_store(&ranges[i].start, 0);
			ranges[i].cause = NULL;
			ranges[i].ctx = NULL;
		}
	}
	pthread_mutex_unlock(&registry_lock);
}

void mp_guard_unregister(struct mp_pager *p)
{
	pthread_mutex_lock(&registry_lock);
	for (int i = 0; i < MAX_RANGES; i++) {
		if (ranges[i].p == p && atomic_load(&ranges[i].start)) {
			atomic_store(&ranges[i].start, 0);
			ranges[i].p = NULL;
		}
	}
	pthread_mutex_unlock(&registry_lock);
}

/*
 * Counted without the pager's lock, which the fill threads and route()
 * hold often; only a close waits for the count, and it says so in the same
 * word (GUARDS_CLOSING), so one atomic operation tells a leaver both
 * whether it is the last and whether a close waits. A leaver touches the
 * pager after its decrement only as that last one with a close waiting,
 * and the close goes on only once it has said so under the lock
 * (guards_out): a flag in its own word, or a wait for the count alone,
 * would let the close see 0 and free the pager between the leaver's
 * decrement and its wake-up.
 */
#define GUARDS_CLOSING 0x80000000u

static void guard_enter(struct mp_pager *p)
{
	atomic_fetch_add(&p->guards, 1);
}

static void guard_leave(struct mp_pager *p)
{
	if (atomic_fetch_sub(&p->guards, 1) == (GUARDS_CLOSING | 1)) {
		pthread_mutex_lock(&p->lock);
		p->guards_out = true;
		pthread_cond_broadcast(&p->guard_cv);
		pthread_mutex_unlock(&p->lock);
	}
}

void mp_guard_wait_out(struct mp_pager *p)
{
	/* None inside: no leaver will look at the pager again. */
	if (atomic_fetch_or(&p->guards, GUARDS_CLOSING) == 0)
		return;
	while (!p->guards_out)
		pthread_cond_wait(&p->guard_cv, &p->lock);
}

/* After the jump: find the pager the address belongs to, report, and start the retry. */
static int guard_fault(void *addr)
{
	struct mp_pager *owner = NULL;
	uint32_t clear = SLOT_NONE;
	int err = -EIO;

	pthread_mutex_lock(&registry_lock);
	for (int i = 0; i < MAX_RANGES; i++) {
		uintptr_t s = atomic_load(&ranges[i].start);

		if (s && (uintptr_t)addr >= s && (uintptr_t)addr < atomic_load(&ranges[i].end)) {
			owner = ranges[i].p;
			if (!owner && ranges[i].cause) {
				err = ranges[i].cause(ranges[i].ctx, addr);
				pthread_mutex_unlock(&registry_lock);
				return err;
			}
			break;
		}
	}
	if (owner) {
		err = mp_pager_fault_cause(owner, addr, &clear);
		/* Keeps the owner open while its poison is cleared outside the registry lock. */
		if (clear != SLOT_NONE)
			guard_enter(owner);
	}
	pthread_mutex_unlock(&registry_lock);
	if (!owner)
		return mp_err(-EIO, "guard: SIGBUS at %p, in no open pager's range", addr);
	if (clear != SLOT_NONE) {
		mp_pager_clear(owner, clear);
		guard_leave(owner);
	}
	return err;
}

int mp_pager_guard(struct mp_pager *p, int (*fn)(void *arg), void *arg)
{
	struct guard_frame f;
	volatile int ret = 0;

	if (!fn)
		return mp_err(-EINVAL, "guard: no function");
	ret = hook_ensure(false);
	if (ret)
		return mp_err(ret, "guard: SIGBUS handler not installed: %s", strerror(-ret));
	if (p)
		guard_enter(p);
	f.prev = guard_top;
	f.addr = NULL;
	if (sigsetjmp(f.jb, 0) == 0) {
		guard_top = &f;
		atomic_signal_fence(memory_order_seq_cst);
		ret = fn(arg);
		atomic_signal_fence(memory_order_seq_cst);
		guard_top = f.prev;
	} else {
		guard_top = f.prev;
		/* Unblocks SIGBUS again (blocked while its handler ran). */
		pthread_sigmask(SIG_SETMASK, &f.mask, NULL);
		ret = guard_fault(f.addr);
	}
	if (p)
		guard_leave(p);
	return ret;
}
