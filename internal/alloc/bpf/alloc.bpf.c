// SPDX-License-Identifier: GPL-2.0 OR MIT
/* rbscope alloc: count a Ruby process's object allocations in the kernel.
 *
 * One program is attached to every USDT probe site (ruby:object__create,
 * array__create, ...) or, for Rubies without probes, to the entry of the
 * allocation function. The attach cookie indexes `probe_specs`, which says what
 * the site's arguments are and where they live (register, stack slot,
 * constant). Counts are aggregated here per (kind, class, file, line);
 * user space reads the maps once per refresh. No strings are copied: the
 * class and file name pointers are keys, and user space reads each
 * distinct pointer once from the target's memory. */
#include "minbpf.h"

#define MAX_SPECS 1024
#define ANON_CLASS 1 /* class "pointer" of anonymous classes' objects */
#define MAX_SITES 65536
#define MAX_CLASSES 16384
#define T_MASK 0x1f  /* RBasic.flags: the object's type */
#define T_IMEMO 0x1a /* internal memo (include/ruby/internal/value_type.h) */

/* Argument kinds, as in package usdt. */
#define ARG_NONE 0
#define ARG_CONST 1
#define ARG_REG 2
#define ARG_MEM 3

/* Probe kinds. */
enum kind {
	KIND_OBJECT = 1, /* object__create(const char *classname, file, line) */
	KIND_ARRAY = 2,  /* array__create(long length, file, line) */
	KIND_HASH = 3,   /* hash__create(long length, file, line) */
	KIND_STRING = 4, /* string__create(long length, file, line) */
	KIND_SYMBOL = 5, /* symbol__create(const char *str, file, line) */
	KIND_NEWOBJ = 6, /* newobj function entry: arg 0 is the klass VALUE,
			    arg 1 (when given) the new object's flags */
	KIND_CLASS_NEW = 7, /* Class#new entry (rb_class_new_instance*): klass */
	KIND_RETURN = 8, /* after the allocation call a create probe precedes:
			    rax is the new object (retained mode) */
	KIND_GC_MARK_BEGIN = 16,
	KIND_GC_MARK_END = 17,
	KIND_GC_SWEEP_BEGIN = 18,
	KIND_GC_SWEEP_END = 19,
	KIND_EXIT = 20, /* entry of Ruby's teardown (ruby_vm_destruct): copy the counter */
};

/* Statistics slots. */
enum stat {
	STAT_EVENTS = 0,       /* allocation events seen (before sampling) */
	STAT_SAMPLED = 1,      /* events counted */
	STAT_SITES_FULL = 2,   /* counted events whose site did not fit */
	STAT_CLASSES_FULL = 3, /* ... nor their class: lost */
	STAT_ARG_ERRORS = 4,   /* argument reads that failed */
	STAT_GC_MARK_NS = 5,
	STAT_GC_MARK_COUNT = 6,
	STAT_GC_SWEEP_NS = 7,
	STAT_GC_SWEEP_COUNT = 8,
	STAT_STACKS = 10,      /* stacks captured */
	STAT_STACKS_LOST = 11, /* stacks the ring buffer had no room for */
	STAT_OBJECTS = 9,      /* events that are heap objects: not symbol__create,
				  which also fires for static symbols (IDs) */
	STAT_KEYS = 12,        /* keys added to the site and class maps: user
				  space reads the maps for new names only when
				  this grew */
	STAT_TRACKED = 13,     /* retained mode: objects whose address was paired */
	STAT_RET_BAD = 14,     /* return sites whose value was no object of the kind
				  (a helper called before the allocation) */
	STAT_TRACK_FULL = 15,  /* ... that the tracked map had no room for */
	STAT_DIED = 16,        /* tracked objects found unmarked when a sweep began */
	STAT_CHECKS = 17,      /* sweeps that checked the tracked objects */
	STAT_PENDING = 18,     /* create events left pending for their return */
	STAT_SEEN = 19,        /* allocation events seen while attached, the gate
				  open or not: user space opens a window once
				  the target went a while without one */
	STAT_PAST_END = 20,    /* events (as STAT_OBJECTS) seen after the window
				  ended at its start's recurrence (window_mark) */
	STAT_MAX = 24,
};

struct arg_spec {
	__u8 kind;
	__u8 size;
	__u8 is_signed;
	__u8 pad;
	__u16 reg_off;
	__u16 pad2;
	__u32 pad3;
	__s64 val;
};

struct probe_spec {
	struct arg_spec args[3];
	__u32 kind;
	__u32 pad;
};

struct site_key {
	__u64 cls;  /* class name pointer, klass VALUE, or 0 */
	__u64 file; /* file name pointer, or 0 */
	__u32 line;
	__u32 kind;
};

struct class_key {
	__u64 cls;
	__u32 kind;
	__u32 pad;
};

struct counter {
	__u64 count;
	__u64 bytes;
};

/* The site this CPU counted last, and the events counted to it since it
 * became the last: a loop allocates from one site many times in a row,
 * and a key compare costs far less than a hash lookup (about 100 ns of a
 * ~1 us event on Debian's 3.1 array loop). Its count moves to `sites`
 * when another site comes; user space adds what is still here. seq is
 * odd while a count moves (and the slot changes sites), and grows by two
 * with every move: user space reads the slots, the map, the slots again,
 * and keeps a read in which no seq moved (else a run of a million events
 * could be seen twice, or not at all, for one refresh). */
