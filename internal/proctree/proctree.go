// Package proctree finds a process's descendants (for profiling
// subprocesses) and starts commands for launch mode (as the
// invoking user under sudo).
package proctree

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rbscope/rbscope/internal/procfs"
)

// Descendants returns the pids of root's children, grandchildren and so
// on (not root itself), parents before children. It reads
// /proc/PID/task/TID/children where the kernel has it
// (CONFIG_PROC_CHILDREN), else the ppid of every process in /proc.
// Processes whose parent exited were re-parented and are not found.
func Descendants(root int) ([]int, error) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d/children", root, root)); err == nil {
		return descendantsByChildren(root)
	}
	return descendantsByScan(root)
}

func descendantsByChildren(root int) ([]int, error) {
	var out []int
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			if pid == root {
				return nil, fmt.Errorf("list threads of process %d: %w", pid, err)
			}
			continue // exited meanwhile
		}
		tids, _ := f.Readdirnames(-1)
		f.Close()
		for _, tid := range tids {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + tid + "/children")
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				c, err := strconv.Atoi(f)
				if err != nil || seen[c] {
					continue
				}
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out, nil
}

func descendantsByScan(root int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procfs.ReadStat(pid)
		if err != nil {
			continue
		}
		children[st.PPid] = append(children[st.PPid], pid)
	}
	var out []int
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out, nil
}

// Command returns an exec.Cmd for argv with the standard streams
// inherited. When rbscope runs under sudo (SUDO_UID and SUDO_GID set and
// running as root) the command runs as the invoking user, as it would
// without sudo.
func Command(argv []string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command given")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("find command %q: %w", argv[0], err)
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cred, err := SudoCredential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd, nil
}

// SudoCredential returns the credential of the user who ran sudo, or nil
// when not running as root under sudo.
func SudoCredential() (*syscall.Credential, error) {
	uidS, gidS := os.Getenv("SUDO_UID"), os.Getenv("SUDO_GID")
	if os.Geteuid() != 0 || uidS == "" || gidS == "" {
		return nil, nil
	}
	uid, err1 := strconv.ParseUint(uidS, 10, 32)
	gid, err2 := strconv.ParseUint(gidS, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("parse SUDO_UID/SUDO_GID: %w", err)
	}
	if uid == 0 {
		return nil, nil
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: false}
	// Supplementary groups of the user, as login would set them.
	if groups, err := userGroups(uint32(uid), uint32(gid)); err == nil {
		cred.Groups = groups
	}
	return cred, nil
}

func userGroups(uid, gid uint32) ([]uint32, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil, fmt.Errorf("look up user %d: %w", uid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of user %d: %w", uid, err)
	}
	out := []uint32{gid}
	for _, s := range ids {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil && uint32(g) != gid {
			out = append(out, uint32(g))
		}
	}
	return out, nil
}

// InForeground reports whether this process's group is the foreground
// process group of the terminal on standard input: then a Ctrl-C typed
// there reaches every process of the group, a launched command included.
func InForeground() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil {
		return false
	}
	return pgrp == unix.Getpgrp()
}
