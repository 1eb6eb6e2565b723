package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// writeConfig writes a configuration with one route per base URL, a pool
// "general" over them and extra YAML, and returns its path.
func writeConfig(t *testing.T, extra string, baseURLs ...string) string {
	t.Helper()
	var y strings.Builder
	y.WriteString("http: {listen: 127.0.0.1:0}\nroutes:\n")
	var names []string
	for i, u := range baseURLs {
		name := fmt.Sprintf("fake-%d", i)
		names = append(names, name)
		fmt.Fprintf(&y, "  - {name: %s, provider: openai, base_url: %q, model: m}\n", name, u)
	}
	fmt.Fprintf(&y, "pools:\n  general: {routes: [%s]}\n%s", strings.Join(names, ", "), extra)
	path := filepath.Join(t.TempDir(), "hedgerow.yaml")
	if err := os.WriteFile(path, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeUpstream serves simulator route n fast (a model second is 10 ms) and
// returns its base URL.
func fakeUpstream(t *testing.T, n int) string {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT.HangFraction = 0
	fake, err := fakellm.New(fakellm.Options{Model: m, Seed: 1, TimeScale: 0.01, Route: n})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fake)
	t.Cleanup(func() {
		fake.Close()
		srv.Close()
	})
	return srv.URL + "/v1"
}

func TestServeAnswersChatCompletionsUntilStopped(t *testing.T) {
	noLeaks(t)
	path := writeConfig(t, "", fakeUpstream(t, 0), fakeUpstream(t, 1))
	r := startCmd(t, "serve", "--config", path)
	base := r.waitFor(servingURL)
	client := &http.Client{Timeout: cmdWait, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %s", resp.Status)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

func TestProcessesPrintEveryConfigProblemAndExitNonZero(t *testing.T) {
	path := writeConfig(t, "policies:\n  default: {max_attempts: 9}\n", "http://127.0.0.1:1/v1")
	for _, args := range [][]string{
		{"serve", "--config", path},
		{"gateway", "--config", path},
		{"worker", "--config", path},
	} {
		t.Run(args[0], func(t *testing.T) {
			out, err := runRoot(t, args...)
			ec, ok := err.(exitCoder)
			if !ok || ec.ExitCode() != 1 {
				t.Fatalf("%s: error %v, want an invalid config error", args[0], err)
			}
			if !strings.Contains(out, path+":") || !strings.Contains(out, "policies.default.max_attempts") {
				t.Errorf("%s printed no file:line: path problem:\n%s", args[0], out)
			}
		})
	}
}
