// Command bpfprogs prints, for the loaded kprobe and uprobe BPF programs
// that have run, how many times they ran and their total run time, as
// "runs nanoseconds" summed over them (and one line per program with -v).
// The kernel keeps these figures only while kernel.bpf_stats_enabled is
// 1: scripts/bench-alloc.sh sets it to compare the cost of rbscope's
// program per event with bcc's, apart from the uprobe trap both pay.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

func main() {
	verbose := flag.Bool("v", false, "one line per program")
	flag.Parse()
	var runs uint64
	var ns int64
	id := ebpf.ProgramID(0)
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bpfprogs: list programs: %v\n", err)
			os.Exit(1)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		if err != nil || info.Type != ebpf.Kprobe {
			p.Close()
			continue
		}
		st, err := p.Stats()
		p.Close()
		if err != nil || st.RunCount == 0 {
			continue
		}
		runs += st.RunCount
		ns += st.Runtime.Nanoseconds()
		if *verbose {
			fmt.Fprintf(os.Stderr, "%d %s: %d runs, %d ns\n", id, info.Name, st.RunCount, st.Runtime.Nanoseconds())
		}
	}
	fmt.Println(runs, ns)
}
