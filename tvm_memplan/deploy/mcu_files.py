"""Fixed files of the standalone C project: kernel runtime, test harness, Cortex-M startup, linker
script and Makefile.

They are templates (``str.format`` fields in braces, literal braces doubled) kept apart from the
generator in :mod:`tvm_memplan.deploy.mcu_c` so that the C there stays readable.
"""

from __future__ import annotations

RUNTIME = """\
/* The three runtime symbols TVM's C kernels call, for programs without libtvm_runtime and without
 * a heap. Kernel scratch memory comes from the region each model's run hands over
 * (tvm_memplan_set_workspace: the end of its arena), used as a stack: TVM frees a kernel's
 * workspaces in the reverse order of their allocation. This file is the same for every model and
 * its definitions are weak: two models' copies link into one firmware. */
#include <stdint.h>
#include <string.h>
#include "tvm/ffi/c_api.h"

#define TVM_MEMPLAN_WEAK __attribute__((weak))

TVM_MEMPLAN_WEAK char tvm_memplan_error[256];
TVM_MEMPLAN_WEAK uint8_t* tvm_memplan_workspace_base;
TVM_MEMPLAN_WEAK uint32_t tvm_memplan_workspace_size;
TVM_MEMPLAN_WEAK uint32_t tvm_memplan_workspace_top;

TVM_MEMPLAN_WEAK const char* tvm_memplan_last_error(void) { return tvm_memplan_error; }

TVM_MEMPLAN_WEAK void tvm_memplan_set_workspace(void* base, uint32_t size) {
  tvm_memplan_workspace_base = (uint8_t*)base;
  tvm_memplan_workspace_size = size;
  tvm_memplan_workspace_top = 0;
}

TVM_MEMPLAN_WEAK void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  size_t used = 0;
  const char* pieces[2] = {kind, ": "};
  for (int i = 0; i < 2 + num_parts && used + 1 < sizeof(tvm_memplan_error); ++i) {
    const char* piece = i < 2 ? pieces[i] : parts[i - 2];
    size_t n = strlen(piece);
    if (n > sizeof(tvm_memplan_error) - 1 - used) n = sizeof(tvm_memplan_error) - 1 - used;
    memcpy(tvm_memplan_error + used, piece, n);
    used += n;
  }
  tvm_memplan_error[used] = 0;
}

TVM_MEMPLAN_WEAK void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                                int dtype_code_hint, int dtype_bits_hint) {
  (void)device_type; (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  uint64_t rounded = (nbytes + 63u) & ~(uint64_t)63u;
  if (rounded > tvm_memplan_workspace_size - tvm_memplan_workspace_top) return NULL;  /* the kernel reports it */
  void* ptr = tvm_memplan_workspace_base + tvm_memplan_workspace_top;
  tvm_memplan_workspace_top += (uint32_t)rounded;
  return ptr;
}

TVM_MEMPLAN_WEAK int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  uint8_t* p = (uint8_t*)ptr;
  if (p < tvm_memplan_workspace_base || p >= tvm_memplan_workspace_base + tvm_memplan_workspace_size) return -1;
  tvm_memplan_workspace_top = (uint32_t)(p - tvm_memplan_workspace_base);  /* pops this block and any later one */
  return 0;
}
"""

HARNESS = """\
/* Runs {name}_run once: inputs from inputN.bin, outputs to outputN.bin (raw little-endian), then one
 * line "MEMPLAN status=... ticks=... calib_ticks=... calib_instructions=... stack_used=...".
 * The platform_*.c file supplies file I/O and the counters (stdio on a host, semihosting on a
 * Cortex-M under qemu-system-arm). */
#include <stdint.h>
#include "model.h"
#include "platform.h"

{buffers}
#ifdef MEMPLAN_PROFILE
/* The counter after each kernel call (model_profile.elf), written to profile.bin. */
static uint64_t after_kernel[{calls} + 1];
void memplan_after_kernel(int number) {{ after_kernel[number] = platform_read_counter(); }}
#endif

int main(void) {{
{reads}  platform_start_counter();
  int status = {name}_run({call_args});
  uint64_t ticks = platform_read_counter();
  /* Counter ticks of a loop of known length convert ticks to instructions under qemu -icount. */
  uint64_t calib_instructions = 0;
  uint64_t calib_ticks = platform_calibrate(&calib_instructions);
{writes}#ifdef MEMPLAN_PROFILE
  if (platform_write("profile.bin", after_kernel + 1, {calls} * sizeof(uint64_t)) != 0) return 102;
#endif
  platform_report(status, ticks, calib_ticks, calib_instructions);
  return status;
}}
"""

