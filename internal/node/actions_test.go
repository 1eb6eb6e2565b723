package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/actions"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// regionsWait bounds the waits on the supercluster: a sourced copy starts
// copying within seconds of its origin's stream existing, and a cut region
// is unheard after rerun_after.
const regionsWait = 30 * time.Second

// postAction posts the small chat completion of postChat to g under an
// Idempotency-Key, and returns the response and its body.
func postAction(t *testing.T, g *Gateway, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+g.Addr().String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return send(t, req)
}

// replicated waits until region's copy of the other regions' actions
// holds from's entry of key (no tenants: the door's tenant is "").
func replicated(t *testing.T, js jetstream.JetStream, region, from, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), regionsWait)
	defer cancel()
	subject := schemas.RegionWire(from).ActionSubject(replay.Key("", key))
	eventually.True(t, regionsWait, from+"'s entry of "+key+" in "+region, func() bool {
		s, err := js.Stream(ctx, schemas.RegionWire(region).JetStreamName(actions.SeenStreamName))
		if err != nil {
			return false
		}
		_, err = s.GetLastMsgForSubject(ctx, subject)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Logf("reading %s's copy: %v", region, err)
		}
		return err == nil
	})
}

// TestARetryOfAUserActionInAnotherRegion is the failover test of user
// actions across regions (docs/architecture.md §14, "User actions across
// regions"): regions east and west, each a one-server NATS cluster with
// JetStream and its own Redis, gateways and workers, joined by gateway
// links through fault proxies. A user action committed in east is retried
// in west:
//
//	(a) east replicating answers: west replays east's answer, no provider
//	    of west's called; a reused key with another request is refused;
//	(b) east not replicating them: west refuses 409 committed_in_region
//	    naming east, X-Should-Retry false, no provider called — over the
//	    NATS door too;
//	(c) the link cut: west still refuses while east was heard lately, then,
//	    east unheard for longer than rerun_after (2.5 s here), runs the action
//	    again, counted in hedgerow_cross_region_reruns_total{region="east"};
//	(d) a commit not yet replicated (east's, during the cut) runs again in
//	    west, uncounted: the window the index cannot close.
func TestARetryOfAUserActionInAnotherRegion(t *testing.T) {
	t.Setenv("NODE_TEST_HASH_KEY", "node-test-hash-key")
	sc := natstest.Supercluster(t, []string{"east", "west"}, natstest.MaxPayload(16<<20))
	const global = "global: {regions: [east, west], replicate_answers: %t, rerun_after: 2500ms, max_clock_skew: 500ms}\n"
	east := newRegionUnderTest(t, "east", sc[0].Server, fmt.Sprintf(global, true))
	west := newRegionUnderTest(t, "west", sc[1].Server, fmt.Sprintf(global, false))
	eastWorkers, eastGW := east.start(t)
	defer stop(t, eastWorkers)
	westWorkers, westGW := west.start(t)
	defer stop(t, westWorkers)
	defer stop(t, westGW)
	js, err := jetstream.New(natstest.Connect(t, sc[1].Server, nats.Name("inspector")))
	if err != nil {
		t.Fatal(err)
	}

	// (a) East replicates its answers: west replays east's.
	resp, answer := postAction(t, eastGW, "action-a")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("east's commit: %d %s", resp.StatusCode, answer)
	}
	replicated(t, js, "west", "east", "action-a")
	eastCalls, westCalls := east.reached.Load(), west.reached.Load()
	resp, body := postAction(t, westGW, "action-a")
	if resp.StatusCode != http.StatusOK || string(body) != string(answer) || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("west's retry of east's action: %d %q (Idempotent-Replayed %q), want east's answer %q replayed",
			resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"), answer)
	}
	if east.reached.Load() != eastCalls || west.reached.Load() != westCalls {
		t.Fatalf("west's replay called east's providers %d times and west's %d", east.reached.Load()-eastCalls, west.reached.Load()-westCalls)
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+westGW.Addr().String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"another request"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "action-a")
	if status, body := do(t, req); status != http.StatusConflict || !strings.Contains(string(body), "idempotency_key_reused") {
		t.Fatalf("west, east's key reused with another request: %d %s, want 409 idempotency_key_reused", status, body)
	}
	t.Logf("(a) replicate_answers: west replayed east's answer, no provider called")

	// (b) East, restarted, keeps its answers at home: west refuses the
	// retry, naming east.
	stop(t, eastGW)
	resident := *east.cfg
	resident.Global.ReplicateAnswers = false
	east.cfg = &resident
	if eastGW, err = east.gateway(t); err != nil {
		t.Fatalf("east's gateway, restarted: %v", err)
	}
	defer stop(t, eastGW)
	if resp, body := postAction(t, eastGW, "action-b"); resp.StatusCode != http.StatusOK {
		t.Fatalf("east's commit: %d %s", resp.StatusCode, body)
	}
	replicated(t, js, "west", "east", "action-b")
	refusedInWest(t, west, westGW, "action-b")
	if resp, _ := postAction(t, eastGW, "action-b"); resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("east's own retry: %d (Idempotent-Replayed %q), want its answer replayed", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	// The NATS door alike: its own request of a key east committed, retried
	// in west.
	submit := func(region string, ns *server.Server) error {
		c, err := client.New(natstest.Connect(t, ns, nats.Name(region+"-caller")), client.WithTimeout(wait), client.WithRegion(region))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Submit(t.Context(), client.Request{ModelClass: "general", IdempotencyKey: "action-nats",
			Request: schemas.ChatRequest{Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("hello")}}}})
		return err
	}
	if err := submit("east", sc[0].Server); err != nil {
		t.Fatalf("east's commit over NATS: %v", err)
	}
	replicated(t, js, "west", "east", "action-nats")
	calls := west.reached.Load()
	var ce *client.Error
	if err := submit("west", sc[1].Server); !errors.As(err, &ce) || ce.Code != schemas.ErrCommittedInRegion ||
		ce.Status != http.StatusConflict || ce.Region != "east" || ce.Retryable() {
		t.Fatalf("west's retry over NATS of east's action: %v, want 409 committed_in_region naming east, not retryable here", err)
	}
	if west.reached.Load() != calls {
		t.Fatal("west's refused retry over NATS called a provider")
	}
	t.Logf("(b) answers resident in east: west refused 409 committed_in_region naming east, over HTTP and NATS")

	// (c) The link is cut. West still refuses while east was heard lately;
	// east unheard for longer than rerun_after, west runs it again, once.
	natstest.Cut(sc)
	cut := time.Now()
	refusedInWest(t, west, westGW, "action-b")
	westCalls = west.reached.Load()
	var ran *http.Response
	eventually.True(t, regionsWait, "west running east's action again, east unheard", func() bool {
		resp, body := postAction(t, westGW, "action-b")
		switch resp.StatusCode {
		case http.StatusOK:
			ran = resp
			return true
		case http.StatusConflict:
			return false
		}
		t.Fatalf("west's retry across the cut: %d %s", resp.StatusCode, body)
		return false
	})
	took := time.Since(cut)
	if ran.Header.Get("Idempotent-Replayed") == "true" || west.reached.Load() == westCalls {
		t.Fatal("west's retry past rerun_after was not run again in west")
	}
	_, metrics := get(t, "http://"+westGW.Addr().String()+"/metrics")
	if v := metricValue(t, string(metrics), `hedgerow_cross_region_reruns_total{region="east"}`); v != 1 {
		t.Fatalf("hedgerow_cross_region_reruns_total{region=\"east\"} = %v, want 1", v)
	}
	// Run again, it is west's commit now: west's next retry is its own replay.
	if resp, _ := postAction(t, westGW, "action-b"); resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("west's retry after its rerun: %d (Idempotent-Replayed %q), want west's answer replayed", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	t.Logf("(c) link cut: west ran east's action again %v after the cut (rerun_after 2.5s), counted once", took.Round(100*time.Millisecond))

	// Before a commit has replicated — here, committed in east during the
	// cut — west knows nothing of it: the retry runs in west, not counted
	// as a rerun. Once healed, each region replays its own answer.
	if resp, body := postAction(t, eastGW, "action-d"); resp.StatusCode != http.StatusOK {
		t.Fatalf("east's commit during the cut: %d %s", resp.StatusCode, body)
	}
	westCalls = west.reached.Load()
	if resp, body := postAction(t, westGW, "action-d"); resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") == "true" || west.reached.Load() == westCalls {
		t.Fatalf("west's retry of a commit not replicated: %d %s, want it run again in west", resp.StatusCode, body)
	}
	_, metrics = get(t, "http://"+westGW.Addr().String()+"/metrics")
	if v := metricValue(t, string(metrics), `hedgerow_cross_region_reruns_total{region="east"}`); v != 1 {
		t.Fatalf("a retry before replication counted as a rerun: %v", v)
	}
	natstest.Heal(sc)
	replicated(t, js, "west", "east", "action-d")
	for _, g := range []*Gateway{eastGW, westGW} {
		if resp, _ := postAction(t, g, "action-d"); resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a retry after the heal: %d, want the region's own answer replayed", resp.StatusCode)
		}
	}
	t.Logf("(d) before replication (a commit during the cut): west ran it again, uncounted; after the heal each region replays its own")
}

// refusedInWest checks that west refuses its retry of key, which east
// committed, 409 committed_in_region naming east, with no provider called.
func refusedInWest(t *testing.T, west *regionUnderTest, westGW *Gateway, key string) {
	t.Helper()
	calls := west.reached.Load()
	resp, body := postAction(t, westGW, key)
	var e struct {
		Error struct{ Code, Type, Param, Message string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("west's refusal %q: %v", body, err)
	}
	if resp.StatusCode != http.StatusConflict || e.Error.Code != "committed_in_region" || e.Error.Type != "invalid_request_error" ||
		!strings.Contains(e.Error.Message, "region east") || resp.Header.Get("X-Hedgerow-Region") != "east" ||
		resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("west's retry of east's %s: %d %s (X-Hedgerow-Region %q, X-Should-Retry %q), want 409 committed_in_region naming east",
			key, resp.StatusCode, body, resp.Header.Get("X-Hedgerow-Region"), resp.Header.Get("X-Should-Retry"))
	}
	if west.reached.Load() != calls {
		t.Fatal("west's refused retry called a provider")
	}
}