struct last_site {
	struct site_key key;
	struct counter c;
	__u64 seq;
};

/* Set by the loader before loading. */
const volatile __u32 target_tgid = 0;
const volatile __u32 sample_period = 1;
/* 0: count by class only, without reading each event's file and line
 * (Ruby passes the line on its stack: a user-memory read, about 150 ns,
 * more than the rest of this program). */
const volatile __u32 want_sites = 1;

/* Allocation stacks: one in stack_period counted events (0: none) copies
 * the Ruby stack of the allocating thread for user space, which names its
 * frames with rbscope's walker reading the copy instead of the live
 * (already changed) memory. The running thread's execution context is
 * vm->ractor.main_ractor->threads.running_ec: the allocating thread holds
 * the GVL. Offsets come from the same layout the walker uses. */
const volatile __u32 stack_period = 0;
const volatile __u64 stk_vm = 0;
const volatile __u32 stk_main_ractor = 0;
const volatile __u32 stk_running_ec = 0;
const volatile __u32 stk_ec_vm_stack = 0;
const volatile __u32 stk_ec_vm_stack_size = 8;
const volatile __u32 stk_ec_cfp = 16;
const volatile __u32 stk_cfp_sp = 8;

/* Retained mode (objects created and still alive): every counted create
 * event of a heap object is left pending for its thread; the probe after
 * the allocation call (KIND_RETURN) pairs it with the new object's address
 * (rax) and tracks the object. When a GC's sweep begins (the first
 * gc__sweep__begin after gc__mark__begin: marking is over and its mark
 * bits decide what the sweep frees), every tracked object whose mark bit
 * is clear is dropped: it is garbage, and its slot may be reused by an
 * object nobody tracked. heap_align is HEAP_PAGE_ALIGN (0: no check),
 * mark_bits_off the offset of mark_bits in struct heap_page; a page
 * body's first word points at its struct heap_page, and an object's bit
 * is its offset in the body divided by the base slot size (40). */
const volatile __u32 retained = 0;
const volatile __u64 heap_align = 0;
const volatile __u32 mark_bits_off = 0;

#define BASE_SLOT 40
/* The tracked objects are an array (tracked[0, tracked_len)), which the
 * check at each sweep compacts: its cost is the objects', not the map's
 * size (a hash map's for_each walks every bucket: a million-entry map
 * cost 2 ms per GC, 8x a tight loop's time). User space sizes it before
 * loading (tracked_max). It is written without atomics: a process's
 * allocations and its GC run under Ruby's GVL, one thread at a time
 * (several ractors would break this; rbscope reads the main ractor's). */
const volatile __u32 tracked_max = 1;

struct pending {
	struct site_key key;
	__u64 bytes;
	__u64 id;
	__u32 site; /* the create probe's spec index */
	__u32 pad;
};

struct tracked_obj {
	struct site_key key;
	__u64 addr;  /* the object (its slot) */
	__u64 klass; /* RBasic.klass when allocated */
	__u64 bytes; /* the probe's payload bytes */
	__u64 id;    /* stack id, 0: no stack copied */
	/* The slot's flags and klass when Ruby's teardown began (the exit
	 * probe copies them: the process's memory goes with it). */
	__u64 end_flags;
	__u64 end_klass;
	__u32 ended; /* the two above are set */
	__u32 pad;
};

/* Keeps the types in BTF for bpf2go. */
const struct tracked_obj *unused_tracked __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pending);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* set by user space: tracked_max */
	__type(key, __u32);
	__type(value, struct tracked_obj);
} tracked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tracked_len SEC(".maps");

/* [0] != 0: a GC's marking began and its sweep has not: check the
 * tracked objects when it does. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} mark_pending SEC(".maps");

#define EC_MAX 512
#define CF_MAX 8192
#define VS_MAX 16384

struct stack_event {
	__u64 ec;   /* address of the execution context (EC_MAX bytes copied) */
	__u64 cfp;  /* address of the innermost control frame (cf_len bytes copied) */
	__u64 vs;   /* address of the copied top of the VM value stack (vs_len bytes) */
	__u64 cls;  /* as in site_key */
	__u64 file;
	__u64 bytes;
	__u64 id;   /* retained mode: the tracked object's stack id (0: none) */
	__u32 line;
	__u32 kind;
	__u32 tid;
	__u32 cf_len;
	__u32 vs_len;
	__u32 pad;
	__u8 ec_data[EC_MAX];
	__u8 cf[CF_MAX];
	__u8 vsd[VS_MAX];
};

/* Keeps the type in BTF for bpf2go. */
const struct stack_event *unused_stack_event __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SPECS);
	__type(key, __u32);
	__type(value, struct probe_spec);
} probe_specs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_SITES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct site_key);
	__type(value, struct counter);
} sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_CLASSES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct class_key);
	__type(value, struct counter);
} classes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* gate[0] != 0: count allocation events. User space opens the gate after
 * attaching and reading Ruby's own allocation counter, and closes it before
 * reading the counter again and detaching, so that the events counted and
 * the counter's growth cover exactly the same window (attaching and
 * detaching take milliseconds, during which the probes fire but are not
 * counted). Exact mode leaves it open. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gate SEC(".maps");

