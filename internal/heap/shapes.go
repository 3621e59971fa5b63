package heap

import (
	"errors"
	"fmt"

	"github.com/rbscope/rbscope/internal/ruby"
	"github.com/rbscope/rbscope/internal/target"
)

// The 3.3 shape tree (shape.c): rb_shape_tree_ptr points at a malloc'd
// rb_shape_tree_t {shape_list, root_shape, next_shape_id, ...} whose
// shape_list is an mmap'd array of rb_shape_t. Init_default_shapes makes
// shapes 0 to SIZE_POOL_COUNT-1 the roots of each size pool (type
// SHAPE_ROOT, parent INVALID_SHAPE_ID, size_pool_index i), and root_shape
// point at shape 0.
const (
	shapeRoot      = 0
	shapePool      = 25
	shapeParent    = 28
	invalidShapeID = 0xffffffff
	shapeScanChunk = 1 << 20
)

// checkShapeTree checks that tree (the value of rb_shape_tree_ptr) has the
// shape of Ruby's shape tree.
func checkShapeTree(t target.Target, tree uint64) error {
	if !isPtr(tree) {
		return fmt.Errorf("shape tree pointer 0x%x", tree)
	}
	var b [24]byte
	if err := t.ReadAt(b[:], tree); err != nil {
		return fmt.Errorf("read the shape tree: %w", err)
	}
	list, root, n := le64(b[:], 0), le64(b[:], 8), le32(b[:], treeNextShapeID)
	if !isPtr(list) || root != list || n < 2 || n > maxShapes {
		return fmt.Errorf("shape tree 0x%x: list 0x%x, root 0x%x, %d shapes", tree, list, root, n)
	}
	var sh [2 * shapeSize]byte
	if err := t.ReadAt(sh[:], list); err != nil {
		return fmt.Errorf("read the root shapes: %w", err)
	}
	for i := uint64(0); i < 2; i++ {
		r := sh[i*shapeSize:]
		if r[shapeType] != shapeRoot || le32(r, shapeParent) != invalidShapeID || uint64(r[shapePool]) != i {
			return fmt.Errorf("shape tree 0x%x: shapes 0 and 1 are not the roots of size pools 0 and 1", tree)
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
		if err := checkShapeTree(t, le64(b[:], 0)); err != nil {
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
			if checkShapeTree(t, rq.Addr) == nil {
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
