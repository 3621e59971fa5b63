package procfs

import (
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbscope/rbscope/internal/testutil"
)

// Container ids and a pod UID of the shapes the runtimes use.
const (
	id1 = "3f1c2a9e8d7b6c5a4f3e2d1c0b9a8f7e6d5c4b3a291807f6e5d4c3b2a1908172"
	id2 = "9b8a7c6d5e4f30211203f4e5d6c7b8a9abcdef0123456789fedcba9876543210"
	uid = "5a6f1e52-3c1b-4e8f-9b7a-2d3c4e5f6a7b"
)

var uidU = strings.ReplaceAll(uid, "-", "_")

func TestCgroupLabels(t *testing.T) {
	for _, c := range []struct {
		name, file   string
		id, pod, cg2 string
	}{
		{"docker systemd v2", "0::/system.slice/docker-" + id1 + ".scope\n", id1, "", "/system.slice/docker-" + id1 + ".scope"},
		{"docker cgroupfs v1 (hybrid)",
			"12:pids:/docker/" + id1 + "\n11:hugetlb:/docker/" + id1 + "\n5:cpu,cpuacct:/docker/" + id1 +
				"\n1:name=systemd:/docker/" + id1 + "\n0::/system.slice/containerd.service\n",
			id1, "", "/system.slice/containerd.service"},
		{"docker v1 without unified", "4:memory:/docker/" + id1 + "\n1:name=systemd:/docker/" + id1 + "\n", id1, "", ""},
		{"docker systemd v2, a process in a sub-cgroup", "0::/system.slice/docker-" + id1 + ".scope/init.scope\n", id1, "", "/system.slice/docker-" + id1 + ".scope/init.scope"},
		{"containerd, kubernetes systemd driver",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope\n",
			id1, uid, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope"},
		{"guaranteed QoS pod", "0::/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + id2 + ".scope\n", id2, uid,
			"/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + id2 + ".scope"},
		{"CRI-O", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + id1 + ".scope\n", id1, uid,
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + id1 + ".scope"},
		{"CRI-O's conmon is not in the container", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-conmon-" + id1 + ".scope\n", "", uid,
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-conmon-" + id1 + ".scope"},
		{"kubernetes cgroupfs driver v1", "11:memory:/kubepods/besteffort/pod" + uid + "/" + id1 + "\n1:name=systemd:/kubepods/besteffort/pod" + uid + "/" + id1 + "\n",
			id1, uid, ""},
		{"kubernetes cgroupfs driver v2, guaranteed", "0::/kubepods/pod" + uid + "/" + id2 + "\n", id2, uid, "/kubepods/pod" + uid + "/" + id2},
		{"kind (kubelet in docker)",
			"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + id2 + ".scope\n",
			id2, uid, "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + id2 + ".scope"},
		{"podman rootful", "0::/machine.slice/libpod-" + id1 + ".scope/container\n", id1, "", "/machine.slice/libpod-" + id1 + ".scope/container"},
		{"podman rootless", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id2 + ".scope/container\n", id2, "",
			"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id2 + ".scope/container"},
		{"podman's conmon", "0::/machine.slice/libpod-conmon-" + id1 + ".scope\n", "", "", "/machine.slice/libpod-conmon-" + id1 + ".scope"},
		{"docker in docker: the inner one", "4:pids:/docker/" + id1 + "/docker/" + id2 + "\n", id2, "", ""},
		{"ECS", "9:perf_event:/ecs/0a1b2c3d4e5f60718293a4b5c6d7e8f9/" + id2 + "\n", id2, "", ""},
		{"systemd session", "0::/user.slice/user-1000.slice/session-3.scope\n", "", "", "/user.slice/user-1000.slice/session-3.scope"},
		{"a service", "0::/system.slice/ssh.service\n", "", "", "/system.slice/ssh.service"},
		{"root (a cgroup namespace)", "0::/\n", "", "", "/"},
		{"upper-case hex is no runtime's id", "0::/system.slice/docker-" + strings.ToUpper(id1) + ".scope\n", "", "", "/system.slice/docker-" + strings.ToUpper(id1) + ".scope"},
		{"63 hex digits", "0::/docker/" + id1[1:] + "\n", "", "", "/docker/" + id1[1:]},
		{"a pod-like name outside kubepods", "0::/system.slice/pod" + uid + "/x\n", "", "", "/system.slice/pod" + uid + "/x"},
		{"a pod UID cut short", "0::/kubepods/besteffort/pod" + uid[:35] + "/" + id1 + "\n", id1, "", "/kubepods/besteffort/pod" + uid[:35] + "/" + id1},
		{"empty", "", "", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs, err := ParseCgroups([]byte(c.file))
			if err != nil {
				t.Fatal(err)
			}
			if got := cs.ContainerID(); got != c.id {
				t.Errorf("ContainerID = %q, want %q", got, c.id)
			}
			if got := cs.PodUID(); got != c.pod {
				t.Errorf("PodUID = %q, want %q", got, c.pod)
			}
			got, ok := cs.Unified()
			if got != c.cg2 || ok != (c.cg2 != "") {
				t.Errorf("Unified = %q, %v, want %q", got, ok, c.cg2)
			}
		})
	}
}

func TestParseCgroupsBad(t *testing.T) {
	for _, bad := range []string{"garbage\n", "0:/no-third-field\n", "x::/\n", "-1::/\n"} {
		if _, err := ParseCgroups([]byte(bad)); err == nil {
			t.Errorf("ParseCgroups(%q) = nil error", bad)
		}
	}
	// A path may hold colons: the first two separate the fields.
	cs, err := ParseCgroups([]byte("0::/a:b/c\n"))
	if err != nil || len(cs) != 1 || cs[0].Path != "/a:b/c" {
		t.Errorf("ParseCgroups(path with a colon) = %+v, %v", cs, err)
	}
	if _, err := ReadCgroups(999999999); err == nil {
		t.Error("ReadCgroups of no process: nil error")
	}
}

func FuzzParseCgroups(f *testing.F) {
	f.Add([]byte("0::/system.slice/docker-" + id1 + ".scope\n"))
	f.Add([]byte("11:memory:/kubepods/besteffort/pod" + uid + "/" + id1 + "\n0::/\n"))
	f.Add([]byte("0::/kubepods.slice/kubepods-pod" + uidU + ".slice/crio-conmon-" + id2 + ".scope\n"))
	f.Add([]byte("1:name=systemd:/docker/" + id1 + "/docker/" + id2))
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := ParseCgroups(b)
		if err != nil {
			return
		}
		if id := cs.ContainerID(); id != "" && (!isHexID(id) || !strings.Contains(string(b), id)) {
			t.Fatalf("container id %q: not 64 hex digits of the input", id)
		}
		if u := cs.PodUID(); u != "" && (!isUID(u) || !strings.Contains(strings.ReplaceAll(string(b), "_", "-"), u)) {
			t.Fatalf("pod UID %q: not a UUID of the input", u)
		}
	})
}

func TestEnviron(t *testing.T) {
	for _, c := range []struct {
		in   string
		cut  bool
		want []string
	}{
		{"A=1\x00B=2\x00", false, []string{"A=1", "B=2"}},
		{"A=1\x00B=2", false, []string{"A=1", "B=2"}},
		{"A=1\x00B=2", true, []string{"A=1"}},
		{"A=1\x00B=2\x00", true, []string{"A=1", "B=2"}},
		{"A=1", true, nil},
		{"\x00\x00A=\x00", false, []string{"A="}},
		{"", false, nil},
	} {
		if got := ParseEnviron([]byte(c.in), c.cut); strings.Join(got, "|") != strings.Join(c.want, "|") || len(got) != len(c.want) {
			t.Errorf("ParseEnviron(%q, %v) = %q, want %q", c.in, c.cut, got, c.want)
		}
	}
	env := []string{"OTEL_SERVICE_NAME=shop", "PYROSCOPE_APPLICATION_NAME=", "X=a=b", "X=second", "XY=1"}
	for _, c := range []struct {
		key, want string
		ok        bool
	}{{"OTEL_SERVICE_NAME", "shop", true}, {"PYROSCOPE_APPLICATION_NAME", "", true}, {"X", "a=b", true}, {"XY", "1", true},
		{"OTEL", "", false}, {"", "", false}, {"X=a", "", false}} {
		if v, ok := LookupEnv(env, c.key); v != c.want || ok != c.ok {
			t.Errorf("LookupEnv(%q) = %q, %v, want %q, %v", c.key, v, ok, c.want, c.ok)
		}
	}

	// A child's environment as it started, and one larger than the bound
	// (twelve entries of 120 KiB, each under the kernel's 128 KiB limit).
	small := []string{"PYROSCOPE_APPLICATION_NAME=checkout", "OTEL_SERVICE_NAME=shop"}
	var big []string
	for i := 0; i < 12; i++ {
		big = append(big, "BIG"+strconv.Itoa(i)+"="+strings.Repeat(strconv.Itoa(i%10), 120<<10))
	}
	for _, want := range [][]string{small, append(append([]string{}, small...), big...)} {
		cmd := exec.Command("sleep", "60")
		cmd.Env = want
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Start returns once the child passed exec's point of no
		// return, a moment before the kernel sets the new environment's
		// bounds: until then the file reads empty (seen on CI).
		got, err := Environ(cmd.Process.Pid)
		for deadline := time.Now().Add(5 * time.Second); err == nil && len(got) == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			got, err = Environ(cmd.Process.Pid)
		}
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for i, e := range got {
			total += len(e) + 1
			if i >= len(want) || e != want[i] {
				t.Fatalf("entry %d of %d: %.40q..., want %.40q...", i, len(got), e, want[min(i, len(want)-1)])
			}
		}
		if total > MaxEnviron || (total < len(strings.Join(want, "\x00")) && total < MaxEnviron-(130<<10)) {
			t.Errorf("read %d bytes of a %d-byte environment (bound %d)", total, len(strings.Join(want, "\x00"))+1, MaxEnviron)
		}
		if v, _ := LookupEnv(got, "OTEL_SERVICE_NAME"); v != "shop" {
			t.Errorf("OTEL_SERVICE_NAME = %q", v)
		}
	}
	if _, err := Environ(999999999); err == nil {
		t.Error("Environ of no process: nil error")
	}
}

// TestContainerLive reads the labels and thread ids of a Ruby in a
// container (testutil.StartContainerRuby: its own PID and mount
// namespaces and cgroup) from the host: the container id and pod UID the
// cgroup was named with, the environment it was given, and its threads'
// ids in its namespace (as the script reads them from its own /proc)
// mapped to the host's.
func TestContainerLive(t *testing.T) {
	for _, pod := range []bool{false, true} {
		name := "docker"
		if pod {
			name = "pod"
		}
		t.Run(name, func(t *testing.T) {
			c := testutil.StartContainerRuby(t, "container.rb", testutil.ContainerOptions{
				Pod: pod, Env: []string{"PYROSCOPE_APPLICATION_NAME=ct-" + name, "OTEL_SERVICE_NAME=other"}})
			id, err := ContainerID(c.Pid)
			if err != nil || id != c.ID {
				t.Errorf("ContainerID = %q, %v; want %q", id, err, c.ID)
			}
			pu, err := PodUID(c.Pid)
			if err != nil || pu != c.PodUID {
				t.Errorf("PodUID = %q, %v; want %q", pu, err, c.PodUID)
			}
			cs, err := ReadCgroups(c.Pid)
			if p, ok := cs.Unified(); err != nil || !ok || p != c.Cgroup {
				t.Errorf("unified cgroup %q, %v, want %q", p, err, c.Cgroup)
			}
			env, err := Environ(c.Pid)
			if v, ok := LookupEnv(env, "PYROSCOPE_APPLICATION_NAME"); err != nil || !ok || v != "ct-"+name {
				t.Errorf("PYROSCOPE_APPLICATION_NAME = %q (%v), %v; environment %q", v, ok, err, env)
			}
			tids, err := NamespaceTIDs(c.Pid)
			if err != nil {
				t.Fatal(err)
			}
			host, err := Tasks(c.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if len(tids) != len(host) || tids[1] != c.Pid {
				t.Errorf("NamespaceTIDs = %v for host threads %v, want one each and 1 -> %d", tids, host, c.Pid)
			}
			for _, l := range c.Lines {
				var r struct {
					Thread string `json:"thread"`
					TID    int    `json:"tid"`
				}
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatal(err)
				}
				h, ok := tids[r.TID]
				if !ok {
					t.Errorf("%s: container tid %d not mapped (%v)", r.Thread, r.TID, tids)
					continue
				}
				comm, _ := os.ReadFile("/proc/" + strconv.Itoa(c.Pid) + "/task/" + strconv.Itoa(h) + "/comm")
				if want := r.Thread; want != "main" && strings.TrimSpace(string(comm)) != want {
					t.Errorf("%s: container tid %d maps to host thread %d named %q", r.Thread, r.TID, h, comm)
				}
			}
		})
	}
	// A process in this PID namespace needs no map.
	if m, err := NamespaceTIDs(os.Getpid()); err != nil || m != nil {
		t.Errorf("NamespaceTIDs(self) = %v, %v; want nil", m, err)
	}
}
