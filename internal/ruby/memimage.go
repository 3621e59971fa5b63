package ruby

import (
	"github.com/rbscope/rbscope/internal/elfx"
	"github.com/rbscope/rbscope/internal/target"
)

type memImage struct {
	bias    uint64
	buildID string
	syms    elfx.Symbols
}

// readMemoryImage reads the dynamic symbols of an ELF image mapped at base
// from the process image itself (for cores whose binaries are not on
// disk).
func readMemoryImage(t target.Target, base uint64) (*memImage, error) {
	img, err := elfx.ReadMemoryImage(t, base)
	if err != nil {
		return nil, err
	}
	return &memImage{bias: img.Bias, buildID: img.BuildID, syms: img}, nil
}
