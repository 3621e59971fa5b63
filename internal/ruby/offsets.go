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
	lf := layoutFields{l}
	o.resolveThreads(lf)
	o.resolveFrames(lf)
	o.resolveObjects(lf)

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

// layoutFields reads fields and struct sizes out of a layout.
type layoutFields struct{ l *layout.Layout }

// f returns field name of struct s (not ok when the layout lacks it).
func (lf layoutFields) f(s, name string) fieldOff {
	fl, err := lf.l.Field(s, name)
	if err != nil {
		return fieldOff{}
	}
	return fieldOff{off: fl.Offset, size: fl.Size, ok: true, bf: fl.Bitfield}
}

// size returns the size of struct s (0 when the layout lacks it).
func (lf layoutFields) size(s string) uint64 { n, _ := lf.l.Size(s); return n }

// resolveThreads resolves the fields of the VM, its ractors, threads and
// execution contexts.
func (o *offsets) resolveThreads(lf layoutFields) {
	vm := "rb_vm_struct"
	o.vmRactorSet = lf.f(vm, "ractor.set")
	o.vmRactorCnt = lf.f(vm, "ractor.cnt")
	o.vmMainRactor = lf.f(vm, "ractor.main_ractor")
	o.vmLivingThreads = lf.f(vm, "living_threads")
	o.vmMainThread = lf.f(vm, "main_thread")
	o.vmRunningThread = lf.f(vm, "running_thread")
	o.vmSize = lf.size(vm)

	ra := "rb_ractor_struct"
	o.ractorThreadsSet = lf.f(ra, "threads.set")
	o.ractorThreadsMain = lf.f(ra, "threads.main")
	o.ractorRunningEC = lf.f(ra, "threads.running_ec")
	o.ractorVMLRNode = lf.f(ra, "vmlr_node")
	o.ractorSize = lf.size(ra)

	th := "rb_thread_struct"
	o.thLTNode = lf.f(th, "lt_node")
	o.thVMLTNode = lf.f(th, "vmlt_node")
	o.thSelf = lf.f(th, "self")
	o.thVM = lf.f(th, "vm")
	o.thEC = lf.f(th, "ec")
	o.thStack = lf.f(th, "stack")
	o.thStackSize = lf.f(th, "stack_size")
	o.thCFP = lf.f(th, "cfp")
	o.thThreadID = lf.f(th, "thread_id")
	o.thTID = lf.f(th, "tid")
	o.thNT = lf.f(th, "nt")
	o.thStatus = lf.f(th, "status")
	o.thToKill = lf.f(th, "to_kill")
	if !o.thToKill.ok {
		o.thToKill = toKillBeside(o.thStatus, lf.l.RubyVersion)
	}
	o.thName = lf.f(th, "name")
	o.thSize = lf.size(th)
	o.ntTID = lf.f("rb_native_thread", "tid")

	ec := "rb_execution_context_struct"
	o.ecVMStack = lf.f(ec, "vm_stack")
	o.ecVMStackSize = lf.f(ec, "vm_stack_size")
	o.ecCFP = lf.f(ec, "cfp")
	o.ecThreadPtr = lf.f(ec, "thread_ptr")
}

// resolveFrames resolves the fields of control frames, iseqs, their
// bodies and line tables.
func (o *offsets) resolveFrames(lf layoutFields) {
	cf := "rb_control_frame_struct"
	o.cfpPC = lf.f(cf, "pc")
	o.cfpSP = lf.f(cf, "sp")
	o.cfpIseq = lf.f(cf, "iseq")
	o.cfpSelf = lf.f(cf, "self")
	o.cfpEP = lf.f(cf, "ep")
	o.cfpFlag = lf.f(cf, "flag")
	o.cfpMe = lf.f(cf, "me")
	o.cfpBlock = lf.f(cf, "block_code")
	if !o.cfpBlock.ok {
		o.cfpBlock = lf.f(cf, "block_iseq")
	}
	o.cfpSize = lf.size(cf)

	is := "rb_iseq_struct"
	o.iseqBody = lf.f(is, "body")
	o.iseqType = lf.f(is, "type")
	o.iseqName = lf.f(is, "name")
	o.iseqFilename = lf.f(is, "filename")
	o.iseqFilepath = lf.f(is, "filepath")
	o.iseqSize = lf.size(is)

	b := "rb_iseq_constant_body"
	if !lf.l.Has(b, "") {
		b = is
	}
	o.bodyStruct = b
	o.bType = lf.f(b, "type")
	o.bEncoded = lf.f(b, "iseq_encoded")
	o.bIseqSize = lf.f(b, "iseq_size")
	o.bFirstLineno = lf.f(b, "location.first_lineno")
	o.bLabel = lf.f(b, "location.label")
	o.bPathobj = lf.f(b, "location.pathobj")
	o.bPath = lf.f(b, "location.path")
	o.bAbsPath = lf.f(b, "location.absolute_path")
	o.bLocalIseq = lf.f(b, "local_iseq")
	if x := lf.f(b, "insns_info.body"); x.ok {
		o.bInsnsInfo = x
		o.bInsnsInfoSize = lf.f(b, "insns_info.size")
		o.bInsnsPositions = lf.f(b, "insns_info.positions")
		o.bSuccTable = lf.f(b, "insns_info.succ_index_table")
	} else {
		o.bInsnsInfo = lf.f(b, "insns_info")
		o.bInsnsInfoSize = lf.f(b, "insns_info_size")
	}
	o.bLineInfoTable = lf.f(b, "line_info_table")
	o.bLineInfoSize = lf.f(b, "line_info_size")
	o.bInsnInfoTable = lf.f(b, "insn_info_table")
	o.bInsnInfoSize = lf.f(b, "insn_info_size")
	o.bodySize = lf.size(b)

	o.insnLine = lf.f("iseq_insn_info_entry", "line_no")
	o.insnPos = lf.f("iseq_insn_info_entry", "position")
	o.insnSize = lf.size("iseq_insn_info_entry")
	o.lineLine = lf.f("iseq_line_info_entry", "line_no")
	o.linePos = lf.f("iseq_line_info_entry", "position")
	o.lineSize = lf.size("iseq_line_info_entry")
}

// resolveObjects resolves the fields of the objects a name is read from:
// strings, arrays, method entries and classes.
func (o *offsets) resolveObjects(lf layoutFields) {
	o.strLen = lf.f("RString", "len")
	o.strEmbedLen = lf.f("RString", "as.embed.len")
	o.strEmbedAry = lf.f("RString", "as.embed.ary")
	o.strAsAry = lf.f("RString", "as.ary")
	o.strHeapLen = lf.f("RString", "as.heap.len")
	o.strHeapPtr = lf.f("RString", "as.heap.ptr")

	o.aryHeapLen = lf.f("RArray", "as.heap.len")
	o.aryHeapPtr = lf.f("RArray", "as.heap.ptr")
	o.aryAsAry = lf.f("RArray", "as.ary")

	me := "rb_method_entry_struct"
	o.meDef = lf.f(me, "def")
	o.meCalledID = lf.f(me, "called_id")
	o.meOwner = lf.f(me, "owner")
	o.meKlass = lf.f(me, "klass")
	o.defType = lf.f("rb_method_definition_struct", "type")
	o.defOriginalID = lf.f("rb_method_definition_struct", "original_id")

	o.classextOff = lf.f("RClass_and_rb_classext_t", "classext")
	o.classpathOff = lf.f("rb_classext_struct", "classpath")
	o.attachedOff = lf.f("rb_classext_struct", "as.singleton_class.attached_object")
}
