package testutil

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ContainerRuby is the interpreter of the container tests' rootfs, at a
// path the host does not have (scripts/rootfs.sh moves it there, and its
// libruby to /opt/ct/lib).
const ContainerRuby = "/opt/ct/bin/ruby3.1"

// ContainerOptions shape a container started by StartContainerRuby.
type ContainerOptions struct {
	// Env is added to the Ruby process's environment, which otherwise
	// holds only PATH, HOME and LANG.
	Env []string
	// Pod puts the container's cgroup where Kubernetes (systemd driver,
	// containerd) puts a pod's container, in a pod of a new UID:
	// .../kubepods-besteffort-pod<UID>.slice/cri-containerd-<ID>.scope.
	// Without it the cgroup is docker's: .../docker-<ID>.scope.
	Pod bool
	// Exe is the Ruby to run, as the container sees it; "" runs the
	// rootfs's (ContainerRuby). Another is brought in with Mounts.
	Exe string
	// Args go to the Ruby before the script (e.g. "--yjit").
	Args []string
	// Mounts are host directories mounted read-only in the container.
	Mounts []Mount
}

// Mount is a host directory mounted read-only in a container at At
// (Host's own path when "").
type Mount struct{ Host, At string }

// Container is a Ruby process started in a container of its own by
// StartContainerRuby.
type Container struct {
	// Pid is the Ruby process's pid on this host (the test's PID
	// namespace); it is 1 in its own.
	Pid int
	// ID is the container id its cgroup is named with (64 hex digits).
	ID string
	// PodUID is the pod's UID with Pod, else "".
	PodUID string
	// Cgroup is the process's cgroup in the unified hierarchy, as
	// /proc/PID/cgroup shows it ("/rbscope-test-....slice/docker-ID.scope").
	Cgroup string
	// Rootfs is the host's directory of the root file system it runs in.
	Rootfs string
	// Script is the script's path as the container sees it (/app/NAME).
	Script string
	// Lines are the lines the script printed before "ready".
	Lines []string
	// Stdin is the script's standard input.
	Stdin io.WriteCloser
	// after holds the lines printed after "ready" (see Expect).
	after chan string
}

// Expect waits (up to 60 s) for a line the script prints after "ready"
// that starts with prefix, skipping the others, and returns it.
func (c *Container) Expect(t testing.TB, prefix string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.after:
			if !ok {
				t.Fatalf("the container's script ended before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("timed out waiting for the container's script to print %q", prefix)
		}
	}
}

