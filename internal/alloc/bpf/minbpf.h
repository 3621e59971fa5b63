/* Minimal BPF definitions for rbscope's allocation program: fixed-width
 * types, the few map types and helpers it uses, BTF map-definition macros
 * and x86_64 pt_regs. Written from the kernel's uapi (linux/bpf.h,
 * asm/ptrace.h) so the program needs no system headers, libbpf or
 * vmlinux.h and compiles the same on any host. */
#ifndef RBSCOPE_MINBPF_H
#define RBSCOPE_MINBPF_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef signed int __s32;
typedef unsigned long long __u64;
typedef signed long long __s64;

/* enum bpf_map_type (uapi linux/bpf.h) */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_RINGBUF 27

/* map_flags */
#define BPF_F_NO_PREALLOC 1

/* map update flags */
#define BPF_ANY 0
#define BPF_NOEXIST 1

/* BTF-defined maps, as libbpf's bpf_helpers.h spells them. */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name
#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* struct pt_regs for x86_64 (uapi asm/ptrace.h). */
struct pt_regs {
	unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8;
	unsigned long rax, rcx, rdx, rsi, rdi, orig_rax;
	unsigned long rip, cs, eflags, rsp, ss;
};
#define PT_REGS_SIZE 168

/* Helper functions, by their numbers in enum bpf_func_id. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static __u32 (*bpf_get_smp_processor_id)(void) = (void *)8;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)112;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)113;
static long (*bpf_probe_read_user_str)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)114;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static void (*bpf_ringbuf_discard)(void *data, __u64 flags) = (void *)133;
static long (*bpf_for_each_map_elem)(void *map, void *callback_fn, void *callback_ctx, __u64 flags) = (void *)164;
static __u64 (*bpf_get_attach_cookie)(void *ctx) = (void *)174;
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx, __u64 flags) = (void *)181;

#endif