PLATFORM_H = """\
/* What the harness needs from the machine it runs on. */
#ifndef TVM_MEMPLAN_PLATFORM_H_
#define TVM_MEMPLAN_PLATFORM_H_
#include <stddef.h>
#include <stdint.h>
int platform_read(const char* path, void* data, size_t bytes);
int platform_write(const char* path, const void* data, size_t bytes);
void platform_start_counter(void);
uint64_t platform_read_counter(void);
uint64_t platform_calibrate(uint64_t* instructions);
void platform_report(int status, uint64_t ticks, uint64_t calib_ticks, uint64_t calib_instructions);
#endif
"""

PLATFORM_HOST = """\
/* Host platform: stdio files, no counters (a host build checks correctness, not cost). */
#include <stdio.h>
#include "platform.h"
#include "model.h"

int platform_read(const char* path, void* data, size_t bytes) {
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  size_t got = fread(data, 1, bytes, f);
  fclose(f);
  return got == bytes ? 0 : -1;
}

int platform_write(const char* path, const void* data, size_t bytes) {
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  size_t put = fwrite(data, 1, bytes, f);
  fclose(f);
  return put == bytes ? 0 : -1;
}

void platform_start_counter(void) {}
uint64_t platform_read_counter(void) { return 0; }
uint64_t platform_calibrate(uint64_t* instructions) { *instructions = 0; return 0; }

void platform_report(int status, uint64_t ticks, uint64_t calib_ticks, uint64_t calib_instructions) {
  printf("MEMPLAN status=%d ticks=%llu calib_ticks=%llu calib_instructions=%llu stack_used=0 stack_size=0\\n",
         status, (unsigned long long)ticks, (unsigned long long)calib_ticks, (unsigned long long)calib_instructions);
  if (status != 0) printf("MEMPLAN error: %s\\n", tvm_memplan_last_error());
}
"""

PLATFORM_SEMIHOST = """\
/* Cortex-M platform for qemu-system-arm: Arm semihosting (BKPT 0xAB) for files and text, SysTick
 * for a cycle counter, the painted stack for its high-water mark. No libc stdio, no heap. */
#include <stdint.h>
#include <string.h>
#include "platform.h"
#include "model.h"

#define SYS_OPEN 0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE0 0x04
#define SYS_WRITE 0x05
#define SYS_READ 0x06
#define SYS_EXIT 0x18
#define STACK_PAINT 0xC0FFEE11u

extern uint32_t __stack_limit, __stack_top;

static int semihost(int op, const void* arg) {
  register int r0 __asm__("r0") = op;
  register const void* r1 __asm__("r1") = arg;
  __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

/* Opens path in mode, moves the bytes with op (SYS_READ or SYS_WRITE), closes: 0 when all moved. */
static int transfer(const char* path, int mode, int op, const void* data, size_t bytes) {
  uint32_t open_args[3] = {(uint32_t)path, (uint32_t)mode, (uint32_t)strlen(path)};
  int handle = semihost(SYS_OPEN, open_args);
  if (handle < 0) return -1;
  uint32_t args[3] = {(uint32_t)handle, (uint32_t)data, (uint32_t)bytes};
  int missing = semihost(op, args);
  semihost(SYS_CLOSE, &handle);
  return missing == 0 ? 0 : -1;
}

int platform_read(const char* path, void* data, size_t bytes) {
  return transfer(path, 1 /* "rb" */, SYS_READ, data, bytes);
}

int platform_write(const char* path, const void* data, size_t bytes) {
  return transfer(path, 5 /* "wb" */, SYS_WRITE, data, bytes);
}

/* SysTick counts CPU clock ticks down from 2^24 - 1; its interrupt counts the wraps. */
#define SYST_CSR (*(volatile uint32_t*)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t*)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t*)0xE000E018u)
static volatile uint32_t wraps;

void SysTick_Handler(void) { wraps++; }

void platform_start_counter(void) {
  SYST_CSR = 0;
  SYST_RVR = 0xFFFFFFu;
  SYST_CVR = 0;
  wraps = 0;
  SYST_CSR = 7u;  /* enable, interrupt, CPU clock */
}

uint64_t platform_read_counter(void) {
  uint32_t before, value, after;
  do {
    before = wraps;
    value = SYST_CVR;
    after = wraps;
  } while (before != after);
  return ((uint64_t)before << 24) + (0xFFFFFFu - value);
}

uint64_t platform_calibrate(uint64_t* instructions) {
  uint32_t count = 1u << 22;
  platform_start_counter();
  __asm__ volatile("1: subs %0, %0, #1\\n bne 1b" : "+r"(count) : : "cc");
  uint64_t ticks = platform_read_counter();
  *instructions = 2ull << 22;  /* two instructions per iteration */
  return ticks;
}

static void put_text(const char* text) { semihost(SYS_WRITE0, text); }

static void put_number(const char* label, uint64_t value) {
  char digits[24];
  int n = sizeof(digits) - 1;
  digits[n] = 0;
  do { digits[--n] = (char)('0' + value % 10); value /= 10; } while (value && n > 0);
  put_text(label);
  put_text(digits + n);
}

void platform_report(int status, uint64_t ticks, uint64_t calib_ticks, uint64_t calib_instructions) {
  uint32_t* word = &__stack_limit;
  while (word < &__stack_top && *word == STACK_PAINT) ++word;
  put_text("MEMPLAN status=");
  put_text(status == 0 ? "0" : "1");
  put_number(" ticks=", ticks);
  put_number(" calib_ticks=", calib_ticks);
  put_number(" calib_instructions=", calib_instructions);
  put_number(" stack_used=", (uint64_t)((uint32_t)&__stack_top - (uint32_t)word));
  put_number(" stack_size=", (uint64_t)((uint32_t)&__stack_top - (uint32_t)&__stack_limit));
  put_text("\\n");
  if (status != 0) {
    put_text("MEMPLAN error: ");
    put_text(tvm_memplan_last_error());
    put_text("\\n");
  }
}

void platform_exit(int status) {
  if (status != 0) put_number("MEMPLAN exit status ", (uint64_t)(uint32_t)status);
  if (status != 0) put_text("\\n");
  semihost(SYS_EXIT, (const void*)0x20026);  /* ADP_Stopped_ApplicationExit */
  for (;;) {}
}

void platform_fault(void) {
  put_text("MEMPLAN fault: an exception handler ran (hard fault, memory fault, bus fault or usage fault)\\n");
  platform_exit(1);
}
"""

