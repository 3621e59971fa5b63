/* GCClock.wall_ns: the wall-clock time (CLOCK_MONOTONIC) Ruby spent
 * between gc_enter and gc_exit since GCClock.start, measured with the
 * RUBY_INTERNAL_EVENT_GC_ENTER / GC_EXIT hooks (enabled by GCClock.start,
 * which walks the heap: call it before the measured part, then
 * GCClock.reset), which gc.c fires right
 * after setting and right before clearing rb_objspace.flags.during_gc.
 * A test's wall-clock truth for the GC share (GC.stat(:time) is CPU time). */
#include <ruby.h>
#include <ruby/debug.h>
#include <time.h>

static long long entered_ns, total_ns;
static VALUE hook;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_gc(VALUE tpval, void *data) {
    rb_trace_arg_t *arg = rb_tracearg_from_tracepoint(tpval);
    if (rb_tracearg_event_flag(arg) == RUBY_INTERNAL_EVENT_GC_ENTER) {
        entered_ns = now_ns();
    } else if (entered_ns) {
        total_ns += now_ns() - entered_ns;
        entered_ns = 0;
    }
}

static VALUE start(VALUE self) {
    if (NIL_P(hook)) {
        hook = rb_tracepoint_new(0, RUBY_INTERNAL_EVENT_GC_ENTER | RUBY_INTERNAL_EVENT_GC_EXIT, on_gc, NULL);
        rb_gc_register_address(&hook);
    }
    total_ns = 0;
    rb_tracepoint_enable(hook);
    return Qnil;
}

static VALUE reset(VALUE self) { total_ns = 0; return Qnil; }

static VALUE wall_ns(VALUE self) { return LL2NUM(total_ns); }

void Init_gcclock(void) {
    VALUE m = rb_define_module("GCClock");
    hook = Qnil;
    rb_define_module_function(m, "start", start, 0);
    rb_define_module_function(m, "reset", reset, 0);
    rb_define_module_function(m, "wall_ns", wall_ns, 0);
}
