package agent

import (
	"regexp"
	"strings"

	"github.com/rbscope/rbscope/internal/procfs"
	"github.com/rbscope/rbscope/internal/upload"
)

// Labels are what a process's profiles are labelled with, besides pid,
// ruby_version, hostname and the user's tags, which the agent adds.
type Labels struct {
	// Service is Pyroscope's service_name.
	Service string
	// Extra are more labels (container_id, pod_uid).
	Extra map[string]string
}

// serviceEnv are the target's environment variables that name its
// service, in order of precedence (Pyroscope's SDKs, then OpenTelemetry's).
var serviceEnv = []string{"PYROSCOPE_APPLICATION_NAME", "OTEL_SERVICE_NAME"}

// serviceNameRe is what a service name from the environment may hold: a
// value outside it (a label Pyroscope would refuse) is ignored.
var serviceNameRe = regexp.MustCompile(`^[A-Za-z0-9_.\-/:]{1,128}$`)

// labelsFor computes the labels of process pid, whose command line is cmd
// (read when the process was discovered): the one place labels are
// computed. service_name comes from the target's own environment
// (serviceEnv) as it was at exec, else from its script's name
// (defaultService); container_id and pod_uid from its cgroup, in the
// shapes Docker, Podman, containerd and CRI-O give it (procfs.Cgroups).
var labelsFor = func(pid int, cmd []string) Labels {
	l := Labels{Service: defaultService(cmd), Extra: map[string]string{}}
	if env, err := procfs.Environ(pid); err == nil {
		for _, k := range serviceEnv {
			if v, ok := procfs.LookupEnv(env, k); ok && serviceNameRe.MatchString(v) {
				l.Service = v
				break
			}
		}
	}
	if cs, err := procfs.ReadCgroups(pid); err == nil {
		if id := cs.ContainerID(); id != "" {
			l.Extra["container_id"] = id
		}
		if uid := cs.PodUID(); uid != "" {
			l.Extra["pod_uid"] = uid
		}
	}
	return l
}

// defaultService names a process after its script, as record does
// (upload.DefaultAppName). A process that rewrote its title into one
// argument (Puma's "puma: cluster worker 0: 4242 [app]") is split at
// spaces first, so that a Puma master and its workers share "puma".
func defaultService(cmd []string) string {
	if len(cmd) == 1 && strings.ContainsRune(cmd[0], ' ') {
		cmd = strings.Fields(cmd[0])
	}
	return upload.DefaultAppName(cmd)
}