/* last_tid[0]: the thread of the last allocation event seen while attached.
 * User space takes a pause in the events for the target idling only when
 * that thread is not runnable: under CPU contention a thread preempted in
 * the middle of a burst of allocations makes the same pause. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} last_tid SEC(".maps");

/* window_mark ends a counting window where the next one like it would
 * begin: at its first counted event the program keeps the window's
 * signature (the identity of that event and of the event seen just before
 * it, the gate closed); once user space arms the mark (the window's time
 * is up), the first event whose identity and predecessor's are the
 * signature's ends the window: it and every event after it are not counted
 * (STAT_PAST_END counts them, for the counter's value at the end). A
 * window that opened between two bursts of allocations (a job, a request,
 * a loop's step) then ends between two: it holds whole bursts even when
 * the probes slow the target so much that it never idles while they are
 * attached, where a window ending on time kept the heads of bursts and
 * lost their tails (+10 % for a leak made at the start of each step, Ruby
 * 3.4.5 on a VM whose traps cost 30 us). User space marks a window only
 * when it opened after a burst: in retained mode, an event seen, then the
 * target idle (a window whose first event has no predecessor seen is not
 * marked); in the default mode, the target idle, the predecessor then
 * learned (learn, first_preds) where none was seen. Elsewhere the mark
 * would bias: a window opened at a random point of a busy loop starts at
 * some pair of events inside a step and, ended at that pair's next
 * occurrence after its time is up, keeps whole the step that pair's
 * longest gap spans. Identities are the probe site and the event's class,
 * file and line. */
enum mark_state {
	MARK_OFF = 0,   /* no mark: windows end on time (user space) */
	MARK_FRESH = 1, /* the next counted event takes the signature */
	MARK_OPEN = 2,  /* signature taken */
	MARK_ARMED = 3, /* the next event like the signature's ends the window */
	MARK_ENDED = 4, /* the window ended: nothing more is counted */
};

#define MARK_FIRSTS 4

struct window_mark {
	__u64 prev;      /* identity of the last event seen */
	__u64 sig_prev;  /* the signature: the event before the window's first */
	__u64 sig_first; /* ... and the window's first */
	__u32 state;
	__u32 learn;     /* no predecessor seen: keep the mark open, and count
			    the predecessors of the recurrences of the
			    window's first events (first_preds) */
	__u64 firsts[MARK_FIRSTS]; /* the window's first distinct events */
	__u32 nfirsts;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct window_mark);
} window_mark SEC(".maps");

/* first_preds counts, in a window whose first event had no predecessor
 * seen (it opened while the target idled, see window_mark's learn), the
 * identities of the events just before each recurrence of each of the
 * window's first MARK_FIRSTS distinct events: user space ends the window
 * at the rarest (the event that ends a burst, where the window began
 * one). Several, because a window's very first event may never recur (a
 * line read before a loop). */
struct pred_key {
	__u64 pred;  /* the predecessor's identity */
	__u32 first; /* index in window_mark.firsts */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct pred_key);
	__type(value, __u64);
} first_preds SEC(".maps");

/* Ruby's own allocation counter at exit. Once the process is gone its
 * memory cannot be read, so the program copies, at the entry of Ruby's
 * teardown (ruby_vm_destruct: after the last Ruby code and finalizer ran,
 * before the object space is freed), the ranges user space names in
 * exit_ranges (the counter's words, or the blocks a calibration is still
 * choosing among) into exit_copy, and says when in exit_info. User space
 * rewrites the ranges between two changes of exit_gen (odd while it
 * writes); the program records the generation it saw before and after
 * copying, so that a copy taken across a rewrite is never used. The
 * program only reads the target's memory. */
#define EXIT_RANGES 256
#define EXIT_RANGE_MAX 2048

struct exit_range {
	__u64 addr;
	__u32 len; /* 0: no more ranges */
	__u32 pad;
};

struct exit_words {
	__u8 data[EXIT_RANGE_MAX];
};

struct exit_state {
	__u64 gen_before; /* exit_gen when the copy began */
	__u64 gen_after;  /* ... and when it ended */
	__u64 ns;         /* bpf_ktime_get_ns() at the copy */
	__u32 copied;     /* ranges copied */
	__u32 failed;     /* ranges whose read failed */
	__u32 tid;
	__u32 done;       /* set last (atomically): the fields above are final */
	/* The names of this CPU's last site (the exiting thread's last
	 * allocations, most likely): a site first counted just before the
	 * exit, whose names user space has had no time to read. */
	__u64 last_cls;  /* class name pointer (object__create), or 0 */
	__u64 last_file; /* file name pointer, or 0 */
	char cls_name[256];
	char file_name[256];
};

/* Keeps the types in BTF for bpf2go. */
const struct exit_range *unused_exit_range __attribute__((unused));
const struct exit_state *unused_exit_state __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EXIT_RANGES);
	__type(key, __u32);
	__type(value, struct exit_range);
} exit_ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} exit_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EXIT_RANGES);
	__type(key, __u32);
	__type(value, struct exit_words);
} exit_copy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct exit_state);
} exit_info SEC(".maps");

