package node

// Nothing secret leaves (docs/architecture.md §9): unique markers planted in
// prompts, tenant and provider keys, request headers, idempotency keys, user
// ids and provider errors never appear in logs, metrics, records or the
// replies on the wire, whichever door the request came through.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// The markers: letters only, so no credential-shaped pattern could redact
// them by luck — only never copying them keeps them out.
const (
	promptMarker      = "zqpromptmarker"
	tenantKeyMarker   = "zqtenantkeymarker"
	providerKeyMarker = "zqproviderkeymarker"
	headerMarker      = "zqheadermarker"
	idempotencyMarker = "zqidempotencymarker"
	userMarker        = "zquseridmarker"
)

var allMarkers = []string{promptMarker, tenantKeyMarker, providerKeyMarker, headerMarker, idempotencyMarker, userMarker}

// lockedBuffer collects what several goroutines write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// echoingProvider is the worst provider: every error it gives echoes the
// request body (the prompt), the credential headers it got, and puts the key
// in the error's code, type and param too. The request's mode word chooses
// the failure: an HTTP 400 (group-scoped), a 500 (transient, so a hedge or
// replacement follows), or an error event inside a 200 stream.
func echoingProvider(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if k := r.Header.Get("X-Api-Key"); k != "" {
			key = k
		}
		errObj := map[string]any{
			"message": fmt.Sprintf("you sent %s with key %s (Authorization: %s)", body, key, r.Header.Get("Authorization")),
			"type":    key,
			"code":    key,
			"param":   "messages." + key,
		}
		anthropic := strings.HasSuffix(r.URL.Path, "/messages")
		switch {
		case bytes.Contains(body, []byte("mode-stream")):
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			data, _ := json.Marshal(map[string]any{"type": "error", "error": errObj})
			if anthropic {
				fmt.Fprintf(w, "event: error\ndata: %s\n\n", data)
			} else {
				fmt.Fprintf(w, "data: %s\n\n", data)
			}
		case bytes.Contains(body, []byte("mode-500")):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			json.NewEncoder(w).Encode(map[string]any{"error": errObj})
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]any{"error": errObj})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// wireTap records every message on the server except the two kinds that
// must carry the caller's input: submissions (prompt and key) and attempts
// (the prompt, for the worker).
type wireTap struct {
	mu       sync.Mutex
	text     strings.Builder
	subjects map[string]int
}

func (w *wireTap) add(m *nats.Msg) {
	if m.Subject == schemas.SubmitSubject || strings.HasPrefix(m.Subject, schemas.AttemptSubjectPrefix) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(&w.text, "%s %v %s %s\n", m.Subject, m.Header, m.Reply, m.Data)
	kind := "reply"
	if strings.HasPrefix(m.Subject, "hedgerow.events.") {
		kind = m.Subject
	}
	w.subjects[kind]++
}

func (w *wireTap) snapshot() (string, map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	counts := make(map[string]int, len(w.subjects))
	for k, v := range w.subjects {
		counts[k] = v
	}
	return w.text.String(), counts
}

