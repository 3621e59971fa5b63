package pyroscopetest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Socket is one of a process's internet sockets, from /proc/net.
type Socket struct {
	Proto  string // tcp, tcp6, udp, udp6
	Local  string // local address as /proc shows it: "0100007F:0FC8"
	Remote string // remote address, all zeros when unconnected
	State  string // hex state; "0A" is LISTEN for TCP
}

// Loopback says whether the socket's local address is 127.0.0.0/8 or ::1.
func (s Socket) Loopback() bool { return loopback(s.Local) }

// RemoteOK says whether the remote end is loopback or unset.
func (s Socket) RemoteOK() bool {
	addr, _, _ := strings.Cut(s.Remote, ":")
	return strings.Trim(addr, "0") == "" || loopback(s.Remote)
}

func loopback(a string) bool {
	addr, _, _ := strings.Cut(a, ":")
	switch len(addr) {
	case 8: // IPv4, little-endian: 127.x.y.z ends in 7F
		return strings.HasSuffix(addr, "7F")
	case 32:
		return addr == "00000000000000000000000001000000" || // ::1
			strings.HasPrefix(addr, "0000000000000000FFFF0000") && strings.HasSuffix(addr, "7F") // ::ffff:127.x
	}
	return false
}

// Listening says whether the socket accepts traffic: a TCP listener or any
// bound UDP socket.
func (s Socket) Listening() bool {
	return strings.HasPrefix(s.Proto, "udp") || s.State == "0A"
}

// Sockets lists the internet sockets process pid holds.
func Sockets(pid int) ([]Socket, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, fmt.Errorf("list fds: %w", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var out []Socket
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, proto))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			out = append(out, Socket{Proto: proto, Local: fs[1], Remote: fs[2], State: fs[3]})
		}
		f.Close()
	}
	return out, nil
}
