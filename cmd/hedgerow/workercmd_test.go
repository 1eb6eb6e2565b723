package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestWorkerServesTheRoutesAskedForUntilStopped(t *testing.T) {
	noLeaks(t)
	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	path := writeConfig(t, "nats: {urls: [\""+ns.ClientURL()+"\"]}\n", "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1")
	r := startCmd(t, "worker", "--config", path, "--route", "fake-1", "--metrics-listen", "127.0.0.1:0")
	if routes := r.waitFor(regexp.MustCompile(`routes=(\S+)`)); routes != "[fake-1]" {
		t.Errorf("worker serves %s, want [fake-1]", routes)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

func TestWorkerRefusesAnUnknownRoute(t *testing.T) {
	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	path := writeConfig(t, "nats: {urls: [\""+ns.ClientURL()+"\"]}\n", "http://127.0.0.1:1/v1")
	if out, err := runRoot(t, "worker", "--config", path, "--route", "nope"); err == nil {
		t.Fatalf("worker with an unknown route started:\n%s", out)
	}
}

// TestConfigCheckLetsAWorkerUseRedisWithoutTheHashKey: redis.url without
// redis.hash_key_env is fine for the worker role (its Redis holds route
// leases), while serve and gateway still need the key.
func TestConfigCheckLetsAWorkerUseRedisWithoutTheHashKey(t *testing.T) {
	path := writeConfig(t, "nats: {urls: [\"nats://127.0.0.1:4222\"]}\nredis: {url: \"redis://127.0.0.1:6379\"}\n",
		"http://127.0.0.1:1/v1")
	cases := []struct {
		role string
		ok   bool
	}{
		{"worker", true},
		{"gateway", false},
		{"serve", false},
	}
	for _, tc := range cases {
		t.Run(tc.role, func(t *testing.T) {
			out, err := runConfigCheck(t, path, "--role", tc.role)
			if tc.ok {
				if err != nil || out != "ok\n" {
					t.Fatalf("config check --role %s: %v\n%s", tc.role, err, out)
				}
				return
			}
			if err == nil || !strings.Contains(out, "redis.hash_key_env") {
				t.Fatalf("config check --role %s: %v\n%s; want a redis.hash_key_env problem", tc.role, err, out)
			}
		})
	}
}

// holdSecondWrite serves next, holding the first response it serves
// before its second write (a stream's first token is out, the rest not)
// until release is closed; held is closed once it holds.
type holdSecondWrite struct {
	next    http.Handler
	first   sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdSecondWrite) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hold := false
	h.first.Do(func() { hold = true })
	if !hold {
		h.next.ServeHTTP(w, r)
		return
	}
	h.next.ServeHTTP(&holdingWriter{ResponseWriter: w, h: h}, r)
}

// holdingWriter is the held response's writer.
type holdingWriter struct {
	http.ResponseWriter
	h      *holdSecondWrite
	writes int
}

func (w *holdingWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes == 2 {
		close(w.h.held)
		<-w.h.release
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController flush the real writer.
func (w *holdingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// A worker process that gets SIGHUP logs it and carries on
// (docs/architecture.md §10): the stream it is running when the signal
// arrives completes, and it serves the next request.
func TestAWorkerProcessKeepsItsStreamsAcrossSIGHUP(t *testing.T) {
	noLeaks(t)
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction = 0
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(0.2, 0), Stall: workload.LogNormalMedian(0.2, 0)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(40)}
	fake, err := fakellm.New(fakellm.Options{Model: m, Seed: 1, TimeScale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	hold := &holdSecondWrite{next: fake, held: make(chan struct{}), release: make(chan struct{})}
	released := sync.OnceFunc(func() { close(hold.release) })
	upstream := httptest.NewServer(hold)
	defer func() {
		released()
		fake.Close()
		upstream.Close()
	}()

	ns := natstest.Start(t, natstest.MaxPayload(8<<20))
	// One attempt per request, which a held stream never stalls out of.
	path := writeConfig(t, "nats: {urls: [\""+ns.ClientURL()+"\"]}\n"+
		"policies:\n  default: {hedge: false, max_attempts: 1, deadline: 20s, stall_after_first_token: 20s, accept_timeout: 5s}\n",
		upstream.URL+"/v1")
	worker, process := startProcess(t, "worker", "--config", path)
	worker.waitFor(regexp.MustCompile(`msg="(workers serving)"`))

	cfg, err := config.Load(path, config.RoleGateway, os.LookupEnv)
	if err != nil {
		t.Fatal(err)
	}
	g, err := node.StartGateway(cfg, natstest.Connect(t, ns), nil, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), cmdWait)
		defer cancel()
		if err := g.Stop(ctx); err != nil {
			t.Errorf("stop gateway: %v", err)
		}
	}()
	type answer struct {
		status int
		body   string
		err    error
	}
	chat := func(stream bool) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			client := &http.Client{Timeout: cmdWait, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Post("http://"+g.Addr().String()+"/v1/chat/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"model":"general","stream":%v,"messages":[{"role":"user","content":"hello"}]}`, stream)))
			if err != nil {
				out <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			out <- answer{resp.StatusCode, string(body), err}
		}()
		return out
	}
	within := func(ch <-chan answer) answer {
		t.Helper()
		select {
		case a := <-ch:
			return a
		case <-time.After(cmdWait):
			t.Fatal("no answer")
			return answer{}
		}
	}

	streamed := chat(true)
	select {
	case <-hold.held: // the stream's first token is out, the rest held at the provider
	case a := <-streamed:
		t.Fatalf("the stream ended before it was held: %d %v %.300s", a.status, a.err, a.body)
	case <-time.After(cmdWait):
		t.Fatal("the stream never reached the provider")
	}
	if err := process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	worker.waitFor(regexp.MustCompile(`(SIGHUP ignored)`))
	released()
	a := within(streamed)
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"finish_reason":"stop"`) ||
		!strings.HasSuffix(strings.TrimSpace(a.body), "data: [DONE]") {
		t.Fatalf("the stream in flight at SIGHUP: %d %v\n%s", a.status, a.err, a.body)
	}
	if a := within(chat(false)); a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"finish_reason":"stop"`) {
		t.Fatalf("a request after SIGHUP: %d %v\n%s", a.status, a.err, a.body)
	}
	if err := worker.stop(); err != nil {
		t.Fatalf("the worker exited with %v after SIGTERM, want 0", err)
	}
}
