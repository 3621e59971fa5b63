package ruby

import (
	"encoding/binary"
	"fmt"

	"github.com/rbscope/rbscope/internal/layout"
)

// fieldOff is a resolved field: offset, size, presence and bitfield.
type fieldOff struct {
	off, size uint64
	ok        bool
	bf        *layout.Bitfield
}

func (f fieldOff) u64(b []byte) uint64 {
	if !f.ok {
		return 0
	}
	if f.bf == nil && f.size == 8 {
		// The common case, without building a layout.Field.
		if f.off+8 > uint64(len(b)) {
			return 0
		}
		return binary.LittleEndian.Uint64(b[f.off:])
	}
	v, err := layout.Field{Offset: f.off, Size: f.size, Bitfield: f.bf}.Decode(b)
	if err != nil {
		return 0
	}
	return v
}

// offsets are the struct fields the walker reads, resolved once per
// process from its layout so that the hot path does no map lookups.
type offsets struct {
	vmRactorSet, vmRactorCnt, vmMainRactor, vmLivingThreads, vmMainThread, vmRunningThread fieldOff
	vmSize                                                                                 uint64

	ractorThreadsSet, ractorThreadsMain, ractorRunningEC, ractorVMLRNode fieldOff
	ractorSize                                                           uint64

	thLTNode, thVMLTNode, thSelf, thVM, thEC, thStack, thStackSize, thCFP fieldOff
	thThreadID, thTID, thNT, thStatus, thToKill, thName                   fieldOff
	thSize                                                                uint64

	ntTID fieldOff

	ecVMStack, ecVMStackSize, ecCFP, ecThreadPtr fieldOff

	cfpPC, cfpSP, cfpIseq, cfpSelf, cfpEP, cfpFlag, cfpMe, cfpBlock fieldOff
	cfpSize                                                         uint64

	iseqBody, iseqType, iseqName, iseqFilename, iseqFilepath fieldOff
	iseqSize                                                 uint64

	// Fields of the struct that holds the iseq facts: rb_iseq_constant_body
	// from 2.3, rb_iseq_struct before.
	bType, bEncoded, bIseqSize, bFirstLineno, bLabel, bPathobj, bPath, bAbsPath, bLocalIseq fieldOff
	bInsnsInfo, bInsnsInfoSize, bInsnsPositions, bSuccTable                                 fieldOff
	bLineInfoTable, bLineInfoSize, bInsnInfoTable, bInsnInfoSize                            fieldOff
	bodySize                                                                                uint64
	bodyStruct                                                                              string

	insnLine, insnPos fieldOff
	insnSize          uint64
	lineLine, linePos fieldOff
	lineSize          uint64

	strLen, strEmbedLen, strEmbedAry, strHeapLen, strHeapPtr, strAsAry fieldOff

	aryHeapLen, aryHeapPtr, aryAsAry fieldOff

	meDef, meCalledID, meOwner, meKlass fieldOff
	defType, defOriginalID              fieldOff

	classextOff, classpathOff, attachedOff fieldOff
}

// toKillBeside locates rb_thread_t's to_kill flag, which the built-in
// tables lack (bindgen leaves bitfields it does not need out), from the
// status bitfield it follows, in the series where that order is known:
// 3.1 (status:2, to_kill:1, checked against Thread#status on Debian's
// 3.1.2) and 3.3-3.4 (status:2, has_dedicated_nt:1, to_kill:1, in 3.3.8's
// and 3.4.5's vm_core.h, checked against their DWARF). Elsewhere without
// DWARF a thread
// being killed reads as running (run, not aborting).
func toKillBeside(status fieldOff, version string) fieldOff {
	if !status.ok || status.bf == nil || status.bf.BitWidth != 2 {
		return fieldOff{}
	}
	skip := 0
	switch ver := parseVer(version); {
	case ver >= v(3, 1, 0) && ver < v(3, 2, 0):
		skip = 2
	case ver >= v(3, 3, 0) && ver < v(3, 5, 0):
		skip = 3
	default:
		return fieldOff{}
	}
	bit := status.bf.BitOffset + skip
	return fieldOff{off: status.off + uint64(bit/8), size: 1, ok: true, bf: &layout.Bitfield{BitOffset: bit % 8, BitWidth: 1}}
}