func TestNoMarkerLeavesThroughLogsMetricsRecordsOrReplies(t *testing.T) {
	provider := echoingProvider(t)
	y := fmt.Sprintf(`http:
  listen: 127.0.0.1:0
routes:
  - {name: echo-openai, provider: openai, base_url: %q, model: m, api_key_env: MARKER_PROVIDER_KEY, labels: {region: a}}
  - {name: echo-anthropic, provider: anthropic, base_url: %q, model: m, api_key_env: MARKER_PROVIDER_KEY, labels: {region: b}}
pools:
  general: {routes: [echo-openai, echo-anthropic]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
tenants:
  acme: {api_key_hashes: [%s]}
`, provider+"/v1", provider, config.HashAPIKey(tenantKeyMarker))
	env := func(name string) (string, bool) {
		if name == "MARKER_PROVIDER_KEY" {
			return providerKeyMarker, true
		}
		return "", false
	}
	cfg, err := config.Parse("secrets.yaml", []byte(y), config.RoleServe, env)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	var logs lockedBuffer
	s, err := StartServe(cfg, Options{Env: env, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	defer stop(t, s)

	// The tap reads every subject, which no generated NATS user may: it
	// joins serve's in-process server, which opens no listener.
	tapConn, err := s.nats.Connect("wire-tap")
	if err != nil {
		t.Fatal(err)
	}
	defer tapConn.Close()
	tap := &wireTap{subjects: map[string]int{}}
	sub, err := tapConn.Subscribe(">", tap.add)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := tapConn.Flush(); err != nil {
		t.Fatal(err)
	}

	base := "http://" + s.HTTPAddr().String()
	var callerSaw strings.Builder // what the callers got back
	modes := []string{"mode-400", "mode-500", "mode-stream"}
	doors := []struct {
		path string
		body func(mode string, stream bool) string
		key  func(h http.Header)
	}{
		{"/v1/chat/completions", func(mode string, stream bool) string {
			return fmt.Sprintf(`{"model":"general","max_tokens":20,"stream":%t,"user":%q,"messages":[{"role":"system","content":"%s %s"},{"role":"user","content":"%s"}]}`,
				stream, userMarker, mode, promptMarker, promptMarker)
		}, func(h http.Header) { h.Set("Authorization", "Bearer "+tenantKeyMarker) }},
		{"/v1/messages", func(mode string, stream bool) string {
			return fmt.Sprintf(`{"model":"general","max_tokens":20,"stream":%t,"metadata":{"user_id":%q},"system":"%s %s","messages":[{"role":"user","content":"%s"}]}`,
				stream, userMarker, mode, promptMarker, promptMarker)
		}, func(h http.Header) { h.Set("X-Api-Key", tenantKeyMarker) }},
		{"/v1/responses", func(mode string, stream bool) string {
			return fmt.Sprintf(`{"model":"general","max_output_tokens":20,"stream":%t,"user":%q,"instructions":"%s %s","input":"%s"}`,
				stream, userMarker, mode, promptMarker, promptMarker)
		}, func(h http.Header) { h.Set("Authorization", "Bearer "+tenantKeyMarker) }},
	}
	groups := 0
	for _, door := range doors {
		for i, mode := range modes {
			for _, stream := range []bool{false, true} {
				req, err := http.NewRequest(http.MethodPost, base+door.path, strings.NewReader(door.body(mode, stream)))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				door.key(req.Header)
				req.Header.Set("User-Agent", headerMarker)
				req.Header.Set("X-Custom-Header", headerMarker)
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%s-%d-%t", idempotencyMarker, door.path, i, stream))
				status, got := do(t, req)
				if status == http.StatusOK && !stream {
					t.Errorf("%s %s: %d %s; want the provider's failure", door.path, mode, status, got)
				}
				fmt.Fprintf(&callerSaw, "%s %d %s\n", door.path, status, got)
				groups++
			}
		}
	}

	callerConn, err := s.nats.Connect("caller")
	if err != nil {
		t.Fatal(err)
	}
	defer callerConn.Close()
	c, err := client.New(callerConn, client.WithTimeout(wait), client.WithAPIKey(tenantKeyMarker))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		_, err := c.Submit(context.Background(), client.Request{ModelClass: "general", Request: schemas.ChatRequest{
			MaxTokens: 20,
			Messages: []schemas.Message{
				{Role: schemas.MessageSystem, Content: schemas.TextContent(mode + " " + promptMarker)},
				{Role: schemas.MessageUser, Content: schemas.TextContent(promptMarker)},
			},
		}})
		if err == nil {
			t.Errorf("NATS %s: no error; want the provider's failure", mode)
		}
		fmt.Fprintf(&callerSaw, "%v\n", err)
	}

	// Malformed requests carry the markers where the doors' parsers read
	// them (a role, a member name, broken JSON, a bad parameter value). The
	// caller may be told what it got wrong; logs, metrics and the wire may
	// not repeat it. These answers are not checked for markers.
	for _, body := range []string{
		`{"model":"general","messages":[{"role":"` + promptMarker + `","content":"` + promptMarker + `"}]}`,
		`{"model":"general","` + promptMarker + `":1,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"general","messages":[{"role":"user","content":"` + promptMarker,
		`{"model":"general","temperature":"` + promptMarker + `","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"` + promptMarker + `","messages":[{"role":"user","content":"x"}]}`,
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
			req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tenantKeyMarker)
			if status, got := do(t, req); status < 400 || status >= 500 {
				t.Errorf("malformed %s %s: %d %s; want a 4xx", path, body, status, got)
			}
		}
		msg := nats.NewMsg(schemas.SubmitSubject)
		msg.Header.Set("Authorization", "Bearer "+tenantKeyMarker)
		msg.Data = []byte(`{"model_class":"general","request":` + body + `}`)
		if _, err := callerConn.RequestMsg(msg, wait); err != nil {
			t.Errorf("malformed NATS submission: %v; want an error answer", err)
		}
	}
	// A request without a valid key, whose key is the marker.
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tenantKeyMarker+"x")
	if status, _ := do(t, req); status != http.StatusUnauthorized {
		t.Errorf("a wrong key: %d, want 401", status)
	}

	// Every group's record arrives after its caller's answer: wait for all
	// of them, then for the workers' results to be on the wire.
	groups += len(modes)
	eventually.True(t, wait, "every group record published", func() bool {
		_, counts := tap.snapshot()
		return counts[schemas.GroupRecordSubject] >= groups
	})
	if err := tapConn.Flush(); err != nil {
		t.Fatal(err)
	}
	_, metrics := get(t, base+"/metrics")
	wire, counts := tap.snapshot()
	logText := logs.String()

	// The sinks hold what they should, so an empty sink cannot pass.
	if !strings.Contains(wire, `"error_message"`) || counts["reply"] == 0 {
		t.Fatalf("the tap saw no worker result with an error message: %v", counts)
	}
	if !strings.Contains(logText, "attempt ended") {
		t.Fatalf("no worker debug line was logged:\n%.2000s", logText)
	}
	if !strings.Contains(string(metrics), "hedgerow_worker_attempts_total") {
		t.Fatalf("metrics lack the worker counters")
	}
	t.Logf("captured: %d log bytes, %d metrics bytes, wire %v", len(logText), len(metrics), counts)

	for _, sink := range []struct{ name, text string }{
		{"logs", logText},
		{"metrics", string(metrics)},
		{"records and replies on the wire", wire},
		{"answers to the callers", callerSaw.String()},
	} {
		for _, m := range allMarkers {
			if n := strings.Count(sink.text, m); n > 0 {
				i := strings.Index(sink.text, m)
				t.Errorf("%s: marker %s appears %d times, e.g. …%s…", sink.name, m, n,
					sink.text[max(i-200, 0):min(i+len(m)+60, len(sink.text))])
			}
		}
	}
}

// A failed connection names its servers with their passwords masked,
// whether the URL does not parse (nats.Connect quotes it) or no server
// answers.
func TestConnectErrorsMaskPasswordsInURLs(t *testing.T) {
	const secret = "s3cretpw"
	for _, urls := range [][]string{
		{"nats://alice:" + secret + "@127.0.0.1:bad"},
		{"nats://alice:" + secret + "@127.0.0.1:1", "nats://" + secret + "@127.0.0.1:2"},
	} {
		nc, err := Connect(urls, "masked", nil)
		if err == nil {
			nc.Close()
			t.Fatalf("Connect(%q) succeeded", urls)
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "alice:xxxxx@127.0.0.1") {
			t.Errorf("Connect(%q): %v; want the password masked", urls, err)
		}
	}
}