/* One record (exit_info's ns) when the copy is taken: it wakes user space
 * at once, to read what names it still lacks while the process tears
 * down. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} exit_events SEC(".maps");

/* Start times of the GC phase in progress: [0] mark, [1] sweep. Ruby's
 * GC runs one phase at a time per process, but may migrate CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} gc_start SEC(".maps");

/* Symbols mode: the klass each thread's Class#new is allocating. Its
 * allocator may call an allocation function we also hook (String.new ->
 * rb_wb_protected_newobj_of(String)); that call is the same object and is
 * not counted again. T_OBJECT allocators are inlined and call nothing we
 * hook, so Class#new is where those objects are counted at all. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} pending_new SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct last_site);
} last_site SEC(".maps");

/* Counted events left before the next stack copy, per CPU: a countdown
 * instead of a random draw per event (a helper call and a division on
 * every allocation), reset to a random gap of mean stack_period. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} stack_countdown SEC(".maps");

static __always_inline void stat_add(__u32 slot, __u64 v)
{
	__u64 *p = bpf_map_lookup_elem(&stats, &slot);
	if (p)
		*p += v;
}

/* reg reads the register at byte offset off of pt_regs. The context is
 * read directly, one constant offset per case (the verifier refuses a
 * variable offset into it): no helper call per argument. Each load is
 * written in assembly so that the compiler cannot fold the cases back
 * into one load at ctx + off. */
