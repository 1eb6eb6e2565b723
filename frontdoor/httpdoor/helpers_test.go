package httpdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prompt is distinctive so a test can prove no answer echoes it.
const prompt = "tell-me-the-secret-plan"

// anyValue in an expected header means "present, whatever its value".
const anyValue = "*"

func chatBody(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"general","messages":[{"role":"user","content":%q}],"max_tokens":50,"stream":%t`, prompt, stream)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// frontDoor serves sub over HTTP with opts; the pool "general" of routes a
// and b when opts names no pools.
func frontDoor(t *testing.T, sub frontdoor.Submitter, opts Options) *httptest.Server {
	t.Helper()
	if opts.Pools == nil {
		opts.Pools = map[string][]string{"general": {"a", "b"}}
	}
	h, err := New(sub, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// scripted serves a door in front of a scripted submitter.
func scripted(t *testing.T, script frontdoortest.Script, opts Options) (*httptest.Server, *frontdoortest.Submitter) {
	t.Helper()
	sub := frontdoortest.New(script)
	return frontDoor(t, sub, opts), sub
}

func post(t *testing.T, ctx context.Context, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// openAIErrorOf checks body is an OpenAI error object — message, type,
// param and code all present — and returns it.
func openAIErrorOf(t *testing.T, body []byte) (typ, code, param string) {
	t.Helper()
	var obj map[string]map[string]any
	if err := json.Unmarshal(body, &obj); err != nil || obj["error"] == nil {
		t.Fatalf("body %s is not an OpenAI error object", body)
	}
	e := obj["error"]
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error object %s has no %q", body, k)
		}
	}
	if m, _ := e["message"].(string); m == "" {
		t.Fatalf("error object %s has no message", body)
	}
	typ, _ = e["type"].(string)
	code, _ = e["code"].(string)
	param, _ = e["param"].(string)
	return typ, code, param
}

// sseEvents reads a whole event stream: the data of each event.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("stream line %q is not a data line", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return events
}

type testChunk struct {
	ID      string           `json:"id"`
	Object  string           `json:"object"`
	Model   string           `json:"model"`
	Choices []map[string]any `json:"choices"`
	Usage   *openAIUsage     `json:"usage"`
}

// chunks0ID is the id every chunk of a stream shares: the first chunk's.
func chunks0ID(chunks []testChunk, id string) string {
	if len(chunks) == 0 {
		return id
	}
	return chunks[0].ID
}
