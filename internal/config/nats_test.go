package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const natsURL = "nats:\n  urls: [nats://127.0.0.1:4222]\n"

func TestNATSCredentialsAreCheckedForTheRolesThatConnect(t *testing.T) {
	tests := []struct {
		name     string
		role     Role
		nats     string // the nats section's lines after urls
		env      map[string]string
		path     string // "" when the file is valid
		msg      string
		secretOK string // a value that must never appear in a problem
	}{
		{name: "a password from the environment", role: RoleGateway,
			nats: "  user: gw\n  password_env: NATS_PW\n", env: map[string]string{"NATS_PW": "s3cret-value"}},
		{name: "a missing password variable is named, never a value", role: RoleWorker,
			nats: "  user: wk\n  password_env: NATS_PW\n", path: "nats.password_env",
			msg: "environment variable NATS_PW is not set"},
		{name: "a user without a password variable", role: RoleGateway,
			nats: "  user: gw\n", path: "nats.password_env", msg: "go together"},
		{name: "two methods at once", role: RoleGateway,
			nats: "  nkey_seed_file: gw.nk\n  creds_file: gw.creds\n", path: "nats", msg: "not several"},
		{name: "credentials in a URL are refused without echoing it", role: RoleGateway,
			nats: "  urls: [nats://gw:hunter2@127.0.0.1:4222]\n", path: "nats.urls[0]", msg: "must not hold credentials",
			secretOK: "hunter2"},
		{name: "a client certificate without its key", role: RoleWorker,
			nats: "  tls: {cert_file: c.pem}\n", path: "nats.tls.cert_file", msg: "go together"},
		{name: "only serve embeds a server", role: RoleGateway,
			nats: "  server_config: nats-server.conf\n", path: "nats.server_config", msg: "only serve"},
		{name: "serve with users connects as one of them", role: RoleServe,
			nats: "  listen: 127.0.0.1:4333\n  server_config: nats-server.conf\n", path: "nats.server_config", msg: "serve connects to its own server"},
		{name: "serve with users and its seed", role: RoleServe,
			nats: "  listen: 127.0.0.1:4333\n  server_config: nats-server.conf\n  nkey_seed_file: serve.nk\n"},
		{name: "serve in process needs no password", role: RoleServe,
			nats: "  user: serve\n  password_env: NATS_PW\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := minimal + natsURL + tt.nats
			if strings.HasPrefix(tt.nats, "  urls:") {
				src = minimal + "nats:\n" + tt.nats
			}
			_, ps := parse(t, src, tt.role, envOf(tt.env))
			if tt.path == "" {
				if ps != nil {
					t.Fatalf("problems: %v", ps)
				}
				return
			}
			wantProblem(t, ps, tt.path, tt.msg)
			for _, p := range ps {
				if tt.secretOK != "" && strings.Contains(fmt.Sprint(p), tt.secretOK) {
					t.Errorf("a problem echoes the secret: %v", p)
				}
				if strings.Contains(fmt.Sprint(p), "s3cret-value") {
					t.Errorf("a problem echoes the password: %v", p)
				}
			}
		})
	}
}

func TestNATSFilePathsAreResolvedAgainstTheConfigFile(t *testing.T) {
	src := minimal + natsURL + "  nkey_seed_file: secrets/gw.nk\n  tls: {ca_file: ca.pem, cert_file: /abs/c.pem, key_file: k.pem}\n"
	c, err := Parse(filepath.Join("/etc/hedgerow", "h.yaml"), []byte(src), RoleGateway, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		c.NATS.NKeySeedFile: "/etc/hedgerow/secrets/gw.nk",
		c.NATS.TLS.CAFile:   "/etc/hedgerow/ca.pem",
		c.NATS.TLS.CertFile: "/abs/c.pem",
		c.NATS.TLS.KeyFile:  "/etc/hedgerow/k.pem",
	} {
		if got != want {
			t.Errorf("path %q, want %q", got, want)
		}
	}
}

func TestSyncIntervalIsAlwaysByDefaultOrAPositiveDurationForServeOnly(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		role       Role
		want       SyncInterval
		problem    string // empty: valid
	}{
		{"absent means always", "", RoleServe, 0, ""},
		{"always fsyncs every write", "nats:\n  sync_interval: always\n", RoleServe, 0, ""},
		{"a duration is a timer", "nats:\n  sync_interval: 2m\n", RoleServe, SyncInterval(2 * time.Minute), ""},
		{"zero is refused", "nats:\n  sync_interval: 0s\n", RoleServe, 0, "positive duration"},
		{"a word other than always is refused", "nats:\n  sync_interval: never\n", RoleServe, 0, "positive duration"},
		{"a gateway embeds no server", "nats:\n  urls: [nats://127.0.0.1:4223]\n  sync_interval: 2m\n", RoleGateway, 0, "only serve"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, ps := parse(t, minimal+tt.yaml, tt.role, envOf(map[string]string{"HEDGEROW_HASH_KEY": "k"}))
			if tt.problem != "" {
				wantProblem(t, ps, "nats.sync_interval", tt.problem)
				return
			}
			wantNoProblems(t, ps)
			if c.NATS.SyncInterval != tt.want {
				t.Errorf("sync_interval %v, want %v", c.NATS.SyncInterval, tt.want)
			}
		})
	}
}

// A NATS listener opens serve's embedded server to other processes, so
// serve's configuration needs the generated users with it: the problem is
// config.ErrOpenListener, the error serve itself refuses to start with.
// Gateways and workers never listen, and the generator reads the file
// before the users exist.
func TestServeRefusesANATSListenerWithoutUsersAsItsProblem(t *testing.T) {
	const listen = "nats:\n  listen: 127.0.0.1:4333\n"
	tests := []struct {
		name    string
		role    Role
		nats    string
		refused bool
	}{
		{"serve with a listener and no users", RoleServe, listen, true},
		{"serve with a listener and its seed but no users", RoleServe, listen + "  nkey_seed_file: serve.nk\n", true},
		{"serve with a listener and the generated users", RoleServe, listen + "  server_config: nats-server.conf\n  nkey_seed_file: serve.nk\n", false},
		{"serve in process", RoleServe, "", false},
		{"a gateway never listens", RoleGateway, natsURL + "  listen: 127.0.0.1:4333\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(minimal+tt.nats), tt.role, noEnv)
			if got := errors.Is(err, ErrOpenListener); got != tt.refused {
				t.Fatalf("Parse: %v; ErrOpenListener %v, want %v", err, got, tt.refused)
			}
			if tt.refused {
				wantProblem(t, err.(Problems), "nats.listen", "hedgerow nats-auth --serve")
			}
		})
	}
}

func TestTheUserGeneratorReadsAServeListenerStillWithoutUsers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.yaml")
	if err := os.WriteFile(path, []byte(minimal+"nats:\n  listen: 127.0.0.1:4333\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, RoleServe, noEnv); !errors.Is(err, ErrOpenListener) {
		t.Fatalf("Load as serve: %v, want ErrOpenListener", err)
	}
	c, err := LoadForNATSUsers(path)
	if err != nil {
		t.Fatalf("LoadForNATSUsers: %v", err)
	}
	if len(c.Routes) != 2 {
		t.Fatalf("routes %d, want 2", len(c.Routes))
	}
}
