package heap

import (
	"errors"
	"fmt"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// The shape tree (shape.c, 3.3-3.4): rb_shape_tree_ptr points at a
// malloc'd rb_shape_tree_t {shape_list, root_shape, next_shape_id, ...}
// whose shape_list is an mmap'd array of rb_shape_t; root_shape points at
// shape 0, the root (type SHAPE_ROOT, parent INVALID_SHAPE_ID, pool 0).
// Init_default_shapes makes, on 3.3, shapes 0 to SIZE_POOL_COUNT-1 the
// roots of each size pool (shape 1: SHAPE_ROOT of pool 1); on 3.4 shape 1
// the special-constant shape (SHAPE_FROZEN, parent 0), 2 the too-complex
// shape (parent 0), and 3 to 3+HEAP_COUNT-1 the T_OBJECT shape of each
// heap (SHAPE_T_OBJECT, parent INVALID_SHAPE_ID, heap_index i).
const (
	shapeRoot      = 0
	shapeFrozen    = 2
	shapeTObject   = 3
	shapePool      = 25
	shapeParent    = 28
	invalidShapeID = 0xffffffff
	shapeScanChunk = 1 << 20
)

// rootShapes are the first shapes of a tree as Init_default_shapes makes
// them, for Ruby version ver: type, parent and pool of each.
func rootShapes(ver int) [][3]uint64 {
	if ver >= 30400 {
		return [][3]uint64{
			{shapeRoot, invalidShapeID, 0},
			{shapeFrozen, 0, 0},
			{shapeTooComplex, 0, 0},
			{shapeTObject, invalidShapeID, 0},
			{shapeTObject, invalidShapeID, 1},
		}
	}
	return [][3]uint64{{shapeRoot, invalidShapeID, 0}, {shapeRoot, invalidShapeID, 1}}
}

// checkShapeTree checks that tree (the value of rb_shape_tree_ptr) has the
// shape of Ruby's shape tree.
func checkShapeTree(t target.Target, tree uint64, ver int) error {
	if !isPtr(tree) {
		return fmt.Errorf("shape tree pointer 0x%x", tree)
	}
	var b [24]byte
	if err := t.ReadAt(b[:], tree); err != nil {
		return fmt.Errorf("read the shape tree: %w", err)
	}
	roots := rootShapes(ver)
	list, root, n := le64(b[:], 0), le64(b[:], 8), le32(b[:], treeNextShapeID)
	if !isPtr(list) || root != list || n < uint64(len(roots)) || n > maxShapes {
		return fmt.Errorf("shape tree 0x%x: list 0x%x, root 0x%x, %d shapes", tree, list, root, n)
	}
	sh := make([]byte, len(roots)*shapeSize)
	if err := t.ReadAt(sh, list); err != nil {
		return fmt.Errorf("read the root shapes: %w", err)
	}
	for i, want := range roots {
		r := sh[i*shapeSize:]
		if got := [3]uint64{uint64(r[shapeType]), le32(r, shapeParent), uint64(r[shapePool])}; got != want {
			return fmt.Errorf("shape tree 0x%x: shape %d has type, parent and pool %v, Init_default_shapes makes %v", tree, i, got, want)
		}
	}
	return nil
}

// findShapeTree finds &rb_shape_tree_ptr: its symbol, or else (stripped
// builds) the one word of the Ruby binaries' data that points at a
// checked shape tree. Either way the tree it points at must pass
// checkShapeTree.
func findShapeTree(p *ruby.Process) (uint64, string, error) {
	t := p.Target()
	if addr, ok := p.Symbol("rb_shape_tree_ptr"); ok {
		var b [8]byte
		if err := t.ReadAt(b[:], addr); err != nil {
			return 0, "", fmt.Errorf("read rb_shape_tree_ptr: %w", err)
		}
		if err := checkShapeTree(t, le64(b[:], 0), p.VersionNumber()); err != nil {
			return 0, "", err
		}
		return addr, "rb_shape_tree_ptr: symbol", nil
	}
	addr, err := scanShapeTree(p)
	if err != nil {
		return 0, "", err
	}
	return addr, fmt.Sprintf("rb_shape_tree_ptr: found at 0x%x by the shape of the tree it points at", addr), nil
}

// scanShapeTree finds &rb_shape_tree_ptr without symbols: the one word of
// the Ruby binaries' data that points at a checked shape tree.
func scanShapeTree(p *ruby.Process) (uint64, error) {
	t := p.Target()
	regions, err := p.DataRegions()
	if err != nil {
		return 0, err
	}
	// Candidates: words that point into no Ruby data region (the tree is
	// malloc'd), read in chunks; then one batched read of what each
	// points at.
	var cands []uint64
	var vals []uint64
	buf := make([]byte, shapeScanChunk)
	for _, r := range regions {
		for a := r[0]; a < r[1]; a += shapeScanChunk {
			n := min(uint64(shapeScanChunk), r[1]-a)
			if err := t.ReadAt(buf[:n], a); err != nil {
				continue
			}
			for off := uint64(0); off+8 <= n; off += 8 {
				if v := le64(buf, off); isPtr(v) && !inRegions(regions, v) {
					cands = append(cands, a+off)
					vals = append(vals, v)
				}
			}
		}
	}
	reqs := make([]target.Read, len(cands))
	heads := make([]byte, 24*len(cands))
	for i, v := range vals {
		reqs[i] = target.Read{Addr: v, Buf: heads[24*i : 24*i+24]}
	}
	var found []uint64
	for i := 0; i < len(reqs); i += 1024 {
		chunk := reqs[i:min(i+1024, len(reqs))]
		if t.ReadBatch(chunk) != nil {
			// Some candidates point at unmapped memory: read them
			// one by one.
			for k := range chunk {
				if t.ReadAt(chunk[k].Buf, chunk[k].Addr) != nil {
					chunk[k].Buf = nil
				}
			}
		}
		for k, rq := range chunk {
			if rq.Buf == nil {
				continue
			}
			list, root, n := le64(rq.Buf, 0), le64(rq.Buf, 8), le32(rq.Buf, treeNextShapeID)
			if !isPtr(list) || root != list || n < 2 || n > maxShapes {
				continue
			}
			if checkShapeTree(t, rq.Addr, p.VersionNumber()) == nil {
				found = append(found, cands[i+k])
			}
		}
	}
	switch len(found) {
	case 0:
		return 0, errors.New("rb_shape_tree_ptr: no symbol, and no word of the Ruby binaries' data points at a shape tree")
	case 1:
		return found[0], nil
	}
	return 0, fmt.Errorf("rb_shape_tree_ptr: %d words of the Ruby binaries' data point at shape trees", len(found))
}

func inRegions(rs [][2]uint64, a uint64) bool {
	for _, r := range rs {
		if a >= r[0] && a < r[1] {
			return true
		}
	}
	return false
}