#define REG_CASE(o)                                                            \
	case o:                                                                \
		asm volatile("%0 = *(u64 *)(%1 + " #o ")" : "=r"(x) : "r"(ctx)); \
		break;

static __always_inline int reg(struct pt_regs *ctx, __u16 off, __u64 *v)
{
	__u64 x = 0;
	switch (off) {
	REG_CASE(0) REG_CASE(8) REG_CASE(16) REG_CASE(24) REG_CASE(32)
	REG_CASE(40) REG_CASE(48) REG_CASE(56) REG_CASE(64) REG_CASE(72)
	REG_CASE(80) REG_CASE(88) REG_CASE(96) REG_CASE(104) REG_CASE(112)
	REG_CASE(128) REG_CASE(152)
	default:
		return -1;
	}
	*v = x;
	return 0;
}

static __always_inline int read_arg(struct pt_regs *ctx, const struct arg_spec *a, __u64 *out)
{
	__u64 v = 0;
	__u32 shift;

	switch (a->kind) {
	case ARG_CONST:
		v = a->val;
		break;
	case ARG_REG:
		if (reg(ctx, a->reg_off, &v))
			return -1;
		break;
	case ARG_MEM:
		if (reg(ctx, a->reg_off, &v))
			return -1;
		if (bpf_probe_read_user(&v, sizeof(v), (void *)(v + a->val)))
			return -1;
		break;
	default:
		*out = 0;
		return 0;
	}
	if (a->size < 8 && a->size > 0) {
		shift = 64 - 8 * (__u32)a->size;
		v <<= shift;
		if (a->is_signed)
			v = (__u64)((__s64)v >> shift);
		else
			v >>= shift;
	}
	*out = v;
	return 0;
}


/* marked reports whether the object at addr has its mark bit set (1 when
 * the bits cannot be read: kept). */
static __always_inline int marked(__u64 addr)
{
	__u64 body = addr & ~(heap_align - 1);
	__u64 n = (addr - body) / BASE_SLOT;
	__u64 page = 0, w = 0;
	if (bpf_probe_read_user(&page, sizeof(page), (void *)body) || !page)
		return 1;
	if (bpf_probe_read_user(&w, sizeof(w), (void *)(page + mark_bits_off + (n / 64) * 8)))
		return 1;
	return (w >> (n % 64)) & 1;
}

struct check_ctx {
	__u32 kept; /* objects kept so far: where the next one goes */
	__u32 died;
};

/* The check's running state (a map value, not the caller's stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct check_ctx);
} check_state SEC(".maps");

/* check_at keeps tracked[i] (moved down to tracked[kept]) if marked. */
static long check_at(__u64 i, void *unused)
{
	__u32 idx = (__u32)i, z = 0;
	struct check_ctx *c = bpf_map_lookup_elem(&check_state, &z);
	if (!c)
		return 1;
	struct tracked_obj *v = bpf_map_lookup_elem(&tracked, &idx);
	if (!v)
		return 1;
	if (!marked(v->addr)) {
		c->died++;
		return 0;
	}
	if (c->kept != idx) {
		__u32 k = c->kept;
		struct tracked_obj *d = bpf_map_lookup_elem(&tracked, &k);
		if (d)
			__builtin_memcpy(d, v, sizeof(*d));
	}
	c->kept++;
	return 0;
}

static __attribute__((noinline)) void check_tracked(void)
{
	__u32 z = 0;
	__u32 *len = bpf_map_lookup_elem(&tracked_len, &z);
	if (!len)
		return;
	struct check_ctx *c = bpf_map_lookup_elem(&check_state, &z);
	if (!c)
		return;
	c->kept = 0;
	c->died = 0;
	bpf_loop(*len, check_at, 0, 0);
	*len = c->kept;
	stat_add(STAT_DIED, c->died);
	stat_add(STAT_CHECKS, 1);
}

static __always_inline void gc_phase(__u32 kind)
{
	if (retained && heap_align) {
		__u32 z = 0;
		__u32 *mp = bpf_map_lookup_elem(&mark_pending, &z);
		if (mp) {
			if (kind == KIND_GC_MARK_BEGIN)
				*mp = 1;
			else if (kind == KIND_GC_SWEEP_BEGIN && *mp) {
				*mp = 0;
				check_tracked();
			}
		}
	}

	__u32 slot = (kind == KIND_GC_MARK_BEGIN || kind == KIND_GC_MARK_END) ? 0 : 1;
	__u64 *start = bpf_map_lookup_elem(&gc_start, &slot);
	__u64 now = bpf_ktime_get_ns();

	if (!start)
		return;
	if (kind == KIND_GC_MARK_BEGIN || kind == KIND_GC_SWEEP_BEGIN) {
		*start = now;
		return;
	}
	if (*start == 0 || now < *start)
		return;
	if (slot == 0) {
		stat_add(STAT_GC_MARK_NS, now - *start);
		stat_add(STAT_GC_MARK_COUNT, 1);
	} else {
		stat_add(STAT_GC_SWEEP_NS, now - *start);
		stat_add(STAT_GC_SWEEP_COUNT, 1);
	}
	*start = 0;
}

/* bump adds n events of the given bytes to key's counter; nonzero when
 * the map is full. */
static __always_inline int bump(void *map, const void *key, __u64 n, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(map, key);
	if (c) {
		c->count += n;
		c->bytes += bytes;
		return 0;
	}
	struct counter init = {.count = n, .bytes = bytes};
	if (!bpf_map_update_elem(map, key, &init, BPF_NOEXIST)) {
		stat_add(STAT_KEYS, 1);
		return 0;
	}
	/* Another CPU may have inserted the same key first (EEXIST); the
	 * values are per CPU, so this CPU's slot is still to be counted. */
	c = bpf_map_lookup_elem(map, key);
	if (c) {
		c->count += n;
		c->bytes += bytes;
		return 0;
	}
	return -1; /* the map is full */
}

/* is_last: the CPU's last site is (cls, file, line, kind), and counts. The
 * fields are compared as values: no key is built on the stack. */
static __always_inline int is_last(const struct last_site *ls, __u64 cls, __u64 file, __u32 line, __u32 kind)
{
	return ls->c.count && ls->key.cls == cls && ls->key.file == file && ls->key.line == line && ls->key.kind == kind;
}

/* flush moves a last site's count to the site map (the class map if that
 * is full). */
static __always_inline void flush(const struct last_site *ls)
{
	if (!ls->c.count)
		return;
	if (bump(&sites, &ls->key, ls->c.count, ls->c.bytes)) {
		struct class_key ck = {.cls = ls->key.cls, .kind = ls->key.kind};
		stat_add(STAT_SITES_FULL, ls->c.count);
		if (bump(&classes, &ck, ls->c.count, ls->c.bytes))
			stat_add(STAT_CLASSES_FULL, ls->c.count);
	}
}

static __always_inline __u64 read_u64(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* capture copies the allocating thread's Ruby stack into the ring buffer. */
static __always_inline void capture(const struct site_key *sk, __u64 bytes, __u64 id)
{
	__u64 ractor = read_u64(stk_vm + stk_main_ractor);
	__u64 ec = read_u64(ractor + stk_running_ec);
	if (!ec)
		return;
	struct stack_event *e = bpf_ringbuf_reserve(&stacks, sizeof(*e), 0);
	if (!e) {
		stat_add(STAT_STACKS_LOST, 1);
		return;
	}
	e->ec = ec;
	e->cls = sk->cls;
	e->file = sk->file;
	e->line = sk->line;
	e->kind = sk->kind;
	e->bytes = bytes;
	e->id = id;
	e->tid = (__u32)bpf_get_current_pid_tgid();
	bpf_probe_read_user(e->ec_data, EC_MAX, (void *)ec);
	__u64 vm_stack = read_u64(ec + stk_ec_vm_stack);
	__u64 size = read_u64(ec + stk_ec_vm_stack_size);
	__u64 cfp = read_u64(ec + stk_ec_cfp);
	__u64 end = vm_stack + size * 8;
	e->cfp = cfp;
	e->cf_len = 0;
	e->vs_len = 0;
	if (cfp > vm_stack && cfp < end) {
		__u64 n = end - cfp;
		if (n > CF_MAX)
			n = CF_MAX;
		n &= 2 * CF_MAX - 1;
		if (n > CF_MAX)
			n = CF_MAX;
		if (!bpf_probe_read_user(e->cf, n, (void *)cfp))
			e->cf_len = n;
		/* The top of the value stack, where the inner frames'
		 * environments are. */
		__u64 sp = read_u64(cfp + stk_cfp_sp);
		if (sp > vm_stack && sp <= cfp) {
			__u64 from = sp > vm_stack + VS_MAX ? sp - VS_MAX : vm_stack;
			__u64 m = sp - from;
			m &= 2 * VS_MAX - 1;
			if (m > VS_MAX)
				m = VS_MAX;
			e->vs = from;
			if (!bpf_probe_read_user(e->vsd, m, (void *)from))
				e->vs_len = m;
		}
	}
	stat_add(STAT_STACKS, 1);
	bpf_ringbuf_submit(e, 0);
}

/* The program's own stack stays under the kernel's threshold for a
 * private BPF stack (64 bytes, Linux 6.13+): on one, every user-memory
 * read lands in per-CPU memory, which hardened usercopy checks as a heap
 * object (about 40 ns more per event: bench-alloc, prog 236 -> 197 ns on
 * the array loop, Linux 6.18). What needs more
 * stack and runs rarely is in the functions below, called, not inlined. */

/* new_site makes a site the CPU's last one, moving the count of the one
 * before to the maps. line_kind: the kind in the high 32 bits, the line
 * in the low. */
static __attribute__((noinline)) void new_site(struct last_site *ls, __u64 cls, __u64 file, __u64 line_kind, __u64 bytes)
{
	struct site_key sk = {.cls = cls, .file = file, .line = (__u32)line_kind, .kind = line_kind >> 32};

	/* An anonymous class's name ("#<Class:0x...>") is a temporary string
	 * made for this one event: its pointer is unique and the memory is
	 * soon reused. Count those under one marker instead (2 bytes read,
	 * not a string copy). Checked only when the key is not the last
	 * one: a named class's name stays where it is. */
	if (sk.kind == KIND_OBJECT && cls) {
		char p[2] = {};
		if (!bpf_probe_read_user(p, sizeof(p), (void *)cls) && p[0] == '#' && p[1] == '<') {
			sk.cls = ANON_CLASS;
			if (is_last(ls, sk.cls, sk.file, sk.line, sk.kind)) {
				ls->c.count++;
				ls->c.bytes += bytes;
				return;
			}
		}
	}
	ls->seq++;
	flush(ls);
	ls->key = sk;
	ls->c.count = 1;
	ls->c.bytes = bytes;
	ls->seq++;
}

/* count_down copies the stack of one in stack_period counted events,
 * attributed to the CPU's last site (the event's). */
static __attribute__((noinline)) __u64 count_down(struct last_site *ls, __u64 bytes)
{
	__u32 zero = 0;
	__u32 *left = bpf_map_lookup_elem(&stack_countdown, &zero);
	if (!left)
		return 0;
	if (*left > 1) {
		(*left)--;
		return 0;
	}
	/* The next gap: uniform in [1, 2*stack_period-1]. */
	*left = 1 + bpf_get_prandom_u32() % (2 * stack_period - 1);
	/* A stack id for the retained view: unique per event (the time,
	 * and the CPU in the low byte). */
	__u64 id = bpf_ktime_get_ns() << 8 | (bpf_get_smp_processor_id() & 0xff);
	capture(&ls->key, bytes, id);
	return id;
}

/* set_pending leaves the create event for the thread's allocation call
 * to return (retained mode). */
static __attribute__((noinline)) void set_pending(const struct last_site *ls, __u32 site, __u64 bytes, __u64 id)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending p = {.key = ls->key, .bytes = bytes, .id = id, .site = site};
	bpf_map_update_elem(&pending, &tid, &p, BPF_ANY);
	stat_add(STAT_PENDING, 1);
}

/* on_return pairs the thread's pending create event with the object its
 * allocation call returned (rax), if it comes from one of this return
 * site's probes (spec args' val: index + 1, 0 unused), and tracks it. */
static __attribute__((noinline)) void on_return(struct pt_regs *ctx, const struct probe_spec *spec)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending *p = bpf_map_lookup_elem(&pending, &tid);
	if (!p)
		return;
	__u64 s = (__u64)p->site + 1;
	if (s != (__u64)spec->args[0].val && s != (__u64)spec->args[1].val && s != (__u64)spec->args[2].val)
		return;
	struct tracked_obj t = {.key = p->key, .bytes = p->bytes, .id = p->id};
	__u64 obj = 0;
	asm volatile("%0 = *(u64 *)(%1 + 80)" : "=r"(obj) : "r"(ctx)); /* rax */
	__u64 hdr[2] = {};
	if (!obj || (obj & 7) || bpf_probe_read_user(hdr, sizeof(hdr), (void *)obj)) {
		stat_add(STAT_RET_BAD, 1);
		return;
	}
	__u32 typ = hdr[0] & 0x1f;
	__u32 want = 0;
	switch (t.key.kind) {
	case KIND_STRING:
		want = 0x05;
		break;
	case KIND_ARRAY:
		want = 0x07;
		break;
	case KIND_HASH:
		want = 0x08;
		break;
	}
	if (typ == 0 || !hdr[1] || (want && typ != want)) {
		stat_add(STAT_RET_BAD, 1);
		return;
	}
	/* Paired: later calls on the probe's path find nothing pending. A
	 * call that returned something else (a helper's flag) left the event
	 * pending for the allocation that follows. */
	bpf_map_delete_elem(&pending, &tid);
	t.klass = hdr[1];
	t.addr = obj;
	__u32 z = 0;
	__u32 *len = bpf_map_lookup_elem(&tracked_len, &z);
	if (!len)
		return;
	__u32 i = *len;
	struct tracked_obj *slot = i < tracked_max ? bpf_map_lookup_elem(&tracked, &i) : 0;
	if (!slot) {
		stat_add(STAT_TRACK_FULL, 1);
		return;
	}
	__builtin_memcpy(slot, &t, sizeof(t));
	*len = i + 1;
	stat_add(STAT_TRACKED, 1);
}

