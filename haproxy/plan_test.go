package haproxy

import (
	"slices"
	"strings"
	"testing"
)

func srv(name, host string, port int) Server { return Server{Name: name, Host: host, Port: port} }

func TestDiff(t *testing.T) {
	const params = "check inter 2000ms fall 2 rise 1"
	base := func() State {
		return State{Structure: "s1", Params: params, Backends: map[string][]Server{
			"a_mixed": {srv("a0", "10.0.0.1", 8000), srv("a1", "10.0.0.2", 8000)},
		}}
	}
	tests := []struct {
		name       string
		desired    func(s *State)
		current    func(s *State)
		wantCmds   []string
		wantReload []string // substrings of the reasons, in order
	}{
		{name: "in sync"},
		{
			name:     "new endpoint is added at run time",
			desired:  func(s *State) { s.Backends["a_mixed"] = append(s.Backends["a_mixed"], srv("a2", "10.0.0.3", 8000)) },
			wantCmds: []string{"add server a_mixed/a2 10.0.0.3:8000 " + params},
		},
		{
			name:     "removed endpoint drains",
			desired:  func(s *State) { s.Backends["a_mixed"] = s.Backends["a_mixed"][:1] },
			wantCmds: []string{"drain and del server a_mixed/a1"},
		},
		{
			name:     "moved endpoint changes address in place",
			desired:  func(s *State) { s.Backends["a_mixed"][1].Port = 9000 },
			wantCmds: []string{"set server a_mixed/a1 addr 10.0.0.2 port 9000"},
		},
		{
			name: "additions come before removals",
			desired: func(s *State) {
				s.Backends["a_mixed"] = []Server{srv("a1", "10.0.0.2", 8000), srv("a9", "10.0.0.9", 8000)}
			},
			wantCmds: []string{
				"add server a_mixed/a9 10.0.0.9:8000 " + params,
				"drain and del server a_mixed/a0",
			},
		},
		{
			name:     "desired server left in maint is enabled",
			current:  func(s *State) { s.Backends["a_mixed"][0].Maint = true },
			wantCmds: []string{"enable server a_mixed/a0"},
		},
		{
			name:     "hostnames are not compared with resolved addresses",
			desired:  func(s *State) { s.Backends["a_mixed"][0].Host = "replica-0.local" },
			wantCmds: nil,
		},
		{
			name:       "new pool needs a reload",
			desired:    func(s *State) { s.Backends["b_mixed"] = []Server{srv("b0", "10.0.1.1", 8000)} },
			wantReload: []string{"Backend b_mixed is new."},
		},
		{
			name:       "removed pool needs a reload",
			current:    func(s *State) { s.Backends["old_mixed"] = nil },
			wantReload: []string{"Backend old_mixed was removed."},
		},
		{
			name:       "changed settings need a reload",
			desired:    func(s *State) { s.Structure = "s2" },
			wantReload: []string{"Settings outside server lines changed (structure s1 -> s2)."},
		},
		{
			name:       "unknown file on disk needs a reload",
			current:    func(s *State) { s.Structure = "" },
			wantReload: []string{"not rendered by turnout"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, c := base(), base()
			c.Params = ""
			if tc.desired != nil {
				tc.desired(&d)
			}
			if tc.current != nil {
				tc.current(&c)
			}
			p := Diff(d, c)
			var got []string
			for _, cmd := range p.Runtime {
				got = append(got, cmd.String())
			}
			if !slices.Equal(got, tc.wantCmds) {
				t.Errorf("runtime = %q, want %q", got, tc.wantCmds)
			}
			if p.Reload != (len(tc.wantReload) > 0) {
				t.Fatalf("reload = %v (%q), want %v", p.Reload, p.Reasons, len(tc.wantReload) > 0)
			}
			for i, w := range tc.wantReload {
				if i >= len(p.Reasons) || !strings.Contains(p.Reasons[i], w) {
					t.Errorf("reasons = %q, want %q", p.Reasons, tc.wantReload)
				}
			}
		})
	}
}

func TestParseServersState(t *testing.T) {
	out := `1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 m_mixed 1 r0 127.0.0.1 2 0 1 1 5 15 3 4 6 0 0 0 - 40001 - 0 0 - - 0
3 m_mixed 2 r1 127.0.0.1 0 1 1 1 5 15 3 4 6 0 0 0 - 40002 - 0 0 - - 0
`
	got, err := parseServersState(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Server{{Name: "r0", Host: "127.0.0.1", Port: 40001}, {Name: "r1", Host: "127.0.0.1", Port: 40002, Maint: true}}
	if !slices.Equal(got["m_mixed"], want) {
		t.Fatalf("got %+v, want %+v", got["m_mixed"], want)
	}
	if _, err := parseServersState("2\n"); err == nil {
		t.Fatal("format 2 accepted")
	}
}
