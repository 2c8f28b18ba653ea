/* CPU feature detection: which kernel ISA this CPU and OS can run, from CPUID and XGETBV,
 * optionally lowered by the CINFER_ISA environment variable. CPUID traps to the hypervisor in
 * a virtual machine (~14 us each on the KVM guests we run on), so the hardware answer is
 * computed once, under pthread_once, and cached; the environment is read on every call. */
#include "backend/cpu/kernels.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* CPUID leaf 1 ECX bits. */
enum { ECX1_FMA = 1u << 12, ECX1_OSXSAVE = 1u << 27, ECX1_AVX = 1u << 28, ECX1_F16C = 1u << 29 };
/* CPUID leaf 7 subleaf 0 EBX bits. */
enum {
  EBX7_AVX2 = 1u << 5,
  EBX7_AVX512F = 1u << 16,
  EBX7_AVX512DQ = 1u << 17,
  EBX7_AVX512BW = 1u << 30,
  EBX7_AVX512VL = 1u << 31,
};
/* XCR0 state components the OS must save: SSE+AVX (bits 1,2), and opmask+ZMM (bits 5,6,7). */
enum { XCR0_AVX_STATE = 0x6, XCR0_AVX512_STATE = 0xe0 };

/* Reads XCR0 (the OS-enabled register state); only valid when OSXSAVE is set. */
static uint64_t read_xcr0(void) {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

/* The best ISA the hardware and OS support, ignoring the environment. */
static ci_isa detect_hardware_isa(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return CI_ISA_REF;
  unsigned need1 = ECX1_FMA | ECX1_OSXSAVE | ECX1_AVX | ECX1_F16C;
  if ((ecx & need1) != need1) return CI_ISA_REF;
  uint64_t xcr0 = read_xcr0();
  if ((xcr0 & XCR0_AVX_STATE) != XCR0_AVX_STATE) return CI_ISA_REF;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return CI_ISA_REF;
  if (!(ebx & EBX7_AVX2)) return CI_ISA_REF;
  unsigned need512 = EBX7_AVX512F | EBX7_AVX512DQ | EBX7_AVX512BW | EBX7_AVX512VL;
  if ((ebx & need512) != need512) return CI_ISA_AVX2;
  if ((xcr0 & XCR0_AVX512_STATE) != XCR0_AVX512_STATE) return CI_ISA_AVX2;
  return CI_ISA_AVX512;
}

/* The cached hardware ISA and the once-guard that fills it. Written exactly once, before any
 * reader returns from pthread_once, so it is never observed half-written. */
static pthread_once_t hardware_isa_once = PTHREAD_ONCE_INIT;
static ci_isa hardware_isa;

/* pthread_once body: fills hardware_isa. */
static void compute_hardware_isa(void) { hardware_isa = detect_hardware_isa(); }

/* The best ISA the hardware and OS support, computed once. */
static ci_isa cached_hardware_isa(void) {
  pthread_once(&hardware_isa_once, compute_hardware_isa);
  return hardware_isa;
}

/* Parses an ISA name; returns -1 when unknown. */
static int parse_isa_name(const char *name) {
  for (int isa = 0; isa < CI_ISA_COUNT; isa++)
    if (strcmp(name, ci_isa_name((ci_isa)isa)) == 0) return isa;
  return -1;
}

ci_isa ci_cpu_detect_isa(void) {
  ci_isa best = cached_hardware_isa();
  const char *requested = getenv("CINFER_ISA");
  if (requested && *requested) {
    int isa = parse_isa_name(requested);
    if (isa >= 0 && isa < (int)best) best = (ci_isa)isa;
  }
  return best;
}

int ci_isa_supported(ci_isa isa) {
  if ((unsigned)isa >= CI_ISA_COUNT) return 0;
  return isa <= cached_hardware_isa();
}

const char *ci_isa_name(ci_isa isa) {
  static const char *const names[CI_ISA_COUNT] = {"ref", "avx2", "avx512"};
  return (unsigned)isa < CI_ISA_COUNT ? names[isa] : "unknown";
}
