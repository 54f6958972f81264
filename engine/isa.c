// SPDX-License-Identifier: MIT
/* Picks the kernel table for the ISA this CPU and OS support (cpuid, at run time). */
#include <errno.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "engine/kernels.h"

#if defined(MP_HAVE_X86_KERNELS)
static bool has_f16c(void)
{
	unsigned a, b, c, d;

	/* __builtin_cpu_supports() has no "f16c" in every compiler; ask cpuid directly. */
	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static bool has_avx2(void)
{
	/* __builtin_cpu_supports() also checks that the OS saves the vector state. */
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

static bool has_avx512(void)
{
	return has_avx2() && __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

/* arch_prctl() codes of <asm/prctl.h> (Linux 5.16), which older headers lack. */
#define ARCH_REQ_XCOMP_PERM	0x1023
#define XFEATURE_XTILEDATA	18

/*
 * AMX-TILE and AMX-BF16 (cpuid 7.0 EDX bits 24, 22), and the kernel's
 * permission for this process to use the tile data state. The request is
 * idempotent and process-wide (threads and children inherit it), so
 * asking at each lookup keeps no state here; it fails on kernels without
 * AMX support or where a filter forbids it.
 */
static int amx_check(void)
{
	unsigned a, b, c, d;

	if (!has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) ||
	    !(d & (1u << 24)) || !(d & (1u << 22)))
		return -ENODEV;
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) ? -errno : 0;
}

/*
 * AVX512-BF16 on top of AVX-512. Its registers are the AVX-512 state the OS
 * already saves for has_avx512().
 */
static bool has_bf16(void)
{
	unsigned a, b, c, d, sub_max;

	if (!has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	sub_max = a;
	if (sub_max < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d))
		return false;
	return mp_isa_bf16_cpuid(sub_max, a);
}
#endif

bool mp_isa_bf16_cpuid(unsigned leaf7_sub_max, unsigned leaf7_1_eax)
{
	return leaf7_sub_max >= 1 && (leaf7_1_eax & (1u << 5));
}

int mp_isa_amx_check(void)
{
#if defined(MP_HAVE_X86_KERNELS)
	return amx_check();
#else
	return -ENODEV;
#endif
}

enum mp_isa mp_isa_best(void)
{
#if defined(MP_HAVE_X86_KERNELS)
	if (has_avx512())
		return MP_ISA_AVX512;
	if (has_avx2())
		return MP_ISA_AVX2;
#endif
	return MP_ISA_SCALAR;
}

const struct mp_kernels *mp_kernels_for(enum mp_isa isa)
{
	switch (isa) {
	case MP_ISA_SCALAR:
		return &mp_kernels_scalar;
#if defined(MP_HAVE_X86_KERNELS)
	case MP_ISA_AVX2:
		return has_avx2() ? &mp_kernels_avx2 : NULL;
	case MP_ISA_AVX512:
		return has_avx512() ? &mp_kernels_avx512 : NULL;
	case MP_ISA_AMX:
		return amx_check() ? NULL : &mp_kernels_amx;
	case MP_ISA_BF16:
		return has_bf16() ? &mp_kernels_bf16 : NULL;
#endif
	default:
		return NULL;
	}
}