STARTUP = """\
/* Cortex-M startup: vector table, .data copy, .bss clear, FPU on, stack painted for the
 * high-water mark, then main() and a semihosting exit. */
#include <stdint.h>

#define STACK_PAINT 0xC0FFEE11u

extern uint32_t __data_load, __data_start, __data_end, __bss_start, __bss_end, __stack_limit, __stack_top;
int main(void);
void platform_exit(int status);
void platform_fault(void);
void SysTick_Handler(void);
void Reset_Handler(void);

static void Default_Handler(void) { platform_fault(); }

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))&__stack_top, Reset_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, 0, 0, 0, 0,
    Default_Handler, Default_Handler, 0, Default_Handler, SysTick_Handler,
};

__attribute__((noinline)) static void paint_stack(void) {
  uint32_t here;
  uint32_t* limit = (uint32_t*)((uintptr_t)&here - 256);  /* keep this frame and its caller's */
  for (uint32_t* word = &__stack_limit; word < limit; ++word) *word = STACK_PAINT;
}

void Reset_Handler(void) {
  for (uint32_t *src = &__data_load, *dst = &__data_start; dst < &__data_end;) *dst++ = *src++;
  for (uint32_t* dst = &__bss_start; dst < &__bss_end;) *dst++ = 0;
  *(volatile uint32_t*)0xE000ED88u |= 0xFu << 20;  /* CPACR: CP10 and CP11 full access */
  __asm__ volatile("dsb\\n isb");
  paint_stack();
  platform_exit(main());
}
"""

