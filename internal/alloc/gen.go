package alloc

// The eBPF program is compiled by bpf2go into alloc_x86_bpfel.{go,o}, both
// committed so that building rbscope needs no clang. Regenerate with
// `go generate ./internal/alloc` after editing bpf/; TestGeneratedUpToDate
// checks that the committed object matches the source.
//go:generate go tool bpf2go -target amd64 -cflags "-O2 -g -Wall -Werror -fdebug-prefix-map=${PWD}=." -type probe_spec -type arg_spec -type site_key -type class_key -type counter -type stack_event -type exit_range -type exit_state -type tracked_obj -go-package alloc alloc bpf/alloc.bpf.c -- -I./bpf
