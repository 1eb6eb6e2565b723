package node

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/config"
)

// readmeCurl is one curl command of the README: where it goes, its
// headers and its body, as curl would send them.
type readmeCurl struct {
	url, body string
	headers   [][2]string
}

// readmeCurls returns the README's curl commands against a local serve
// (http://127.0.0.1:8080), their continuation lines joined.
func readmeCurls(t *testing.T) []readmeCurl {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	var cur strings.Builder
	for _, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		if cur.Len() == 0 && !strings.HasPrefix(line, "curl -s http://127.0.0.1:8080/") {
			continue
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(line)
		cmds = append(cmds, cur.String())
		cur.Reset()
	}
	var curls []readmeCurl
	for _, cmd := range cmds {
		words := shellWords(t, cmd)
		var c readmeCurl
		for i := 1; i < len(words); i++ {
			switch w := words[i]; {
			case w == "-s":
			case w == "-H" && i+1 < len(words):
				name, value, ok := strings.Cut(words[i+1], ":")
				if !ok {
					t.Fatalf("README curl %q: header %q", cmd, words[i+1])
				}
				c.headers = append(c.headers, [2]string{name, strings.TrimSpace(value)})
				i++
			case w == "-d" && i+1 < len(words):
				c.body = words[i+1]
				i++
			case strings.HasPrefix(w, "http://"):
				c.url = w
			default:
				t.Fatalf("README curl %q: argument %q this test does not know", cmd, w)
			}
		}
		curls = append(curls, c)
	}
	return curls
}

// shellWords splits a command line into words as sh would, for the
// quoting the README's commands use: single quotes and plain words.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// Every curl of the README's "Run it locally", sent as written to serve
// running deploy/examples/local.yaml — its routes pointed at simulated
// OpenAI-compatible providers, as `hedgerow fakellm` plays them on
// 9101-9103 — is answered 200 in its API's shape: chat completions,
// embeddings, Responses and Messages (whose claude-sonnet-4-0 the example
// maps to the pool general).
func TestREADMECurlsAreAnsweredByServeWithTheLocalExample(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "deploy", "examples", "local.yaml"), config.RoleServe,
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("deploy/examples/local.yaml: %v", err)
	}
	for i := range cfg.Routes {
		cfg.Routes[i].BaseURL = fakeRoute(t, i)
	}
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.NATS.StoreDir = t.TempDir()
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	base := "http://" + s.HTTPAddr().String()

	// What each API's answer has, however the simulator words it.
	shapes := map[string]func(map[string]any) bool{
		"/v1/chat/completions": func(a map[string]any) bool { return a["object"] == "chat.completion" },
		"/v1/embeddings":       func(a map[string]any) bool { return a["object"] == "list" },
		"/v1/responses":        func(a map[string]any) bool { return a["object"] == "response" && a["status"] == "completed" },
		"/v1/messages": func(a map[string]any) bool {
			return a["type"] == "message" && a["role"] == "assistant" && a["model"] == "claude-sonnet-4-0"
		},
	}
	seen := map[string]bool{}
	for _, c := range readmeCurls(t) {
		path := strings.TrimPrefix(c.url, "http://127.0.0.1:8080")
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range c.headers {
			req.Header.Set(h[0], h[1])
		}
		status, body := do(t, req)
		var answer map[string]any
		if err := json.Unmarshal(body, &answer); status != 200 || err != nil {
			t.Errorf("README's curl to %s: %d %v\n%s", path, status, err, body)
			continue
		}
		shape, ok := shapes[path]
		if !ok {
			t.Errorf("README's curl to %s: this test knows no shape of its answer", path)
			continue
		}
		if !shape(answer) {
			t.Errorf("README's curl to %s: answer not in its API's shape:\n%s", path, body)
		}
		seen[path] = true
	}
	for path := range shapes {
		if !seen[path] {
			t.Errorf("the README has no curl to %s that a local serve answers", path)
		}
	}
}
