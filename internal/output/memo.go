package output

import (
	"github.com/rbscope/rbscope/internal/stack"
)

// memo remembers one value per key, made by mk on first use: every format
// describes each distinct frame (and function, line, label) once, then
// looks it up.
type memo[K comparable, V any] struct {
	m  map[K]V
	mk func(K) V
}

func newMemo[K comparable, V any](mk func(K) V) *memo[K, V] {
	return &memo[K, V]{m: make(map[K]V), mk: mk}
}

// get returns k's value, making it the first time.
func (c *memo[K, V]) get(k K) V {
	if v, ok := c.m[k]; ok {
		return v
	}
	v := c.mk(k)
	c.m[k] = v
	return v
}

// repeats remembers, per thread, the last stack a format derived
// something from (its rows, tree path, frame indexes...), so that the next
// sample of the thread with the same stack reuses it instead of looking
// every frame up again. A thread's stack is often unchanged from one sample
// to the next (a loop, a wait). The same stack is told by its identity
// (stack.ID, given by the walker or a recording's reader), not by its
// frames: a sample whose stack has none is derived anew.
type repeats[V any] struct {
	last map[stack.ThreadKey]*repeat[V]
	off  bool // derive every stack anew (Options.noRepeats)
}

// maxRepeats bounds the threads whose last stack a format keeps.
const maxRepeats = 4096

// repeat is one thread's entry: v was derived from the stack id.
type repeat[V any] struct {
	id stack.ID
	v  V
}

// at returns the entry of s's thread and whether its v was derived from
// s's stack. When not, the caller derives v again (reusing what it
// holds: nothing else refers to it) and then calls keep.
func (r *repeats[V]) at(s *stack.Sample) (e *repeat[V], same bool) {
	if r.last == nil {
		r.last = make(map[stack.ThreadKey]*repeat[V])
	}
	id := s.Key()
	e = r.last[id]
	if e == nil {
		if len(r.last) >= maxRepeats {
			// Many threads (thread churn): start over rather than
			// keep a stack for each.
			clear(r.last)
		}
		e = &repeat[V]{}
		r.last[id] = e
		return e, false
	}
	return e, !r.off && stack.Same(e.id, s.Stack)
}

// keep records that e.v is now derived from s's stack.
func (e *repeat[V]) keep(s *stack.Sample) {
	e.id = s.Stack
}
