package main

import (
	"errors"
	"fmt"
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
// their keys set as an operator would; gateways never read the keys. The
// roles that let callers in warn, at its line, that the example tenant's
// all-zero key hash is a placeholder, and still pass.
func TestConfigCheckPrintsOKForTheRealProviderExamples(t *testing.T) {
	keys := map[string][]string{
		"openai.yaml":    {"OPENAI_API_KEY_A", "OPENAI_API_KEY_B"},
		"anthropic.yaml": {"ANTHROPIC_API_KEY_A", "ANTHROPIC_API_KEY_B"},
	}
	for file, vars := range keys {
		example := filepath.Join("..", "..", "deploy", "examples", file)
		data, err := os.ReadFile(example)
		if err != nil {
			t.Fatal(err)
		}
		hashLine := 0
		for i, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, "sha256:"+strings.Repeat("0", 64)) {
				hashLine = i + 1
			}
		}
		if hashLine == 0 {
			t.Fatalf("%s has no all-zero key hash", file)
		}
		warning := fmt.Sprintf("%s:%d: tenants.team.api_key_hashes[0]: warning: the all-zero hash is a placeholder", example, hashLine)
		for _, role := range []string{"serve", "gateway", "worker"} {
			t.Run(file+"/"+role, func(t *testing.T) {
				for _, v := range vars {
					t.Setenv(v, "test-key")
				}
				out, err := runConfigCheck(t, example, "--role", role)
				if err != nil {
					t.Fatalf("config check = %v:\n%s", err, out)
				}
				lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
				if role == "worker" {
					if out != "ok\n" {
						t.Fatalf("config check --role worker printed:\n%s\nwant only ok: a worker lets no caller in", out)
					}
					return
				}
				if len(lines) != 2 || !strings.HasPrefix(lines[0], warning) || lines[1] != "ok" {
					t.Fatalf("config check printed:\n%s\nwant the placeholder's warning (%s…) and ok", out, warning)
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

// A key mis-indented in a real example is reported at its own line, with
// the hint to look at its indentation; an unknown key near a known one is
// reported with that key.
func TestConfigCheckNamesTheLineOfAMisIndentedKeyAndGuessesATypo(t *testing.T) {
	example := filepath.Join("..", "..", "deploy", "examples", "openai.yaml")
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, line, broken string // line: an example's line; broken: what it becomes
		want               string
	}{
		{"a route's key one space short", "    base_url: https://api.openai.com/v1\n", "   base_url: https://api.openai.com/v1\n",
			"invalid YAML: did not find expected '-' indicator (check this line's indentation"},
		{"a tenant's key one space short", "    requests_per_second: 20", "   requests_per_second: 20",
			"invalid YAML: did not find expected key (check this line's indentation"},
		{"a top-level key one space in", "\nhttp:\n", "\n http:\n", "invalid YAML: did not find expected key"},
		{"a policy key misspelt", "    deadline: 30s", "    dedline: 30s", `policies.default.dedline: unknown key "dedline": did you mean "deadline"?`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := string(data)
			at := strings.Index(src, tc.line)
			if at < 0 {
				t.Fatalf("%s has no line %q", example, tc.line)
			}
			// The line the broken text starts on, past a leading newline.
			line := strings.Count(src[:at+strings.IndexFunc(tc.line, func(r rune) bool { return r != '\n' })], "\n") + 1
			path := filepath.Join(t.TempDir(), "openai.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(src, tc.line, tc.broken, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("OPENAI_API_KEY_A", "test-key")
			t.Setenv("OPENAI_API_KEY_B", "test-key")
			out, err := runConfigCheck(t, path, "--role", "serve")
			if err == nil || !strings.Contains(err.Error(), "has 1 problem") {
				t.Fatalf("config check = %v, want 1 problem:\n%s", err, out)
			}
			if want := fmt.Sprintf("%s:%d: ", path, line); !strings.Contains(out, want+tc.want) {
				t.Fatalf("config check printed:\n%s\nwant a line %s%s", out, want, tc.want)
			}
		})
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
