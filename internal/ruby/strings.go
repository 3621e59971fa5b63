package ruby

import "fmt"

// rstring reads the Ruby String at addr (embedded or heap, any encoding),
// at most maxString bytes.
func (p *namer) rstring(addr uint64) (string, error) {
	if !isHeapPtr(addr) {
		return "", invalidf("0x%x is not a String", addr)
	}
	o := &p.rt.o
	b, err := p.r.read(addr, 48)
	if err != nil {
		return "", fmt.Errorf("read String at 0x%x: %w", addr, err)
	}
	flags := le64(b, 0)
	if flags&tMask != tString {
		return "", invalidf("object at 0x%x is not a String (type 0x%x)", addr, flags&tMask)
	}
	const noEmbed = 1 << 13 // RSTRING_NOEMBED = FL_USER1
	var n uint64
	var ptr uint64
	flagsUsed := uint64(tMask | noEmbed)
	if flags&noEmbed != 0 {
		if o.strLen.ok {
			n = o.strLen.u64(b)
			p.sawField(addr, b, o.strLen)
		} else {
			n = o.strHeapLen.u64(b)
			p.sawField(addr, b, o.strHeapLen)
		}
		ptr = o.strHeapPtr.u64(b)
		p.sawField(addr, b, o.strHeapPtr)
	} else {
		switch {
		case o.strLen.ok:
			n = o.strLen.u64(b)
			p.sawField(addr, b, o.strLen)
		case o.strEmbedLen.ok:
			n = o.strEmbedLen.u64(b)
			p.sawField(addr, b, o.strEmbedLen)
		default:
			n = (flags >> 14) & 0x1f
			flagsUsed |= 0x1f << 14
		}
		switch {
		case o.strEmbedAry.ok:
			ptr = addr + o.strEmbedAry.off
		case o.strAsAry.ok:
			ptr = addr + o.strAsAry.off
		default:
			ptr = addr + o.strHeapLen.off
		}
	}
	p.sawWord(addr, flags, flagsUsed)
	if n == 0 {
		return "", nil
	}
	if n > maxString {
		n = maxString
	}
	if ptr == 0 {
		return "", invalidf("String at 0x%x has no data", addr)
	}
	data, err := p.r.readOwned(ptr, int(n))
	if err != nil {
		return "", fmt.Errorf("read String data at 0x%x: %w", ptr, err)
	}
	p.saw(ptr, data)
	return sanitize(string(data)), nil
}

// rarray returns the length and element pointer of the Array at addr.
func (p *namer) rarray(addr uint64) (n, ptr uint64, err error) {
	if !isHeapPtr(addr) {
		return 0, 0, invalidf("0x%x is not an Array", addr)
	}
	b, err := p.r.read(addr, 40)
	if err != nil {
		return 0, 0, fmt.Errorf("read Array at 0x%x: %w", addr, err)
	}
	flags := le64(b, 0)
	if flags&tMask != tArray {
		return 0, 0, invalidf("object at 0x%x is not an Array (type 0x%x)", addr, flags&tMask)
	}
	const embed = 1 << 13 // RARRAY_EMBED_FLAG = FL_USER1
	if flags&embed != 0 {
		mask := uint64(0x3)
		if p.rt.wideArrayLen {
			mask = 0x7f
		}
		p.sawWord(addr, flags, tMask|embed|mask<<15)
		return (flags >> 15) & mask, addr + p.rt.o.aryAsAry.off, nil
	}
	p.sawWord(addr, flags, tMask|embed)
	p.sawField(addr, b, p.rt.o.aryHeapLen)
	p.sawField(addr, b, p.rt.o.aryHeapPtr)
	return p.rt.o.aryHeapLen.u64(b), p.rt.o.aryHeapPtr.u64(b), nil
}

// aryEntry reads element i of the Array at addr.
func (p *namer) aryEntry(addr uint64, i uint64) (uint64, error) {
	n, ptr, err := p.rarray(addr)
	if err != nil {
		return 0, err
	}
	if i >= n {
		return 0, invalidf("index %d outside Array of %d", i, n)
	}
	return p.sawU64(ptr + 8*i)
}
