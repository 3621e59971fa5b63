package ruby

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Succinct index table constants (iseq.c, Ruby 2.6+).
const (
	succImmediateSize = 54 // IMMEDIATE_TABLE_SIZE
	succPartOffset    = 48 // imm_part is 54/9 = 6 uint64s
	succBlockSize     = 80 // {uint32 rank; uint64 small_block_ranks; uint64 bits[8]}
	maxLineTable      = 1 << 20
)

// lineFor returns the line being executed at pc in the iseq.
func (p *namer) lineFor(info *iseqInfo, pc uint64) (int, error) {
	if pc < info.encoded {
		return 0, invalidf("pc 0x%x before iseq code 0x%x", pc, info.encoded)
	}
	pos := (pc - info.encoded) / 8
	if l, ok := info.lines[pos]; ok {
		return l, nil
	}
	// The pc points at the next instruction; Ruby uses pos-1.
	lookup := pos
	if lookup > 0 && !(p.opts.nextInsnLines && p.rt.o.bSuccTable.ok) {
		lookup--
	}
	var line int
	var err error
	switch {
	case p.rt.o.bSuccTable.ok:
		line, err = p.lineSucc(info, lookup)
	case p.rt.iseqBody || p.rt.o.insnPos.ok:
		line, err = p.linePositions(info, lookup)
	}
	if err != nil {
		return 0, fmt.Errorf("line at position %d of %d-entry table: %w", lookup, info.tableSize, err)
	}
	if len(info.lines) < 4096 {
		info.lines[pos] = line
	}
	return line, nil
}

// lineTableSize returns the number of entries of the iseq's line table,
// refusing a missing table or one larger than maxLineTable.
func (info *iseqInfo) lineTableSize() (uint64, error) {
	if info.tableSize == 0 || info.tableAddr == 0 {
		return 0, invalidf("iseq has no line table")
	}
	if info.tableSize > maxLineTable {
		return 0, invalidf("iseq line table of %d entries", info.tableSize)
	}
	return info.tableSize, nil
}

// lineSucc looks pos up in the succinct bit vector of Ruby 2.6+.
func (p *namer) lineSucc(info *iseqInfo, pos uint64) (int, error) {
	size, err := info.lineTableSize()
	if err != nil {
		return 0, err
	}
	entry := func(i uint64) (int, error) {
		if i >= size {
			return 0, invalidf("line index %d outside table of %d", i, size)
		}
		b, err := p.r.read(info.tableAddr+i*p.rt.o.insnSize+p.rt.o.insnLine.off, 4)
		if err != nil {
			return 0, fmt.Errorf("read line entry: %w", err)
		}
		return int(int32(binary.LittleEndian.Uint32(b))), nil
	}
	if size == 1 {
		return entry(0)
	}
	if info.succTable == 0 {
		// Positions not yet encoded (an iseq being compiled): search them.
		if info.positions != 0 {
			return p.linePositionsArray(info, pos, entry)
		}
		return 0, invalidf("iseq has neither succinct table nor positions")
	}
	var idx uint64
	if pos < succImmediateSize {
		v, err := p.r.u64(info.succTable + (pos/9)*8)
		if err != nil {
			return 0, fmt.Errorf("read line index: %w", err)
		}
		idx = (v >> ((pos % 9) * 7)) & 0x7f
	} else {
		x := pos - succImmediateSize
		block := info.succTable + succPartOffset + (x/512)*succBlockSize
		b, err := p.r.read(block, succBlockSize)
		if err != nil {
			return 0, fmt.Errorf("read line index block: %w", err)
		}
		rank := uint64(binary.LittleEndian.Uint32(b[0:]))
		small := binary.LittleEndian.Uint64(b[8:])
		bitIdx := x % 512
		smallIdx := bitIdx / 64
		var smallRank uint64
		if smallIdx > 0 {
			smallRank = (small >> ((smallIdx - 1) * 9)) & 0x1ff
		}
		word := binary.LittleEndian.Uint64(b[16+smallIdx*8:])
		pop := uint64(bits.OnesCount64(word << (63 - bitIdx%64)))
		idx = rank + smallRank + pop
	}
	if idx == 0 {
		return 0, invalidf("line index 0 for position %d", pos)
	}
	return entry(idx - 1)
}

// linePositionsArray searches the positions array (2.6+, before encoding).
func (p *namer) linePositionsArray(info *iseqInfo, pos uint64, entry func(uint64) (int, error)) (int, error) {
	n := info.tableSize
	data, err := p.r.readOwned(info.positions, int(n*4))
	if err != nil {
		return 0, fmt.Errorf("read line positions: %w", err)
	}
	best := uint64(0)
	for i := uint64(0); i < n; i++ {
		if uint64(binary.LittleEndian.Uint32(data[i*4:])) <= pos {
			best = i
		} else {
			break
		}
	}
	return entry(best)
}

// linePositions searches a table of {position, line_no, ...} entries
// (1.9 to 2.5): the last entry whose position is at or before pos.
func (p *namer) linePositions(info *iseqInfo, pos uint64) (int, error) {
	n, err := info.lineTableSize()
	if err != nil {
		return 0, err
	}
	esize, posF, lineF := p.rt.o.insnSize, p.rt.o.insnPos, p.rt.o.insnLine
	if p.rt.o.lineSize != 0 && (p.rt.o.bLineInfoTable.ok) {
		esize, posF, lineF = p.rt.o.lineSize, p.rt.o.linePos, p.rt.o.lineLine
	}
	data, err := p.r.readOwned(info.tableAddr, int(n*esize))
	if err != nil {
		return 0, fmt.Errorf("read line table: %w", err)
	}
	line := 0
	for i := uint64(0); i < n; i++ {
		e := data[i*esize : (i+1)*esize]
		if posF.u64(e) > pos {
			if i == 0 {
				line = int(int32(lineF.u64(e)))
			}
			break
		}
		line = int(int32(lineF.u64(e)))
	}
	return line, nil
}
