package agent

import (
	"strings"

	"github.com/rbscope/rbscope/internal/upload"
)

// Labels are what a process's profiles are labelled with, besides pid,
// ruby_version, hostname and the user's tags, which the agent adds.
type Labels struct {
	// Service is Pyroscope's service_name.
	Service string
	// Extra are more labels (container_id, pod_uid, ...).
	Extra map[string]string
}

// labelsFor computes the labels of process pid, whose command line is cmd
// (read when the process was discovered). It is the one place where
// labels are computed: the container side (service_name from the
// target's PYROSCOPE_APPLICATION_NAME / OTEL_SERVICE_NAME, container_id
// and the pod UID from its cgroup) plugs in here. Today: service_name is
// the script's name (see defaultService).
var labelsFor = func(pid int, cmd []string) Labels {
	return Labels{Service: defaultService(cmd)}
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