LINKER_SCRIPT = """\
/* {board}: code at {flash_origin:#x}, constants (the weights) in {rodata_name} at {rodata_origin:#x},
 * .data/.bss (arena, kernel workspace, harness buffers) and the stack in {ram_name} at {ram_origin:#x}.
 * On a real chip .text and .rodata both go to flash: tvm-memplan measure adds them up as flash. */
MEMORY
{{
  FLASH (rx)  : ORIGIN = {flash_origin:#x}, LENGTH = {flash_length:#x}
  CONST (r)   : ORIGIN = {rodata_origin:#x}, LENGTH = {rodata_length:#x}
  RAM (rwx)   : ORIGIN = {ram_origin:#x}, LENGTH = {ram_length:#x}
}}

__stack_size = DEFINED(__stack_size) ? __stack_size : 0x10000;
ENTRY(Reset_Handler)

SECTIONS
{{
  .vectors : {{ KEEP(*(.vectors)) }} > FLASH
  .text : {{ *(.text .text.*) *(.glue_7 .glue_7t .vfp11_veneer .v4_bx) }} > FLASH
  .ARM.exidx : {{ *(.ARM.exidx* .gnu.linkonce.armexidx.*) }} > FLASH
  .rodata : {{ . = ALIGN(64); *(.rodata .rodata.*) . = ALIGN(8); }} > CONST
  .data : {{ . = ALIGN(64); __data_start = .; *(.data .data.*) . = ALIGN(4); __data_end = .; }} > RAM AT > FLASH
  __data_load = LOADADDR(.data);
  /* An arena placed with -DMEMPLAN_ARENA_SECTION='__attribute__((section(".memplan_arena")))' (a board's
   * script would put this section in DTCM); uninitialized like .bss, but not cleared at start-up. */
  .memplan_arena (NOLOAD) : ALIGN(64) {{ *(.memplan_arena .memplan_arena.*) }} > RAM
  .bss (NOLOAD) : {{ . = ALIGN(64); __bss_start = .; *(.bss .bss.*) *(COMMON) . = ALIGN(4); __bss_end = .; }} > RAM
  .stack (NOLOAD) : {{ . = ALIGN(8); __stack_limit = .; . += __stack_size; . = ALIGN(8); __stack_top = .; }} > RAM
  /DISCARD/ : {{ *(.ARM.attributes) }}
}}
"""

MAKEFILE = """\
# {model}: the whole network as standalone C (tvm-memplan build --emit-c).
#   make                 -> ./model_host and ./example on this machine (CC, CFLAGS, LDFLAGS as usual)
#   make cortex-m        -> model.elf for {cpu} ({board} under qemu-system-arm)
#   make run-qemu        -> runs model.elf: needs input0.bin ... next to it, writes output0.bin ...
#   make model_profile.elf -> model.elf that also writes the counter after each kernel to profile.bin
#   ARENA_SECTION=.dtcm  -> the static arena in that linker section (MEMPLAN_ARENA_SECTION; cortex_m.ld
#                           has .memplan_arena)
# Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
CC ?= gcc
CFLAGS ?= -O2
ARM_CC ?= arm-none-eabi-gcc
ARM_CFLAGS ?= -O2
CPU_FLAGS ?= {cpu_flags}
QEMU ?= qemu-system-arm
QEMU_MACHINE ?= {machine}
STACK_SIZE ?= {stack_size}
ARENA_SECTION ?=
ifneq ($(ARENA_SECTION),)
ARENA_DEFINE = '-DMEMPLAN_ARENA_SECTION=__attribute__((section("$(ARENA_SECTION)")))'
endif
MODEL_SOURCES = model.c model_weights.c kernels.c tvm_memplan_runtime.c
HEADERS = model.h kernels.h platform.h

all: model_host example

model_host: $(MODEL_SOURCES) main.c platform_host.c $(HEADERS)
\t$(CC) $(CFLAGS) $(ARENA_DEFINE) -Iinclude -o $@ $(MODEL_SOURCES) main.c platform_host.c $(LDFLAGS) -lm

example: example_main.c kernels.c tvm_memplan_runtime.c kernels.h example_data.h
\t$(CC) $(CFLAGS) -Iinclude -o $@ example_main.c kernels.c tvm_memplan_runtime.c $(LDFLAGS) -lm

cortex-m: model.elf

ARM_BUILD = $(ARM_CC) $(CPU_FLAGS) $(ARM_CFLAGS) $(ARENA_DEFINE) -ffunction-sections -fdata-sections -Iinclude \\
  -nostartfiles --specs=nosys.specs -T cortex_m.ld -Wl,--gc-sections -Wl,--defsym=__stack_size=$(STACK_SIZE)
ARM_SOURCES = $(MODEL_SOURCES) main.c platform_semihost.c startup_cortexm.c

model.elf: $(ARM_SOURCES) cortex_m.ld $(HEADERS)
\t$(ARM_BUILD) -o $@ $(ARM_SOURCES) -lm

model_profile.elf: $(ARM_SOURCES) cortex_m.ld $(HEADERS)
\t$(ARM_BUILD) -DMEMPLAN_PROFILE -o $@ $(ARM_SOURCES) -lm

run-host: model_host
\t./model_host

run-qemu: model.elf
\t$(QEMU) -M $(QEMU_MACHINE) -nographic -monitor none -serial none \\
\t  -semihosting-config enable=on,target=native -icount shift=0,sleep=off -kernel model.elf

clean:
\trm -f model_host example model.elf model_profile.elf output*.bin profile.bin

.PHONY: all cortex-m run-host run-qemu clean
"""
