package natsauth

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/worker"
)

func spec() Spec {
	return Spec{Routes: []string{"a", "b"}, Workers: map[string][]string{"wa": {"a"}, "wab": {"a", "b"}},
		Clients: []string{"alice", "bob"}, Responses: ResponsesFor(30*time.Second, 250*time.Millisecond)}
}

func TestWorkersMayAnswerEveryMessageOfAStreamedAttemptUntilPastTheDeadline(t *testing.T) {
	const deadline, heartbeat = 30 * time.Second, 250 * time.Millisecond
	r := ResponsesFor(deadline, heartbeat)
	if r.Expires <= deadline {
		t.Errorf("responses expire after %v, not after the deadline %v", r.Expires, deadline)
	}
	// A chunk per coalesce delay, a heartbeat per interval, all the way to
	// the deadline, plus Accept, FirstByte and the result.
	worst := int(deadline/worker.DefaultCoalesceDelay) + int(deadline/heartbeat) + 3
	if r.Max < worst {
		t.Errorf("responses allow %d messages, a streamed attempt may send %d", r.Max, worst)
	}
}

func TestTheGeneratedServerConfigurationGivesEachUserOnlyItsSubjects(t *testing.T) {
	b, err := Generate(spec())
	if err != nil {
		t.Fatal(err)
	}
	_, opts := writeAndLoad(t, b)
	byKey := map[string]*server.NkeyUser{}
	for _, u := range opts.Nkeys {
		byKey[u.Nkey] = u
	}
	want := []string{"gateway", "observer", "wa", "wab", "alice", "bob"}
	if len(b.Users) != len(want) || len(opts.Nkeys) != len(want) {
		t.Fatalf("users %d, server nkeys %d, want %d", len(b.Users), len(opts.Nkeys), len(want))
	}
	tests := []struct {
		user      string
		subscribe []string
		responses bool
	}{
		// A worker takes attempts in its route's queue group only.
		{"wa", append([]string{"hedgerow.attempt.a hedgerow-worker-a", "_INBOX.wk.>"}, ownSRV("hedgerow-worker")...), true},
		{"wab", append([]string{"hedgerow.attempt.a hedgerow-worker-a", "hedgerow.attempt.b hedgerow-worker-b", "_INBOX.wk.>"},
			ownSRV("hedgerow-worker")...), true},
		{"alice", []string{"_INBOX.cl.alice.>"}, false},
		{"bob", []string{"_INBOX.cl.bob.>"}, false},
		{"observer", []string{"hedgerow.events.>", "_INBOX.ob.>"}, false},
		{"gateway", append([]string{"_INBOX.gw.>", "hedgerow.submit", "hedgerow.submit.cancel.>"}, ownSRV("hedgerow")...), false},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			u, ok := b.User(tt.user)
			if !ok {
				t.Fatalf("no user %s", tt.user)
			}
			su := byKey[u.Public]
			if su == nil || su.Permissions == nil {
				t.Fatalf("the server has no permissions for %s", tt.user)
			}
			if got := su.Permissions.Subscribe.Allow; !slices.Equal(got, tt.subscribe) {
				t.Errorf("subscribe %q, want %q", got, tt.subscribe)
			}
			if got := su.Permissions.Response != nil; got != tt.responses {
				t.Errorf("allow_responses %v, want %v", got, tt.responses)
			}
			if r := su.Permissions.Response; r != nil && (r.MaxMsgs != spec().Responses.Max || r.Expires != spec().Responses.Expires) {
				t.Errorf("allow_responses %+v, want %+v", r, spec().Responses)
			}
		})
	}
}

// ownSRV are the micro-service subjects a service called name may
// subscribe to: each verb's generic subject, and the verb's subjects of that
// name only — no wildcard in place of a verb or a name.
func ownSRV(name string) []string {
	var out []string
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		out = append(out, "$SRV."+verb, "$SRV."+verb+"."+name, "$SRV."+verb+"."+name+".*")
	}
	return out
}

func TestTheServeUserIsGeneratedOnlyWhenAskedFor(t *testing.T) {
	tests := []struct {
		name  string
		serve bool
	}{
		{"a deployment of gateways and workers has no serve user", false},
		{"serve with a listener gets its user", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec()
			s.Serve = tt.serve
			b, err := Generate(s)
			if err != nil {
				t.Fatal(err)
			}
			u, ok := b.User(UserServe)
			if ok != tt.serve {
				t.Fatalf("serve user generated: %v, want %v", ok, tt.serve)
			}
			_, opts := writeAndLoad(t, b)
			if len(opts.Nkeys) != len(b.Users) {
				t.Fatalf("the server holds %d users, the bundle %d", len(opts.Nkeys), len(b.Users))
			}
			if !tt.serve {
				return
			}
			// Its workers are pinned like any worker's.
			for _, want := range []string{"hedgerow.attempt.a hedgerow-worker-a", "hedgerow.attempt.b hedgerow-worker-b", "_INBOX.gw.>"} {
				if !slices.Contains(u.Permissions.Subscribe, want) {
					t.Errorf("serve may not subscribe to %q: %q", want, u.Permissions.Subscribe)
				}
			}
			if slices.Contains(u.Permissions.Subscribe, "hedgerow.attempt.a") {
				t.Errorf("serve may subscribe to route a's attempts outside the queue group")
			}
		})
	}
}

