package alloc

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// checkKernel asks the kernel, with cilium/ebpf's cached feature probes,
// for what the program needs, so that a missing feature is named instead
// of guessed from a load error's errno.
func checkKernel() error {
	need := []struct {
		what  string
		probe func() error
	}{
		{"kprobe/uprobe programs", func() error { return features.HaveProgramType(ebpf.Kprobe) }},
		{"attach cookies (bpf_get_attach_cookie, Linux 5.15)", func() error {
			return features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie)
		}},
		{"ring buffers (Linux 5.8)", func() error { return features.HaveMapType(ebpf.RingBuf) }},
		{"per-CPU hash maps", func() error { return features.HaveMapType(ebpf.PerCPUHash) }},
	}
	for _, n := range need {
		err := n.probe()
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrNotSupported):
			return fmt.Errorf("%w: the kernel lacks %s", ErrNoBPF, n.what)
		default:
			// The probe itself failed (no permission to load programs,
			// say): the load below reports it precisely.
			return nil
		}
	}
	return nil
}

// haveUprobeMulti reports whether the kernel has uprobe_multi links (Linux
// 6.6), which attach and detach every site at once.
func haveUprobeMulti() bool { return features.HaveBPFLinkUprobeMulti() == nil }
