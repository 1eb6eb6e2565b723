package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/config"
)

func runConfigCheck(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runRoot(t, append([]string{"config", "check"}, args...)...)
}

func TestConfigCheckPrintsOKForTheExample(t *testing.T) {
	example := filepath.Join("..", "..", "deploy", "examples", "local.yaml")
	for _, role := range []string{"serve", "gateway", "worker"} {
		t.Run(role, func(t *testing.T) {
			out, err := runConfigCheck(t, example, "--role", role)
			if err != nil {
				t.Fatalf("config check: %v\n%s", err, out)
			}
			if out != "ok\n" {
				t.Fatalf("output = %q, want \"ok\\n\"", out)
			}
		})
	}
}

// TestConfigCheckPrintsOKForTheRealProviderExamples checks the examples of
// deploy/examples in front of OpenAI and Anthropic for every role, with
// their keys set as an operator would; gateways never read the keys.
func TestConfigCheckPrintsOKForTheRealProviderExamples(t *testing.T) {
	keys := map[string][]string{
		"openai.yaml":    {"OPENAI_API_KEY_A", "OPENAI_API_KEY_B"},
		"anthropic.yaml": {"ANTHROPIC_API_KEY_A", "ANTHROPIC_API_KEY_B"},
	}
	for file, vars := range keys {
		example := filepath.Join("..", "..", "deploy", "examples", file)
		for _, role := range []string{"serve", "gateway", "worker"} {
			t.Run(file+"/"+role, func(t *testing.T) {
				for _, v := range vars {
					t.Setenv(v, "test-key")
				}
				out, err := runConfigCheck(t, example, "--role", role)
				if err != nil || out != "ok\n" {
					t.Fatalf("config check = %v:\n%s", err, out)
				}
			})
		}
		t.Run(file+"/worker without keys", func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, "")
				os.Unsetenv(v)
			}
			if out, err := runConfigCheck(t, example, "--role", "worker"); err == nil || !strings.Contains(out, vars[0]) {
				t.Fatalf("config check without %s = %v:\n%s", vars[0], err, out)
			}
		})
	}
}

func TestConfigCheckPrintsEveryProblemAndExitsNonZero(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	src := `routes:
  - name: Bad.Name
    provider: openai
    base_url: http://127.0.0.1:9101
    model: m
pools:
  general:
    routes: [missing]
policies:
  default:
    max_attempts: 7
    unknown_key: 1
`
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runConfigCheck(t, path)
	if err == nil {
		t.Fatalf("config check succeeded on a bad file:\n%s", out)
	}
	ec, ok := err.(exitCoder)
	if !ok || ec.ExitCode() == 0 {
		t.Fatalf("error %v carries no non-zero exit code", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, want := range []string{
		path + ":2: routes[0].name:",
		path + ":8: pools.general.routes[0]:",
		path + ":11: policies.default.max_attempts:",
		path + ":12: policies.default.unknown_key:",
	} {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, want)
		}
		if !found {
			t.Errorf("no output line starting %q in:\n%s", want, out)
		}
	}
	if len(lines) != 4 {
		t.Errorf("want 4 problem lines, got %d:\n%s", len(lines), out)
	}
}

func TestConfigCheckRefusesAnUnknownRole(t *testing.T) {
	example := filepath.Join("..", "..", "deploy", "examples", "local.yaml")
	if _, err := runConfigCheck(t, example, "--role", "router"); err == nil {
		t.Fatal("config check accepted role router")
	}
}

// config check --role serve refuses exactly the NATS listeners serve
// refuses, with the same error (config.ErrOpenListener): a listener needs
// the generated users.
func TestConfigCheckAndServeAgreeOnWhichNATSListenersNeedUsers(t *testing.T) {
	noLeaks(t)
	tests := []struct {
		name    string
		nats    string
		users   bool // generate the users (nats-auth --serve) next to the file
		refused bool
	}{
		{name: "in process, no listener", nats: ""},
		{name: "a listener without users", nats: "nats: {listen: 127.0.0.1:0}\n", refused: true},
		{name: "a listener without users but with the serve seed", nats: "nats: {listen: 127.0.0.1:0, nkey_seed_file: auth/serve.nk}\n",
			users: true, refused: true},
		{name: "a listener with the generated users",
			nats:  "nats: {listen: 127.0.0.1:0, server_config: auth/nats-server.conf, nkey_seed_file: auth/serve.nk}\n",
			users: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.nats, fakeUpstream(t, 0))
			if tt.users {
				if out, err := runRoot(t, "nats-auth", "--serve", "--config", path, "--out", filepath.Join(filepath.Dir(path), "auth")); err != nil {
					t.Fatalf("nats-auth: %v\n%s", err, out)
				}
			}
			checked, checkErr := runConfigCheck(t, path, "--role", "serve")
			if !tt.refused {
				if checkErr != nil || checked != "ok\n" {
					t.Fatalf("config check: %v\n%s", checkErr, checked)
				}
				r := startCmd(t, "serve", "--config", path)
				r.waitFor(servingURL)
				if err := r.stop(); err != nil {
					t.Fatalf("serve: %v", err)
				}
				return
			}
			if !errors.Is(checkErr, config.ErrOpenListener) {
				t.Fatalf("config check: %v\n%s; want config.ErrOpenListener", checkErr, checked)
			}
			if !strings.Contains(checked, "nats.listen: ") || !strings.Contains(checked, "hedgerow nats-auth --serve") {
				t.Errorf("config check printed %q: want the problem at nats.listen naming the generator", checked)
			}
			served, serveErr := runRoot(t, "serve", "--config", path)
			if !errors.Is(serveErr, config.ErrOpenListener) {
				t.Fatalf("serve: %v\n%s; want config.ErrOpenListener", serveErr, served)
			}
			if !strings.Contains(served, strings.TrimSpace(checked)) {
				t.Errorf("serve printed %q, config check %q: want the same problem", served, checked)
			}
		})
	}
}
