/* A preloaded library that makes an AVX-512 x86 CPU look like an AVX2 one to the process it is loaded into.
 *
 * onnxruntime's MLAS (like numpy, oneDNN and LLVM's host detection) picks its kernels from CPUID and has no
 * option to use narrower ones. To time it on its AVX2 kernels on an AVX-512 machine, this library turns on
 * Linux's CPUID faulting for the process (arch_prctl ARCH_SET_CPUID, the mechanism rr uses to record CPUID),
 * answers every CPUID from a SIGSEGV handler with the real values, and clears the AVX-512 and AMX feature bits
 * of leaf 7 (and the ZMM/opmask state of leaf 0xD). Libraries that read CPUID after it loads then run as on
 * an AVX2 CPU of the same microarchitecture. Only the process and the threads it starts are affected.
 *
 *     cc -shared -fPIC -O2 -o cpuid_without_avx512.so scripts/cpuid_without_avx512.c
 *     LD_PRELOAD=$PWD/cpuid_without_avx512.so python scripts/bench_latency.py ...   (or bench_latency.py --as-avx2)
 *
 * The handler stays first: SIGSEGV handlers that libraries install later (tvm-ffi's and faulthandler's
 * backtrace printers; CUDA's cuInit runs CPUID after them) are recorded through an interposed sigaction() and
 * signal(), and called for the faults that are not CPUID.
 *
 * Where the kernel or the hypervisor offers no CPUID faulting (the `cpuid_fault` flag in /proc/cpuinfo), the
 * library prints one line and exits the process with status 2 rather than let it run unmasked.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_SET_CPUID 0x1012

/* Leaf 7 subleaf 0: EBX AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL. */
#define LEAF7_EBX_AVX512 ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31))
/* ECX: AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ. */
#define LEAF7_ECX_AVX512 ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
/* EDX: AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512 FP16, AMX-TILE, AMX-INT8. */
#define LEAF7_EDX_AVX512 ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25))
/* Leaf 7 subleaf 1: EAX AVX512 BF16. */
#define LEAF7_1_EAX_AVX512 (1u << 5)
/* Leaf 0xD subleaf 0: EAX's XCR0 components opmask, ZMM_Hi256, Hi16_ZMM, and AMX's XTILECFG, XTILEDATA. */
#define LEAFD_EAX_AVX512 ((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18))

typedef int (*sigaction_function)(int, const struct sigaction *, struct sigaction *);

static struct sigaction previous_segv; /* the SIGSEGV handler the process would have without us */
static int answering;                  /* whether answer_cpuid is installed */

static int real_sigaction(int signal, const struct sigaction *action, struct sigaction *old) {
    static sigaction_function next;
    if (!next) next = (sigaction_function)dlsym(RTLD_NEXT, "sigaction");
    return next(signal, action, old);
}

/* SIGSEGV handlers installed after ours become the ones called for real faults. */
int sigaction(int signal, const struct sigaction *action, struct sigaction *old) {
    if (signal != SIGSEGV || !answering) return real_sigaction(signal, action, old);
    if (old) *old = previous_segv;
    if (action) previous_segv = *action;
    return 0;
}

sighandler_t signal(int signal, sighandler_t handler) {
    struct sigaction action, old;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(signal, &action, &old) != 0) return SIG_ERR;
    if (!(old.sa_flags & SA_SIGINFO)) return old.sa_handler;
    sighandler_t previous;
    memcpy(&previous, &(void (*)(int, siginfo_t *, void *)){old.sa_sigaction}, sizeof previous);
    return previous;
}

static long set_cpuid_faulting(int faulting) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, faulting ? 0 : 1); }

static void answer_cpuid(int signal, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *regs = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    /* A faulting CPUID is a general-protection fault (SI_KERNEL); only then is RIP safe to read. */
    if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) { /* a real fault: the handler before us */
        if (previous_segv.sa_flags & SA_SIGINFO) {
            previous_segv.sa_sigaction(signal, info, context);
        } else if (previous_segv.sa_handler != SIG_IGN && previous_segv.sa_handler != SIG_DFL) {
            previous_segv.sa_handler(signal);
        } else {
            answering = 0; /* returning re-runs the instruction: it faults for real */
            real_sigaction(SIGSEGV, &previous_segv, NULL);
        }
        return;
    }
    uint32_t leaf = (uint32_t)regs[REG_RAX], subleaf = (uint32_t)regs[REG_RCX];
    uint32_t a, b, c, d;
    set_cpuid_faulting(0);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
    set_cpuid_faulting(1);
    if (leaf == 7 && subleaf == 0) {
        b &= ~LEAF7_EBX_AVX512;
        c &= ~LEAF7_ECX_AVX512;
        d &= ~LEAF7_EDX_AVX512;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~LEAF7_1_EAX_AVX512;
    } else if (leaf == 0xd && subleaf == 0) {
        a &= ~LEAFD_EAX_AVX512;
    }
    regs[REG_RAX] = a;
    regs[REG_RBX] = b;
    regs[REG_RCX] = c;
    regs[REG_RDX] = d;
    regs[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_avx512(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = answer_cpuid;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    real_sigaction(SIGSEGV, &action, &previous_segv);
    answering = 1;
    if (set_cpuid_faulting(1) != 0) {
        dprintf(2,
                "cpuid_without_avx512: this machine offers no CPUID faulting (arch_prctl ARCH_SET_CPUID: %s; no "
                "cpuid_fault flag in /proc/cpuinfo), so AVX-512 cannot be hidden here\n",
                strerror(errno));
        _exit(2);
    }
}
