/* Structs shaped like Ruby's VM structs, for the DWARF extractor's tests:
 * anonymous unions and structs, bitfields, nested named members, typedef
 * chains, arrays, pointers to incomplete types. */
#include <stdint.h>

typedef uintptr_t VALUE;
typedef VALUE ID;
typedef VALUE rb_atomic_t_base;
typedef rb_atomic_t_base rb_atomic_t; /* typedef chain */
struct rb_incomplete;                 /* never defined here */
typedef struct rb_iseq_struct rb_iseq_t;

struct RBasic {
	VALUE flags;
	const VALUE klass;
};

struct RString {
	struct RBasic basic;
	union {
		struct {
			long len;
			char *ptr;
			union {
				long capa;
				VALUE shared;
			} aux;
		} heap;
		struct {
			char ary[24];
		} embed;
	} as;
};

typedef struct rb_control_frame_struct {
	const VALUE *pc;
	VALUE *sp;
	const rb_iseq_t *iseq;
	VALUE self;
	const VALUE *ep;
	const void *block_code;
	VALUE *__bp__;
	void *jit_return;
} rb_control_frame_t;

enum rb_thread_status { THREAD_RUNNABLE, THREAD_STOPPED, THREAD_STOPPED_FOREVER, THREAD_KILLED };

struct rb_thread_struct {
	struct { void *next, *prev; } lt_node;
	VALUE self;
	struct rb_incomplete *ractor;
	int tid;
	enum rb_thread_status status : 2;
	unsigned locking_native_thread : 1;
	unsigned pending_interrupt_queue_checked : 1;
	unsigned int wide : 27;
	uint64_t across : 40;
	union {
		struct { VALUE func; int argc; };
		VALUE proc;
	};
	struct {
		union { VALUE a; int b; };
		short s : 3;
	} nested;
	rb_atomic_t interrupt_flag;
	VALUE name;
	char flex[];
};

typedef struct {
	ID last_id;
	VALUE str_sym;
	VALUE ids;
	VALUE dsymbol_fstr_hash;
} rb_symbols_t;

struct rb_method_definition_struct {
	unsigned int type : 4;
	int alias_count : 27;
	int complemented_count : 28;
	unsigned int no_redef_warning : 1;
	union {
		struct { VALUE (*func)(void); void *invoker; int argc; } cfunc;
		struct { const rb_iseq_t *iseqptr; void *cref; } iseq;
	} body;
	ID original_id;
	uintptr_t method_serial;
};

struct matrix { int cells[3][4]; double d; };

struct RBasic g_basic;
struct RString g_string;
rb_control_frame_t g_cfp;
struct rb_thread_struct g_thread;
rb_symbols_t g_symbols;
struct rb_method_definition_struct g_def;
struct matrix g_matrix;
