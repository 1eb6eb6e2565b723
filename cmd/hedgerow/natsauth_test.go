package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/natsauth"
)

func TestNATSAuthWritesUsersForTheConfiguredRoutesAndSaysWhatEachProcessSets(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
	out := filepath.Join(t.TempDir(), "auth")
	got, err := runRoot(t, "nats-auth", "--config", path, "--out", out, "--worker", "w0=fake-0", "--client", "alice")
	if err != nil {
		t.Fatalf("nats-auth: %v\n%s", err, got)
	}
	for _, f := range []string{natsauth.ServerConfigFile, "serve.nk", "gateway.nk", "w0.nk", "alice.nk", "observer.nk"} {
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
	if !strings.Contains(string(conf), "# worker of routes fake-0;") || !strings.Contains(string(conf), "# serve of routes fake-0, fake-1;") {
		t.Errorf("the permissions do not follow the configured routes:\n%s", conf)
	}
	for _, want := range []string{"server_config: " + filepath.Join(out, natsauth.ServerConfigFile), "nkey_seed_file: " + filepath.Join(out, "w0.nk"), natsauth.ClientInbox("alice")} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if again, err := runRoot(t, "nats-auth", "--config", path, "--out", out); err == nil {
		t.Fatalf("a second run overwrote the secrets:\n%s", again)
	}
}

func TestNATSAuthRefusesAWorkerOfAnUnknownRoute(t *testing.T) {
	path := writeConfig(t, "", "http://127.0.0.1:1/v1")
	out, err := runRoot(t, "nats-auth", "--config", path, "--out", t.TempDir(), "--worker", "w=nope")
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("nats-auth: %v\n%s", err, out)
	}
}

func TestServeRefusesANATSListenerWithoutUsersAndNamesTheGenerator(t *testing.T) {
	path := writeConfig(t, "nats: {listen: 127.0.0.1:0}\n", "http://127.0.0.1:1/v1")
	out, err := runRoot(t, "serve", "--config", path)
	if err == nil || !strings.Contains(err.Error(), "hedgerow nats-auth") {
		t.Fatalf("serve: %v\n%s", err, out)
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