func resolveOffsets(l *layout.Layout) (offsets, error) {
	var o offsets
	f := func(s, name string) fieldOff {
		fl, err := l.Field(s, name)
		if err != nil {
			return fieldOff{}
		}
		return fieldOff{off: fl.Offset, size: fl.Size, ok: true, bf: fl.Bitfield}
	}
	size := func(s string) uint64 { n, _ := l.Size(s); return n }

	vm := "rb_vm_struct"
	o.vmRactorSet = f(vm, "ractor.set")
	o.vmRactorCnt = f(vm, "ractor.cnt")
	o.vmMainRactor = f(vm, "ractor.main_ractor")
	o.vmLivingThreads = f(vm, "living_threads")
	o.vmMainThread = f(vm, "main_thread")
	o.vmRunningThread = f(vm, "running_thread")
	o.vmSize = size(vm)

	ra := "rb_ractor_struct"
	o.ractorThreadsSet = f(ra, "threads.set")
	o.ractorThreadsMain = f(ra, "threads.main")
	o.ractorRunningEC = f(ra, "threads.running_ec")
	o.ractorVMLRNode = f(ra, "vmlr_node")
	o.ractorSize = size(ra)

	th := "rb_thread_struct"
	o.thLTNode = f(th, "lt_node")
	o.thVMLTNode = f(th, "vmlt_node")
	o.thSelf = f(th, "self")
	o.thVM = f(th, "vm")
	o.thEC = f(th, "ec")
	o.thStack = f(th, "stack")
	o.thStackSize = f(th, "stack_size")
	o.thCFP = f(th, "cfp")
	o.thThreadID = f(th, "thread_id")
	o.thTID = f(th, "tid")
	o.thNT = f(th, "nt")
	o.thStatus = f(th, "status")
	o.thToKill = f(th, "to_kill")
	if !o.thToKill.ok {
		o.thToKill = toKillBeside(o.thStatus, l.RubyVersion)
	}
	o.thName = f(th, "name")
	o.thSize = size(th)
	o.ntTID = f("rb_native_thread", "tid")

	ec := "rb_execution_context_struct"
	o.ecVMStack = f(ec, "vm_stack")
	o.ecVMStackSize = f(ec, "vm_stack_size")
	o.ecCFP = f(ec, "cfp")
	o.ecThreadPtr = f(ec, "thread_ptr")

	cf := "rb_control_frame_struct"
	o.cfpPC = f(cf, "pc")
	o.cfpSP = f(cf, "sp")
	o.cfpIseq = f(cf, "iseq")
	o.cfpSelf = f(cf, "self")
	o.cfpEP = f(cf, "ep")
	o.cfpFlag = f(cf, "flag")
	o.cfpMe = f(cf, "me")
	o.cfpBlock = f(cf, "block_code")
	if !o.cfpBlock.ok {
		o.cfpBlock = f(cf, "block_iseq")
	}
	o.cfpSize = size(cf)

	is := "rb_iseq_struct"
	o.iseqBody = f(is, "body")
	o.iseqType = f(is, "type")
	o.iseqName = f(is, "name")
	o.iseqFilename = f(is, "filename")
	o.iseqFilepath = f(is, "filepath")
	o.iseqSize = size(is)

	b := "rb_iseq_constant_body"
	if !l.Has(b, "") {
		b = is
	}
	o.bodyStruct = b
	o.bType = f(b, "type")
	o.bEncoded = f(b, "iseq_encoded")
	o.bIseqSize = f(b, "iseq_size")
	o.bFirstLineno = f(b, "location.first_lineno")
	o.bLabel = f(b, "location.label")
	o.bPathobj = f(b, "location.pathobj")
	o.bPath = f(b, "location.path")
	o.bAbsPath = f(b, "location.absolute_path")
	o.bLocalIseq = f(b, "local_iseq")
	if x := f(b, "insns_info.body"); x.ok {
		o.bInsnsInfo = x
		o.bInsnsInfoSize = f(b, "insns_info.size")
		o.bInsnsPositions = f(b, "insns_info.positions")
		o.bSuccTable = f(b, "insns_info.succ_index_table")
	} else {
		o.bInsnsInfo = f(b, "insns_info")
		o.bInsnsInfoSize = f(b, "insns_info_size")
	}
	o.bLineInfoTable = f(b, "line_info_table")
	o.bLineInfoSize = f(b, "line_info_size")
	o.bInsnInfoTable = f(b, "insn_info_table")
	o.bInsnInfoSize = f(b, "insn_info_size")
	o.bodySize = size(b)

	o.insnLine = f("iseq_insn_info_entry", "line_no")
	o.insnPos = f("iseq_insn_info_entry", "position")
	o.insnSize = size("iseq_insn_info_entry")
	o.lineLine = f("iseq_line_info_entry", "line_no")
	o.linePos = f("iseq_line_info_entry", "position")
	o.lineSize = size("iseq_line_info_entry")

	o.strLen = f("RString", "len")
	o.strEmbedLen = f("RString", "as.embed.len")
	o.strEmbedAry = f("RString", "as.embed.ary")
	o.strAsAry = f("RString", "as.ary")
	o.strHeapLen = f("RString", "as.heap.len")
	o.strHeapPtr = f("RString", "as.heap.ptr")

	o.aryHeapLen = f("RArray", "as.heap.len")
	o.aryHeapPtr = f("RArray", "as.heap.ptr")
	o.aryAsAry = f("RArray", "as.ary")

	me := "rb_method_entry_struct"
	o.meDef = f(me, "def")
	o.meCalledID = f(me, "called_id")
	o.meOwner = f(me, "owner")
	o.meKlass = f(me, "klass")
	o.defType = f("rb_method_definition_struct", "type")
	o.defOriginalID = f("rb_method_definition_struct", "original_id")

	o.classextOff = f("RClass_and_rb_classext_t", "classext")
	o.classpathOff = f("rb_classext_struct", "classpath")
	o.attachedOff = f("rb_classext_struct", "as.singleton_class.attached_object")

	// The fields without which no stack can be walked.
	for _, req := range []struct {
		name string
		f    fieldOff
	}{
		{"rb_control_frame_struct.pc", o.cfpPC},
		{"rb_control_frame_struct.iseq", o.cfpIseq},
		{"rb_thread_struct.self", o.thSelf},
		{"RString.as.heap.ptr", o.strHeapPtr},
	} {
		if !req.f.ok {
			return o, fmt.Errorf("layout %s lacks %s", l.Source, req.name)
		}
	}
	if o.cfpSize == 0 || o.bodySize == 0 {
		return o, fmt.Errorf("layout %s lacks control frame or iseq sizes", l.Source)
	}
	return o, nil
}
