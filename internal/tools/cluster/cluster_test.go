package cluster

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/config"
)

// plannedSpec is a spec on free ports in a temporary directory, with
// binaries that are never run.
func plannedSpec(t *testing.T, natsNodes int) Spec {
	t.Helper()
	ports, err := FreePorts(natsNodes, 2, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Dir: t.TempDir(), Hedgerow: "/bin/true", NATSServer: "/bin/true", RedisServer: "/bin/true",
		Prometheus: "/bin/true", Workers: 2, Gateways: 2, Ports: ports, TimeScale: 1}
}

func TestEveryGeneratedConfigurationLoadsForItsRole(t *testing.T) {
	s := plannedSpec(t, 3)
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeCredentials(s); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Spec: s}
	if err := m.plan(); err != nil {
		t.Fatal(err)
	}
	env := func(name string) (string, bool) { return "k", name == hashKeyEnv }
	for _, c := range []struct {
		file string
		role config.Role
	}{{"gateway-1.yaml", config.RoleGateway}, {"gateway-2.yaml", config.RoleGateway}, {"worker-1.yaml", config.RoleWorker}} {
		cfg, err := config.Load(filepath.Join(s.Dir, c.file), c.role, env)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		if cfg.NATS.TLS.CertFile == "" || cfg.NATS.TLS.CAFile == "" || cfg.NATS.NKeySeedFile == "" {
			t.Errorf("%s: no TLS client certificate or nkey: %+v", c.file, cfg.NATS)
		}
		if cfg.Gate.Replicas != 3 || cfg.Records.Replicas != 3 {
			t.Errorf("%s: gate %d and records %d replicas on three nodes, want 3", c.file, cfg.Gate.Replicas, cfg.Records.Replicas)
		}
	}
	for i := range s.Ports.NATS {
		opts, err := server.ProcessConfigFile(filepath.Join(s.Dir, natsName(i)+".conf"))
		if err != nil {
			t.Fatalf("nats-server cannot read %s: %v", natsName(i), err)
		}
		if opts.TLSConfig == nil || opts.Cluster.TLSConfig == nil || len(opts.Nkeys) == 0 || !opts.JetStream || !opts.SyncAlways {
			t.Errorf("%s: TLS %v, route TLS %v, users %d, JetStream %v, sync always %v", natsName(i),
				opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil, len(opts.Nkeys), opts.JetStream, opts.SyncAlways)
		}
		if len(opts.Routes) != len(s.Ports.NATS) {
			t.Errorf("%s: %d routes, want %d", natsName(i), len(opts.Routes), len(s.Ports.NATS))
		}
	}
	for _, name := range []string{hashKeyFile, "nats-auth/gateway.nk", "nats-auth/tls/gateway-key.pem"} {
		fi, err := os.Stat(filepath.Join(s.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
}

func TestASpecWithAPortTwiceOrMissingIsRefused(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
	}{
		{"a port used twice", func(s *Spec) { s.Ports.Redis = s.Ports.Gateways[0] }},
		{"a gateway without its port", func(s *Spec) { s.Gateways = 3 }},
		{"no state directory", func(s *Spec) { s.Dir = "" }},
		{"Prometheus without a port", func(s *Spec) { s.Ports.Prometheus = 0 }},
		{"a route without its port", func(s *Spec) { s.Ports.FakeLLM = s.Ports.FakeLLM[:2] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := plannedSpec(t, 1)
			tt.change(&s)
			if err := s.validate(); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestDownWithNothingUpIsNoError(t *testing.T) {
	if err := Down(t.TempDir(), io.Discard); err != nil {
		t.Fatal(err)
	}
}
