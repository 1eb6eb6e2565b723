package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestNATSAuthWritesUsersForTheConfiguredRoutesAndSaysWhatEachProcessSets(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
	out := filepath.Join(t.TempDir(), "auth")
	got, err := runRoot(t, "nats-auth", "--config", path, "--out", out, "--worker", "w0=fake-0", "--client", "alice")
	if err != nil {
		t.Fatalf("nats-auth: %v\n%s", err, got)
	}
	for _, f := range []string{natsauth.ServerConfigFile, "gateway.nk", "w0.nk", "alice.nk", "observer.nk"} {
		fi, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	conf, err := os.ReadFile(filepath.Join(out, natsauth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "# worker of routes fake-0;") {
		t.Errorf("the permissions do not follow the configured routes:\n%s", conf)
	}
	for _, want := range []string{"nkey_seed_file: " + filepath.Join(out, "w0.nk"), schemas.ClientInbox("alice")} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if again, err := runRoot(t, "nats-auth", "--config", path, "--out", out); err == nil {
		t.Fatalf("a second run overwrote the secrets:\n%s", again)
	}
}

func TestNATSAuthWritesTheServeUserOnlyWithServe(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
	tests := []struct {
		name  string
		args  []string
		serve bool
	}{
		{"gateways and workers need no serve user", nil, false},
		{"--serve writes it, for serve with a listener", []string{"--serve"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "auth")
			got, err := runRoot(t, append([]string{"nats-auth", "--config", path, "--out", out}, tt.args...)...)
			if err != nil {
				t.Fatalf("nats-auth: %v\n%s", err, got)
			}
			_, err = os.Stat(filepath.Join(out, "serve.nk"))
			if exists := err == nil; exists != tt.serve {
				t.Fatalf("serve.nk written: %v (%v), want %v", exists, err, tt.serve)
			}
			conf, err := os.ReadFile(filepath.Join(out, natsauth.ServerConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			if has := strings.Contains(string(conf), "# serve of routes fake-0, fake-1;"); has != tt.serve {
				t.Errorf("the server configuration holds a serve user: %v, want %v:\n%s", has, tt.serve, conf)
			}
			told := "server_config: " + filepath.Join(out, natsauth.ServerConfigFile)
			if has := strings.Contains(got, told); has != tt.serve {
				t.Errorf("output tells serve its server_config: %v, want %v:\n%s", has, tt.serve, got)
			}
		})
	}
}

func TestNATSAuthRefusesAWorkerOfAnUnknownRoute(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1")
	out, err := runRoot(t, "nats-auth", "--config", path, "--out", t.TempDir(), "--worker", "w=nope")
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("nats-auth: %v\n%s", err, out)
	}
}

func TestNATSAuthWithTLSWritesCertificatesAndSaysWhichFilesEachProcessSets(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1")
	out := filepath.Join(t.TempDir(), "auth")
	got, err := runRoot(t, "nats-auth", "--config", path, "--out", out, "--tls", "--tls-name", "nats.internal")
	if err != nil {
		t.Fatalf("nats-auth --tls: %v\n%s", err, got)
	}
	for _, f := range []string{natsauth.CAFile, natsauth.ServerCertFile, natsauth.ServerKeyFile,
		natsauth.ClientCertFile("gateway"), natsauth.ClientKeyFile("gateway"), natsauth.ClientCertFile("worker")} {
		if _, err := os.Stat(filepath.Join(out, natsauth.TLSDir, f)); err != nil {
			t.Error(err)
		}
	}
	conf, err := os.ReadFile(filepath.Join(out, natsauth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "include ./"+natsauth.TLSServerConfigFile) {
		t.Errorf("the server configuration does not include its tls block:\n%s", conf)
	}
	if want := "cert_file: " + filepath.Join(out, natsauth.TLSDir, natsauth.ClientCertFile("gateway")); !strings.Contains(got, want) {
		t.Errorf("output lacks %q:\n%s", want, got)
	}
	if out2, err := runRoot(t, "nats-auth", "--config", path, "--out", t.TempDir(), "--tls-name", "x"); err == nil {
		t.Errorf("--tls-name without --tls was accepted:\n%s", out2)
	}
}

// The second region, generated --from the first's directory, takes the
// first's CA and link password; each region's gateway block names its
// remotes and nats-server reads it.
func TestNATSAuthWritesEachRegionsGatewayLinksWithTheFirstRegionsCAAndPassword(t *testing.T) {
	base := t.TempDir()
	eastOut, westOut := filepath.Join(base, "east"), filepath.Join(base, "west")
	east := writeConfig(t, "deployment: {region: east}\n", "http://127.0.0.1:1/v1")
	west := writeConfig(t, "deployment: {region: west}\n", "http://127.0.0.1:1/v1")
	if got, err := runRoot(t, "nats-auth", "--config", east, "--out", eastOut, "--gateway-listen", "127.0.0.1:7222"); err == nil {
		t.Fatalf("gateway links without --tls: no error\n%s", got)
	}
	if got, err := runRoot(t, "nats-auth", "--config", east, "--out", eastOut, "--tls",
		"--gateway-listen", "127.0.0.1:7222", "--gateway-remote", "west=127.0.0.1:7223"); err != nil {
		t.Fatalf("east: %v\n%s", err, got)
	} else if !strings.Contains(got, natsauth.GatewayConfigFile) {
		t.Errorf("the output does not name the gateway block:\n%s", got)
	}
	if got, err := runRoot(t, "nats-auth", "--config", west, "--out", westOut, "--tls", "--from", eastOut,
		"--gateway-listen", "127.0.0.1:7223", "--gateway-remote", "east=127.0.0.1:7222"); err != nil {
		t.Fatalf("west: %v\n%s", err, got)
	}
	read := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if read(filepath.Join(eastOut, natsauth.TLSDir, natsauth.CAFile)) != read(filepath.Join(westOut, natsauth.TLSDir, natsauth.CAFile)) {
		t.Error("west's CA is not east's")
	}
	if read(filepath.Join(eastOut, natsauth.GatewayPasswordFile)) != read(filepath.Join(westOut, natsauth.GatewayPasswordFile)) {
		t.Error("west's link password is not east's")
	}
	if _, err := os.Stat(filepath.Join(westOut, natsauth.TLSDir, natsauth.CAKeyFile)); err == nil {
		t.Error("west holds a copy of the CA's key")
	}
	for _, r := range []struct{ dir, name, remote string }{{eastOut, "east", "west"}, {westOut, "west", "east"}} {
		conf := filepath.Join(r.dir, "server.conf")
		if err := os.WriteFile(conf, []byte("include ./"+natsauth.ServerConfigFile+"\ninclude ./"+natsauth.GatewayConfigFile+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatalf("nats-server cannot read %s's configuration: %v", r.name, err)
		}
		if g := opts.Gateway; g.Name != r.name || g.Username != natsauth.GatewayUser || len(g.Gateways) != 1 || g.Gateways[0].Name != r.remote || g.TLSConfig == nil {
			t.Errorf("%s's gateway block: %+v", r.name, g)
		}
	}
}