/* snap_at copies tracked[i]'s slot header at exit. */
static long snap_at(__u64 i, void *ctx)
{
	__u32 idx = (__u32)i;
	struct tracked_obj *v = bpf_map_lookup_elem(&tracked, &idx);
	if (!v)
		return 1;
	__u64 hdr[2] = {};
	if (bpf_probe_read_user(hdr, sizeof(hdr), (void *)v->addr))
		return 0;
	v->end_flags = hdr[0];
	v->end_klass = hdr[1];
	v->ended = 1;
	return 0;
}

/* copy_at_exit copies exit_ranges into exit_copy (see exit_info). */
static __attribute__((noinline)) void copy_at_exit(void)
{
	__u32 zero = 0;
	struct exit_state *st = bpf_map_lookup_elem(&exit_info, &zero);
	__u64 *gen = bpf_map_lookup_elem(&exit_gen, &zero);
	if (!st || !gen)
		return;
	__u64 before = *gen;
	__u32 copied = 0, failed = 0;
	for (__u32 i = 0; i < EXIT_RANGES; i++) {
		struct exit_range *r = bpf_map_lookup_elem(&exit_ranges, &i);
		struct exit_words *w = bpf_map_lookup_elem(&exit_copy, &i);
		if (!r || !w || !r->len)
			break;
		__u32 n = r->len;
		if (n > EXIT_RANGE_MAX)
			n = EXIT_RANGE_MAX;
		if (bpf_probe_read_user(w->data, n, (void *)r->addr))
			failed++;
		else
			copied++;
	}
	struct last_site *ls = bpf_map_lookup_elem(&last_site, &zero);
	st->last_cls = 0;
	st->last_file = 0;
	if (ls && ls->c.count) {
		if (ls->key.kind == KIND_OBJECT && ls->key.cls > ANON_CLASS &&
		    bpf_probe_read_user_str(st->cls_name, sizeof(st->cls_name), (void *)ls->key.cls) > 0)
			st->last_cls = ls->key.cls;
		if (ls->key.file &&
		    bpf_probe_read_user_str(st->file_name, sizeof(st->file_name), (void *)ls->key.file) > 0)
			st->last_file = ls->key.file;
	}
	__u32 *len = bpf_map_lookup_elem(&tracked_len, &zero);
	if (retained && len)
		bpf_loop(*len, snap_at, 0, 0);
	st->gen_before = before;
	st->gen_after = *gen;
	st->ns = bpf_ktime_get_ns();
	st->copied = copied;
	st->failed = failed;
	st->tid = (__u32)bpf_get_current_pid_tgid();
	__sync_fetch_and_add(&st->done, 1);
	__u64 *ev = bpf_ringbuf_reserve(&exit_events, sizeof(*ev), 0);
	if (ev) {
		*ev = st->ns;
		bpf_ringbuf_submit(ev, 0);
	}
}

