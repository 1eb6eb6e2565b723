package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// newEmbeddingsProvider is an OpenAI-compatible provider of
// POST /v1/embeddings whose n-th request (from 1, across every provider
// sharing calls) stalls when stall(n): it sends its 200 headers at once —
// the worker's first byte — and never its body. Other requests answer one
// vector per input whose first element names the route.
func newEmbeddingsProvider(t *testing.T, route string, calls *atomic.Int32, stall func(n int32) bool) *provider {
	p := &provider{route: route, arrived: make(chan string, 64), bodies: make(chan []byte, 64), gone: make(chan string, 64)}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/embeddings" {
			http.NotFound(w, r)
			return
		}
		notify(p.arrived, route)
		w.Header().Set("Content-Type", "application/json")
		if stall(calls.Add(1)) {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			notify(p.gone, route)
			return
		}
		var req struct {
			Input []string `json:"input"`
		}
		_ = json.Unmarshal(body, &req)
		var data []string
		for i := range req.Input {
			data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":[%d.5,0.25]}`, i, route[0]))
		}
		fmt.Fprintf(w, `{"object":"list","data":[%s],"model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}`, strings.Join(data, ","))
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func embedRequest() schemas.ChatRequest {
	return schemas.ChatRequest{Embedding: &schemas.EmbeddingRequest{Input: []string{"one", "two"}}}
}

// TestStalledEmbeddingIsHedgedOnTotalTimeAndTheHedgesVectorsWin: the
// primary's provider answers its headers at once and then stalls. On the
// first_byte trigger of the chat policy that is no stall; an embeddings
// request hedges on total time, in its own cohort, and the hedge's vectors
// are the answer.
func TestStalledEmbeddingIsHedgedOnTotalTimeAndTheHedgesVectorsWin(t *testing.T) {
	var calls atomic.Int32
	stallFirst := func(n int32) bool { return n == 1 }
	ps := map[string]*provider{"a": newEmbeddingsProvider(t, "a", &calls, stallFirst), "b": newEmbeddingsProvider(t, "b", &calls, stallFirst)}
	// The hedge waits 300ms, ample time for the primary to reach its
	// provider first even on a loaded machine.
	c := newCluster(t, []string{"a", "b"}, ps, strings.Replace(policyYAML, "initial: 100ms", "initial: 300ms", 1))
	resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: embedRequest()}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if !resp.Hedged || resp.Winner != 2 || resp.Attempts != 2 {
		t.Fatalf("response %+v, want the hedge (attempt 2) to win", resp)
	}
	hedge := resp.WinnerRoute[0]
	want := fmt.Sprintf(`[{"object":"embedding","index":0,"embedding":[%d.5,0.25]},{"object":"embedding","index":1,"embedding":[%d.5,0.25]}]`, hedge, hedge)
	if string(resp.Embeddings) != want {
		t.Fatalf("embeddings %s, want the hedge's %s", resp.Embeddings, want)
	}
	if resp.Usage.InputUnits != 3 || resp.Usage.OutputUnits != 0 {
		t.Fatalf("usage %+v, want the provider's 3 prompt tokens", resp.Usage)
	}
	primary := map[string]string{"a": "b", "b": "a"}[resp.WinnerRoute]
	waitGone(t, ps[primary])
	g := c.groupRecord(resp.GroupID)
	if g.Outcome != schemas.GroupCommitted || !g.HedgeLaunched {
		t.Fatalf("group record %+v, want a hedged commit", g)
	}
	// An unhedged answer's total time is a sample of the embeddings cohort
	// only: no chat cohort learns from it.
	if _, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: embedRequest()}, nil); err != nil {
		t.Fatalf("second Submit: %v", err)
	}
	var keys []string
	for _, co := range c.d.classes["default"].Estimator.Cohorts() {
		keys = append(keys, co.Key())
	}
	if strings.Join(keys, " ") != "default/general/embeddings/mt0" {
		t.Fatalf("estimator cohorts %v, want only the embeddings cohort", keys)
	}
}

// TestAnEmbeddingsRequestToAPoolWithAnAnthropicRouteIsRefusedNamingTheModel:
// the Messages API has no embeddings, so the request is refused before any
// group runs, whichever route the picker would have chosen.
func TestAnEmbeddingsRequestToAPoolWithAnAnthropicRouteIsRefusedNamingTheModel(t *testing.T) {
	var calls atomic.Int32
	ps := map[string]*provider{
		"a": newEmbeddingsProvider(t, "a", &calls, func(int32) bool { return false }),
		"b": newMessagesProvider(t, "b", newScript(behaviour{words: 1})),
	}
	c := newCluster(t, []string{"a", "b"}, ps, "")
	_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: embedRequest()}, nil)
	ue, ok := errors.AsType[*schemas.UntranslatableError](err)
	if !errors.Is(err, ErrBadRequest) || !ok || ue.Param != "model" {
		t.Fatalf("Submit = %v, want a bad request naming model", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("%d requests reached a provider", calls.Load())
	}
}