// RootFS returns the directory of the container tests' Debian rootfs
// (scripts/rootfs.sh build, which scripts/test.sh runs first), stopping
// the test (see Missing) when it is not built: tests never build it.
func RootFS(t testing.TB) string {
	t.Helper()
	script := filepath.Join(RepoRoot(t), "scripts", "rootfs.sh")
	out, err := exec.Command(script, "dir").Output()
	if err != nil {
		Missing(t, "the container tests' rootfs (run `scripts/rootfs.sh build`): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// StartContainerRuby runs the rootfs's Ruby (ContainerRuby, or
// opts.Exe) on script (relative to testdata/ruby unless absolute) with
// args in a container: its own PID namespace (the Ruby is its pid 1) and
// mount namespace, whose root is an overlay of the rootfs and a
// directory of the test's, as docker's overlay2 makes it (pivot_root,
// the host's tree unmounted, as container runtimes do, so that
// /proc/PID/maps names the container's paths), with the script's
// directory mounted read-only at /app, opts.Mounts, /proc its own, and a
// cgroup of its own named like a container runtime's (with a random
// container id). It waits until the script prints a line "ready" (up to
// 30 s), checks that the process runs the rootfs's interpreter (the same
// file, and no file at its path on the host), and kills the container
// and removes its cgroup when the test ends. It needs root, util-linux's
// unshare and pivot_root, overlayfs and a writable cgroup v2 hierarchy.
func StartContainerRuby(t testing.TB, script string, opts ContainerOptions, args ...string) *Container {
	t.Helper()
	NeedRoot(t)
	rootfs := RootFS(t)
	if !filepath.IsAbs(script) {
		script = filepath.Join(RepoRoot(t), "testdata", "ruby", script)
	}
	inRootfs := checkContainerHost(t, rootfs)
	c := &Container{Rootfs: rootfs, Script: "/app/" + filepath.Base(script), ID: randomHex(t, 32)}
	cg := newTestCgroup(t, c, opts.Pod)
	// Removed after the container is killed: cleanups run last first.
	t.Cleanup(cg.remove)
	fd, err := syscall.Open(cg.dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open cgroup %s: %v", cg.dir, err)
	}
	defer syscall.Close(fd)

	mounts := mountLines(t, opts.Mounts)
	exe := opts.Exe
	if exe == "" {
		exe = ContainerRuby
	}
	cmdArgs := []string{"--mount", "--pid", "--fork", "--", "/bin/sh", "-c", containerInit, "rbscope-container",
		rootfs, t.TempDir(), filepath.Dir(script), strings.Join(mounts, "\n"), exe}
	cmdArgs = append(append(append(cmdArgs, opts.Args...), c.Script), args...)
	cmd := exec.Command("unshare", cmdArgs...)
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}, opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	c.Stdin, err = cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	unsharePid := c.start(t, cmd)

	// The Ruby is unshare's child (--fork), the container's pid 1.
	pid, err := onlyChild(unsharePid)
	if err != nil {
		t.Fatalf("find the container's Ruby process: %v", err)
	}
	c.Pid = pid
	c.checkRuby(t, exe, opts.Exe == "", inRootfs)
	return c
}

// checkContainerHost stops the test when the host cannot run a container
// (no util-linux tools, no overlayfs: see Missing) or fails it when the
// host has the container's interpreter's directory (a profiler that read
// the host's path would pass unnoticed) or rootfs lacks the interpreter.
// It returns the rootfs's interpreter's file info.
func checkContainerHost(t testing.TB, rootfs string) os.FileInfo {
	t.Helper()
	for _, tool := range []string{"unshare", "mount", "pivot_root"} {
		if _, err := exec.LookPath(tool); err != nil {
			Missing(t, "%s (util-linux) to start a container", tool)
		}
	}
	if fs, err := os.ReadFile("/proc/filesystems"); err == nil && !strings.Contains(string(fs), "\toverlay\n") {
		if _, err := os.Stat("/sys/module/overlay"); err != nil {
			Missing(t, "overlayfs (the overlay kernel module) for the container's root")
		}
	}
	// The container's interpreter must be a file the host does not have
	// at its path, or reading the host's path would go unnoticed.
	if _, err := os.Stat(filepath.Dir(filepath.Dir(ContainerRuby))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the host has %s (%v): a profiler that read the host's path instead of the container's file would pass unnoticed",
			filepath.Dir(filepath.Dir(ContainerRuby)), err)
	}
	inRootfs, err := os.Stat(filepath.Join(rootfs, ContainerRuby))
	if err != nil {
		t.Fatalf("rootfs %s has no %s: %v", rootfs, ContainerRuby, err)
	}
	return inRootfs
}

// containerInit is the container's init, run by the host's sh in the new
// namespaces: the root is an overlay of the rootfs (read-only, below) and
// a directory of this test's (the container's writes), as docker's
// overlay2 makes it; $1 rootfs, $2 the test's directory, $3 the script's
// directory, $4 the mounts ("HOST:AT" lines), then the command.
const containerInit = `set -e
mount --make-rprivate /
mkdir "$2/upper" "$2/work" "$2/root"
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" "$2/root"
mount --bind -o ro "$3" "$2/root/app"
printf '%s\n' "$4" | while IFS=: read -r host at; do
  [ -n "$host" ] || continue
  mkdir -p "$2/root$at"
  mount --bind -o ro "$host" "$2/root$at"
done
mount -t proc proc "$2/root/proc"
cd "$2/root"
pivot_root . mnt
umount -l /mnt
shift 4
exec "$@"`

// mountLines returns the mounts as containerInit's "HOST:AT" lines, AT
// cleaned (Host when empty), failing the test for a relative path or one
// holding ':' or a newline.
func mountLines(t testing.TB, ms []Mount) []string {
	t.Helper()
	var mounts []string
	for _, m := range ms {
		at := m.At
		if at == "" {
			at = m.Host
		}
		if strings.ContainsAny(m.Host+at, ":\n") || !filepath.IsAbs(m.Host) || !filepath.IsAbs(at) {
			t.Fatalf("mount %+v: want absolute paths without ':' or newlines", m)
		}
		mounts = append(mounts, m.Host+":"+filepath.Clean(at))
	}
	return mounts
}

// checkRuby fails the test unless the container's process c.Pid is pid 1
// of a PID namespace of its own, runs exe (with rootfsRuby, the rootfs's
// own file, inRootfs, through the overlay) and is in c's cgroup.
func (c *Container) checkRuby(t testing.TB, exe string, rootfsRuby bool, inRootfs os.FileInfo) {
	t.Helper()
	pid := c.Pid
	if ns, err := nsPid(pid); err != nil || len(ns) < 2 || ns[len(ns)-1] != 1 {
		t.Fatalf("process %d is not pid 1 of a PID namespace of its own: NSpid %v (%v)", pid, ns, err)
	}
	if got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || got != exe {
		t.Fatalf("process %d runs %q (%v), want the container's %s", pid, got, err, exe)
	}
	// The rootfs's file, seen through the overlay: the same inode.
	running, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err == nil && rootfsRuby && running.Sys().(*syscall.Stat_t).Ino != inRootfs.Sys().(*syscall.Stat_t).Ino {
		err = fmt.Errorf("inode %d, the rootfs's is %d", running.Sys().(*syscall.Stat_t).Ino, inRootfs.Sys().(*syscall.Stat_t).Ino)
	}
	if err != nil {
		t.Fatalf("process %d does not run %s of %s: %v", pid, ContainerRuby, c.Rootfs, err)
	}
	if got := unifiedCgroup(pid); got != c.Cgroup {
		t.Fatalf("process %d is in cgroup %q, want %q", pid, got, c.Cgroup)
	}
}

// start starts cmd in a process group of its own, reads its lines until
// "ready" (up to 30 s) into c.Lines and the later ones into c.after, and
// kills the process group when the test ends. It returns cmd's pid.
func (c *Container) start(t testing.TB, cmd *exec.Cmd) int {
	t.Helper()
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr.Setpgid = true
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the container: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	ready := make(chan error, 1)
	c.after = make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		isReady := false
		for sc.Scan() {
			switch l := sc.Text(); {
			case isReady:
				select {
				case c.after <- l:
				default: // a test reads only a few lines; never block the script
				}
			case l == "ready":
				isReady = true
				ready <- nil
			default:
				c.Lines = append(c.Lines, l)
			}
		}
		if !isReady {
			ready <- fmt.Errorf("its output ended (%v)", sc.Err())
		}
		close(c.after)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("container %v exited before it was ready: %v", cmd.Args[len(cmd.Args)-2:], err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("container %v did not print ready within 30s", cmd.Args[len(cmd.Args)-2:])
	}
	return cmd.Process.Pid
}

// testCgroup is a container's cgroup and the directories made for it.
type testCgroup struct {
	t    testing.TB
	dir  string   // the container's cgroup directory
	made []string // directories made, outermost first
}

// newTestCgroup makes the container's cgroup in the cgroup v2 hierarchy,
// in a slice of this test's own, and sets c.Cgroup (and c.PodUID).
func newTestCgroup(t testing.TB, c *Container, pod bool) *testCgroup {
	t.Helper()
	mnt, err := cgroup2Mount()
	if err != nil {
		Missing(t, "a cgroup v2 hierarchy to put the container in: %v", err)
	}
	parts := []string{"rbscope-test-" + randomHex(t, 4) + ".slice"}
	if pod {
		uid := randomHex(t, 16)
		c.PodUID = uid[0:8] + "-" + uid[8:12] + "-" + uid[12:16] + "-" + uid[16:20] + "-" + uid[20:32]
		parts = append(parts, "kubepods.slice", "kubepods-besteffort.slice",
			"kubepods-besteffort-pod"+strings.ReplaceAll(c.PodUID, "-", "_")+".slice",
			"cri-containerd-"+c.ID+".scope")
	} else {
		parts = append(parts, "docker-"+c.ID+".scope")
	}
	cg := &testCgroup{t: t, dir: mnt}
	for _, part := range parts {
		cg.dir = filepath.Join(cg.dir, part)
		if err := os.Mkdir(cg.dir, 0o755); err != nil {
			cg.remove()
			if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) {
				Missing(t, "a writable cgroup v2 hierarchy at %s: %v", mnt, err)
			}
			t.Fatalf("make cgroup: %v", err)
		}
		cg.made = append(cg.made, cg.dir)
	}
	// The path the process's /proc/PID/cgroup shows: from the
	// hierarchy's root, as this test's cgroup namespace sees it.
	c.Cgroup = "/" + strings.Join(parts, "/")
	if own := unifiedCgroup(os.Getpid()); own != "/" && own != "" {
		// The mount shows the hierarchy's root; a test in a cgroup
		// namespace sees paths from its own cgroup.
		if rel, err := filepath.Rel(own, c.Cgroup); err == nil && !strings.HasPrefix(rel, "..") {
			c.Cgroup = "/" + rel
		}
	}
	return cg
}

// remove removes the directories made, innermost first, waiting (up to
// 5 s) for the killed container's processes to leave.
func (cg *testCgroup) remove() {
	for i := len(cg.made) - 1; i >= 0; i-- {
		d := cg.made[i]
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				cg.t.Errorf("remove cgroup %s: %v", d, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cg.made = nil
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted
// (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host).
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return f[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 file system is mounted")
}

// unifiedCgroup is the "0::" path of /proc/PID/cgroup ("" if none).
func unifiedCgroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	return ""
}

// onlyChild is the one child of process pid.
func onlyChild(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0, fmt.Errorf("process %d has children %q, want one", pid, f)
	}
	return strconv.Atoi(f[0])
}

// nsPid is the NSpid line of /proc/PID/status.
func nsPid(pid int) ([]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			var out []int
			for _, s := range strings.Fields(v) {
				n, err := strconv.Atoi(s)
				if err != nil {
					return nil, err
				}
				out = append(out, n)
			}
			return out, nil
		}
	}
	return nil, errors.New("no NSpid line")
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
