/* CPU feature detection: which kernel ISA this CPU and OS can run (and whether AVX-512 VNNI
 * integer and AVX512_BF16 dot products, and AMX-BF16 tile products, are there too), from CPUID
 * and XGETBV (AMX also needs the kernel's permission for its tile state, asked for once with
 * arch_prctl), optionally lowered by the CINFER_ISA / CINFER_INT8 / CINFER_BF16 / CINFER_AMX
 * environment variables. CPUID traps to the
 * hypervisor in a virtual machine (~14 us each on the KVM guests we run on), so the hardware answer
 * is computed once, under pthread_once, and cached; the environment is read on every call. */
#include "backend/cpu/kernels_impl.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
/* CPUID leaf 7 subleaf 0 ECX and EDX bits. */
enum { ECX7_AVX512_VNNI = 1u << 11, EDX7_AMX_BF16 = 1u << 22, EDX7_AMX_TILE = 1u << 24 };
/* CPUID leaf 7 subleaf 1 EAX bits. */
enum { EAX71_AVX512_BF16 = 1u << 5 };
/* XCR0 state components the OS must save: SSE+AVX (bits 1,2), and opmask+ZMM (bits 5,6,7). */
enum { XCR0_AVX_STATE = 0x6, XCR0_AVX512_STATE = 0xe0 };
/* XCR0 state components of AMX: the tile configuration (bit 17) and the tile data (bit 18). */
#define XCR0_AMX_STATE 0x60000ull
/* Linux arch_prctl request for permission to use an extended state component, and AMX's tile
 * data component number (asm/prctl.h; spelled out for older headers). */
enum { ARCH_REQ_XCOMP_PERM_CODE = 0x1023, XFEATURE_XTILEDATA_NUMBER = 18 };

/* Reads XCR0 (the OS-enabled register state); only valid when OSXSAVE is set. */
static uint64_t read_xcr0(void) {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

/* What the hardware and OS support, ignoring the environment. */
typedef struct {
  ci_isa isa;
  int avx512_vnni; /* 1 when isa is AVX512 and AVX512_VNNI is there too */
  int avx512_bf16; /* 1 when isa is AVX512 and AVX512_BF16 is there too */
  int amx_bf16;    /* 1 when avx512_bf16 and AMX-BF16 are there and this process may use AMX */
} hardware_features;

/* The best ISA the hardware and OS support, ignoring the environment; sets *vnni (*bf16) when
 * that ISA is AVX512 and the CPU also has AVX512_VNNI (AVX512_BF16), and *amx when it also has
 * AMX-BF16 and Linux grants this process the tile state. */
static ci_isa detect_hardware_isa(int *vnni, int *bf16, int *amx) {
  *vnni = 0;
  *bf16 = 0;
  *amx = 0;
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
  *vnni = (ecx & ECX7_AVX512_VNNI) != 0;
  const int amx_cpu = (edx & (EDX7_AMX_BF16 | EDX7_AMX_TILE)) == (EDX7_AMX_BF16 | EDX7_AMX_TILE);
  if (eax >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx))
    *bf16 = (eax & EAX71_AVX512_BF16) != 0;
  /* the OS enables the tile state in XCR0 and grants it per process on request (a process that
   * uses tiles without the grant gets SIGILL) */
  *amx = *bf16 && amx_cpu && (xcr0 & XCR0_AMX_STATE) == XCR0_AMX_STATE &&
         syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_CODE, XFEATURE_XTILEDATA_NUMBER) == 0;
  return CI_ISA_AVX512;
}

/* The cached hardware features and the once-guard that fills them. Written exactly once,
 * before any reader returns from pthread_once, so they are never observed half-written. */
static pthread_once_t hardware_once = PTHREAD_ONCE_INIT;
static hardware_features hardware;

/* pthread_once body: fills hardware. */
static void compute_hardware(void) {
  hardware.isa =
      detect_hardware_isa(&hardware.avx512_vnni, &hardware.avx512_bf16, &hardware.amx_bf16);
}

/* The best ISA the hardware and OS support, computed once. */
static ci_isa cached_hardware_isa(void) {
  pthread_once(&hardware_once, compute_hardware);
  return hardware.isa;
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

int ci_cpu_int8_matmul_enabled(void) {
  pthread_once(&hardware_once, compute_hardware);
  if (!hardware.avx512_vnni) return 0;
  const char *requested = getenv("CINFER_INT8");
  return !(requested && strcmp(requested, "0") == 0);
}

int ci_cpu_x16_matmul_enabled(void) {
  if (!ci_isa_supported(CI_ISA_AVX2)) return 0;
  const char *requested = getenv("CINFER_INT8");
  return !(requested && strcmp(requested, "0") == 0);
}

int ci_cpu_bf16_dot_enabled(void) {
  pthread_once(&hardware_once, compute_hardware);
  if (!hardware.avx512_bf16) return 0;
  const char *requested = getenv("CINFER_BF16");
  return !(requested && strcmp(requested, "0") == 0);
}

int ci_cpu_amx_enabled(void) {
  pthread_once(&hardware_once, compute_hardware);
  if (!hardware.amx_bf16) return 0;
  const char *requested = getenv("CINFER_AMX");
  return !(requested && strcmp(requested, "0") == 0);
}
