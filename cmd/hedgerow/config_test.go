package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