func TestSecretsAreWrittenPrivatelyAndNeverOverwritten(t *testing.T) {
	for _, m := range []Method{MethodNKey, MethodPassword} {
		t.Run(string(m), func(t *testing.T) {
			s := spec()
			s.Method = m
			b, err := Generate(s)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "auth")
			if err := b.Write(dir); err != nil {
				t.Fatal(err)
			}
			conf, err := os.ReadFile(filepath.Join(dir, ServerConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range b.Users {
				fi, err := os.Stat(filepath.Join(dir, u.SecretFile))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != 0o600 {
					t.Errorf("%s has mode %v, want 0600", u.SecretFile, fi.Mode().Perm())
				}
				if len(u.Secret) == 0 || strings.Contains(string(conf), string(u.Secret)) {
					t.Errorf("the server configuration holds %s's secret", u.Name)
				}
			}
			if err := b.Write(dir); err == nil {
				t.Fatal("a second Write overwrote the secrets")
			}
		})
	}
}

func TestGenerateRefusesASpecItCannotHonour(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
	}{
		{"a worker of a route that does not exist", func(s *Spec) { s.Workers = map[string][]string{"w": {"nope"}} }},
		{"a worker with no routes", func(s *Spec) { s.Workers = map[string][]string{"w": nil} }},
		{"a user name that is not a token", func(s *Spec) { s.Clients = []string{"Alice.Smith"} }},
		{"a client named like a role's user", func(s *Spec) { s.Clients = []string{"gateway"} }},
		{"an unknown method", func(s *Spec) { s.Method = "jwt" }},
		{"no routes", func(s *Spec) { s.Routes = nil }},
		{"no response bound", func(s *Spec) { s.Responses = Responses{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec()
			tt.change(&s)
			if _, err := Generate(s); err == nil {
				t.Fatal("Generate accepted it")
			}
		})
	}
}

// writeAndLoad writes b into a new directory and reads its server
// configuration back as nats-server does, failing the test if it cannot.
func writeAndLoad(t *testing.T, b *Bundle) (string, *server.Options) {
	t.Helper()
	dir := t.TempDir()
	if err := b.Write(dir); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, ServerConfigFile))
	if err != nil {
		t.Fatalf("nats-server cannot read the generated configuration: %v", err)
	}
	return dir, opts
}

// A region's users may touch only the region's wire (docs/architecture.md
// §13, §14): its attempts, queue groups, submit service, pings and records.
func TestARegionsUsersTouchOnlyTheRegionsWire(t *testing.T) {
	s := spec()
	s.Region = "east"
	b, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		user               string
		publish, subscribe []string // each among the user's
	}{
		{"gateway", []string{"hedgerow.east.attempt.*", "hedgerow.east.events.attempt", "hedgerow.east.events.group",
			"hedgerow.east.records.>", "$SRV.PING.hedgerow-worker_east"},
			[]string{"hedgerow.east.submit", "hedgerow.east.submit.cancel.>", "$SRV.PING.hedgerow_east"}},
		{"wa", []string{"hedgerow.east.events.attempt"},
			[]string{"hedgerow.east.attempt.a hedgerow-worker-a_east", "$SRV.PING.hedgerow-worker_east"}},
		{"alice", []string{"hedgerow.east.submit", "hedgerow.east.submit.cancel.alice.*", "$SRV.PING.hedgerow_east"}, nil},
		{"observer", nil, []string{"hedgerow.east.events.>"}},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			u, ok := b.User(tt.user)
			if !ok {
				t.Fatalf("no user %s", tt.user)
			}
			for _, p := range tt.publish {
				if !slices.Contains(u.Permissions.Publish, p) {
					t.Errorf("may not publish %q; publish %q", p, u.Permissions.Publish)
				}
			}
			for _, p := range tt.subscribe {
				if !slices.Contains(u.Permissions.Subscribe, p) {
					t.Errorf("may not subscribe %q; subscribe %q", p, u.Permissions.Subscribe)
				}
			}
			for _, p := range append(slices.Clone(u.Permissions.Publish), u.Permissions.Subscribe...) {
				if strings.HasPrefix(p, "hedgerow.") && !strings.HasPrefix(p, "hedgerow.east.") {
					t.Errorf("%q is not region east's", p)
				}
			}
		})
	}
}
