package agent

import "testing"

// TestDefaultService: a process is named after its script, and Puma's
// retitled master and workers share one name.
func TestDefaultService(t *testing.T) {
	for _, c := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"ruby", "bin/shop.rb"}, "shop"},
		{[]string{"/usr/bin/ruby3.1", "/srv/app/worker.rb", "--queue", "x"}, "worker"},
		{[]string{"puma 6.4.2 (tcp://0.0.0.0:3000) [app]"}, "puma"},
		{[]string{"puma: cluster worker 0: 4242 [app]"}, "puma"},
		{[]string{"bundle", "exec", "sidekiq"}, "sidekiq"},
		{[]string{"sidekiq 7.2.0 app [0 of 5 busy]"}, "sidekiq"},
	} {
		if got := defaultService(c.cmd); got != c.want {
			t.Errorf("defaultService(%q) = %q, want %q", c.cmd, got, c.want)
		}
	}
}
