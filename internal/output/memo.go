package output

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