/* event_id is an event's identity for window_mark: its probe site, and
 * its class (objects), file and line; never 0. */
static __always_inline __u64 event_id(__u32 idx, __u32 kind, __u64 cls, __u64 file, __u64 line)
{
	__u64 h = (__u64)idx * 0x9e3779b97f4a7c15ULL;
	if (kind == KIND_OBJECT || kind == KIND_NEWOBJ || kind == KIND_CLASS_NEW)
		h ^= cls * 0xc2b2ae3d27d4eb4fULL;
	h ^= file * 0x165667b19e3779f9ULL;
	h ^= line * 0x27d4eb2f165667c5ULL;
	return h | 1;
}

/* seen_closed keeps, while the gate is closed, the identity of each event
 * seen as the mark's predecessor (the window's first event's). */
static __attribute__((noinline)) void seen_closed(struct pt_regs *ctx, const struct probe_spec *spec, __u32 idx, struct window_mark *m)
{
	__u64 a0 = 0, a1 = 0, a2 = 0;
	__u32 kind = spec->kind;
	if (kind == KIND_NEWOBJ || kind == KIND_CLASS_NEW) {
		/* Symbols mode: which of these are counted (not imemos, not
		 * the allocation Class#new already counted) is known only
		 * with the gate open: no predecessor. */
		m->prev = 0;
		return;
	}
	read_arg(ctx, &spec->args[0], &a0);
	if (want_sites) {
		read_arg(ctx, &spec->args[1], &a1);
		read_arg(ctx, &spec->args[2], &a2);
	}
	m->prev = event_id(idx, kind, a0, a1, a2);
}

/* learn_pred counts, for an event id of a learning window (see
 * first_preds), its predecessor when it recurs one of the window's first
 * events, or takes it as one of those. Not inlined: its key would take
 * the hot path past its stack budget (TestHotPathOffPrivateStack). */
static __attribute__((noinline)) void learn_pred(struct window_mark *m, __u64 id)
{
	__u32 n = m->nfirsts;
	int hit = -1;
#pragma unroll
	for (int i = 0; i < MARK_FIRSTS; i++)
		if (hit < 0 && i < n && m->firsts[i] == id)
			hit = i;
	if (hit < 0) {
		if (n < MARK_FIRSTS) {
			m->firsts[n & (MARK_FIRSTS - 1)] = id;
			m->nfirsts = n + 1;
		}
		return;
	}
	struct pred_key k = {.pred = m->prev, .first = hit};
	__u64 *c = bpf_map_lookup_elem(&first_preds, &k);
	if (c) {
		__sync_fetch_and_add(c, 1);
		return;
	}
	__u64 one = 1;
	bpf_map_update_elem(&first_preds, &k, &one, BPF_NOEXIST);
}

/* check_pid: the link does not filter by process itself (a perf-event
 * uprobe follows one task; a uprobe_multi link with a PID runs the
 * program only in that process's threads). */
static __always_inline int handle(struct pt_regs *ctx, int check_pid)
{
	if (check_pid && (__u32)(bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;

	__u32 idx = (__u32)bpf_get_attach_cookie(ctx);
	struct probe_spec *spec = bpf_map_lookup_elem(&probe_specs, &idx);
	if (!spec)
		return 0;
	__u32 kind = spec->kind;
	if (kind == KIND_RETURN) {
		on_return(ctx, spec);
		return 0;
	}
	if (kind >= KIND_GC_MARK_BEGIN) {
		if (kind == KIND_EXIT) {
			/* Another process running the same binary may reach
			 * it through a per-site link. */
			if ((__u32)(bpf_get_current_pid_tgid() >> 32) == target_tgid)
				copy_at_exit();
			return 0;
		}
		gc_phase(kind);
		return 0;
	}

	stat_add(STAT_SEEN, 1);
	__u32 zero = 0;
	__u32 *lt = bpf_map_lookup_elem(&last_tid, &zero);
	if (lt)
		*lt = (__u32)bpf_get_current_pid_tgid();
	__u32 *open = bpf_map_lookup_elem(&gate, &zero);
	if (!open)
		return 0;
	struct window_mark *m = bpf_map_lookup_elem(&window_mark, &zero);
	if (!*open) {
		if (m && m->state != MARK_OFF)
			seen_closed(ctx, spec, idx, m);
		return 0;
	}

	__u64 a0 = 0, a1 = 0, a2 = 0;
	if (kind == KIND_NEWOBJ) {
		/* Symbols mode: args[1] is the flags. An imemo's klass slot
		 * holds no class of its: Ruby 3.4's rb_imemo_new passes its v0
		 * (a call cache's receiver class) as klass through the
		 * exported allocation functions. Skipped before the Class#new
		 * pairing, which it must not consume. */
		if (read_arg(ctx, &spec->args[0], &a0) || read_arg(ctx, &spec->args[1], &a1)) {
			stat_add(STAT_ARG_ERRORS, 1);
			return 0;
		}
		if ((a1 & T_MASK) == T_IMEMO)
			return 0;
		a1 = 0;
	} else if (read_arg(ctx, &spec->args[0], &a0) ||
		   (want_sites && (read_arg(ctx, &spec->args[1], &a1) || read_arg(ctx, &spec->args[2], &a2)))) {
		stat_add(STAT_ARG_ERRORS, 1);
		return 0;
	}

	/* Before sampling, so that the pairing holds whatever is sampled. */
	if (kind == KIND_CLASS_NEW || kind == KIND_NEWOBJ) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		if (kind == KIND_CLASS_NEW) {
			bpf_map_update_elem(&pending_new, &tid, &a0, BPF_ANY);
			kind = KIND_NEWOBJ;
		} else {
			__u64 *p = bpf_map_lookup_elem(&pending_new, &tid);
			if (p && *p == a0) {
				*p = 0;
				return 0;
			}
		}
	}

	if (m && m->state != MARK_OFF) {
		__u64 id = event_id(idx, spec->kind, a0, a1, a2);
		switch (m->state) {
		case MARK_FRESH:
			m->sig_prev = m->prev;
			m->sig_first = id;
			m->firsts[0] = id;
			m->nfirsts = 1;
			/* No predecessor seen (the window opened as the
			 * probes were attached): no mark, unless it is to
			 * be learned. */
			m->state = m->prev || m->learn ? MARK_OPEN : MARK_OFF;
			break;
		case MARK_OPEN:
			if (!m->sig_prev && m->prev)
				learn_pred(m, id);
			break;
		case MARK_ARMED:
			if (id == m->sig_first && m->prev == m->sig_prev)
				m->state = MARK_ENDED;
			break;
		}
		if (m->state == MARK_ENDED) {
			if (kind != KIND_SYMBOL)
				stat_add(STAT_PAST_END, 1);
			return 0;
		}
		m->prev = id;
	}

	stat_add(STAT_EVENTS, 1);
	if (kind != KIND_SYMBOL)
		stat_add(STAT_OBJECTS, 1);
	if (sample_period > 1 && bpf_get_prandom_u32() % sample_period != 0)
		return 0;
	stat_add(STAT_SAMPLED, 1);

	__u64 cls = 0, bytes = 0;
	switch (kind) {
	case KIND_OBJECT:
	case KIND_NEWOBJ:
		cls = a0;
		break;
	case KIND_STRING:
		/* The length in bytes of the new string. */
		if ((__s64)a0 > 0)
			bytes = a0;
		break;
	case KIND_ARRAY:
		/* Elements are VALUEs: 8 bytes each on 64-bit. */
		if ((__s64)a0 > 0)
			bytes = a0 * 8;
		break;
	}
	/* Per-class totals are the sums of the sites, taken in user space;
	 * the class map only catches events whose site did not fit. */
	struct last_site *ls = bpf_map_lookup_elem(&last_site, &zero);
	if (!ls)
		return 0;
	if (is_last(ls, cls, a1, (__u32)a2, kind)) {
		ls->c.count++;
		ls->c.bytes += bytes;
	} else {
		new_site(ls, cls, a1, (__u64)kind << 32 | (__u32)a2, bytes);
	}
	__u64 id = 0;
	if (stack_period)
		id = count_down(ls, bytes);
	if (retained && kind != KIND_SYMBOL && kind != KIND_NEWOBJ)
		set_pending(ls, idx, bytes, id);
	return 0;
}

/* Attached with one uprobe_multi link for all sites (Linux 6.6+). */
SEC("uprobe.multi")
int ruby_alloc_multi(struct pt_regs *ctx)
{
	return handle(ctx, 0);
}

/* Attached with one perf-event uprobe per site, on older kernels. */
SEC("uprobe")
int ruby_alloc(struct pt_regs *ctx)
{
	return handle(ctx, 1);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
